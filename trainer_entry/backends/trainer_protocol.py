"""The trainer-backend protocol: what the child needs from whatever runs the training loop.

The child does the rest the same way for every backend: it parses the
arguments, loads the model and the data, measures, and writes the result. A
backend:

- says which trainer arguments it accepts (``argument_fields``; the argument
  check refuses any other name), and passes them under the installed library's
  names (``arguments``);
- turns them into its own configuration, and reports the settings measurement
  reads (``configure`` -> ``TrainSettings``);
- builds its trainer from the model, the tokenizer (or processor) and the
  task's prepared data (``build``; the task, ``trainer_entry.tasks``, gives the
  dataset and the collator), calling the measurement hooks (``trainer_entry.measure.hooks.StepHooks``)
  at the start of training, for every micro-batch with its token counts
  (``trainer_entry.data.collate.pop_counts``), at every optimizer step's end
  and at the end;
- trains and returns its own metrics and log (``BuiltTrainer.train``).

What a backend does differently from the Hugging Face ``Trainer`` besides has a
default here, which a backend that subclasses ``TrainerBackend`` overrides: the
data settings the task prepares with (``data_settings``: TRL truncates and packs
itself), the held-out set as its trainer takes it (``eval_dataset``), notes on
what its FLOPs figure overstates (``flops_notes``), what computes its loss
(``loss_implementation``) and its configuration's own fields (``own_fields``).
Which tasks it trains and what it needs installed are declared with it, in
``orchestrator.contract.trainers``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from orchestrator.contract.spec import RunSpec
    from trainer_entry.measure.hooks import StepHooks
    from trainer_entry.settings.parsed import DataConfig, ParsedArguments
    from trainer_entry.tasks.task_protocol import Task, TaskData


@dataclass(frozen=True)
class TrainSettings:
    """A backend's configuration: the settings measurement reads, and the backend's own object."""

    per_device_train_batch_size: int
    gradient_accumulation_steps: int
    activation_checkpointing: bool
    #: the ``fsdp`` trainer argument (truthy: FSDP), read with the launch's environment
    fsdp: object
    #: accelerate's mixed precision as the trainer passes it (``no``, ``fp16``, ``bf16``,
    #: ``fp8``); None when the backend does not say
    mixed_precision: str | None
    #: the ``tf32`` trainer argument (None: torch's default)
    tf32: bool | None
    #: what the backend built (HF: ``TrainingArguments``), handed back to ``build``
    native: Any


@dataclass(frozen=True)
class TrainOutput:
    #: the trainer's own figures at the end of training (the result's ``hf_metrics``)
    metrics: dict[str, Any]
    #: the trainer's log, one record per logging step (losses are read from it)
    log_history: list[dict[str, Any]]


class BuiltTrainer(Protocol):
    """A built trainer. It may also have ``after_training(stats: RankStats,
    micro_batches: int) -> list[str]``: notes for the row, measured on rank 0 once
    training's own figures are read (``stats``: rank 0's step records;
    ``micro_batches``: per optimizer step); the ``sft`` backend's says what TRL's
    per-step metrics cost."""

    def train(self) -> TrainOutput:
        """Train to the end; the measurement hooks are called on the way."""
        ...


class TrainerBackend(Protocol):
    def argument_fields(self) -> frozenset[str]:
        """The trainer argument names this backend accepts (besides tunematrix's own)."""
        ...

    def arguments(self, spec: RunSpec, parsed: ParsedArguments, *, on_gpu: bool) -> dict[str, Any]:
        """The keyword arguments ``configure`` builds its configuration from, each under
        the name the installed library takes (``trainer_entry.settings.installed``); a
        ``SettingError`` names one it takes under no name. Builds nothing, so the check
        before launch (``trainer_entry.check``) can ask on a machine without the GPUs."""
        ...

    def configure(self, spec: RunSpec, parsed: ParsedArguments, *, on_gpu: bool) -> TrainSettings:
        """The backend's configuration for this run; ``SpecError`` for a bad argument value.

        Called before the model loads, so a bad value fails in seconds.
        """
        ...

    def build(
        self,
        settings: TrainSettings,
        *,
        model: Any,
        tokenizer: Any,
        task: Task,
        data: TaskData,
        parsed: ParsedArguments,
        hooks: StepHooks | None,
    ) -> BuiltTrainer:
        """The trainer, ready to train; ``hooks`` None: no measurement (instrumentation off)."""
        ...

    def data_settings(self, parsed: ParsedArguments) -> DataConfig:
        """The data settings the task prepares the records with (default: the run's own)."""
        return parsed.data

    def eval_dataset(self, task: Task, data: TaskData, parsed: ParsedArguments) -> Any:
        """The held-out examples as this backend's trainer takes a dataset (default:
        the task's dataset, as for training)."""
        from trainer_entry.tasks.task_protocol import TaskData

        return task.dataset(TaskData(examples=data.eval_examples, meta={}))

    def flops_notes(self, model: Any, flops_per_token: float, parsed: ParsedArguments) -> list[str]:
        """What the run's FLOPs figure overstates under this backend (default: nothing)."""
        return []

    def reruns(self, model: Any) -> dict[int, float]:
        """Modules (by ``id``) whose weight product this backend's own code runs again
        in the backward without calling the module, where module hooks cannot see it
        (``trainer_entry.measure.recompute``): id -> reruns per forward (default: none)."""
        return {}

    def loss_implementation(self, trainer_run: Any, parsed: ParsedArguments) -> str:
        """What computes the loss of a built trainer, named for the row
        (``loss_implementation``; ``trainer_entry.backends.losses`` has the names and
        what each holds in memory): ``transformers ForCausalLMLoss (full fp32 logits)``,
        ``trl fused LM head (chunked nll)``, ``liger fused linear cross-entropy``, ...

        ``trainer_run``: what ``build`` returned, or a trainer built elsewhere (a
        ``Trainer`` or ``SFTTrainer``, with its ``args`` and ``model``); ``parsed``: the
        run's arguments (its task). Decided from the trainer, its arguments and its model
        as they are: called after training, it names what trained; before, what will
        (liger, which transformers applies when training starts, from the arguments).
        The default: the model's own loss, what its forward computes from the labels."""
        from trainer_entry.backends.losses import model_loss, trainer_of

        return model_loss(trainer_of(trainer_run).model, parsed.task)

    def own_fields(self) -> frozenset[str]:
        """The installed configuration's fields that ``TrainingArguments`` lacks (saved
        by ``python -m trainer_entry.backends``; default: none)."""
        return frozenset()
