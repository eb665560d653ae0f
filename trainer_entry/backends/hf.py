"""The ``hf`` backend: the Hugging Face ``Trainer``, with ``TrainingArguments``."""

from __future__ import annotations

from typing import Any

from transformers import Trainer, TrainerCallback, TrainingArguments
from transformers.utils import logging as hf_logging

from orchestrator.contract.applicability import training_fields, training_fields_version
from orchestrator.contract.spec import RunSpec
from orchestrator.contract.trainers import task_line
from trainer_entry.backends import losses
from trainer_entry.backends.trainer_protocol import TrainerBackend, TrainOutput, TrainSettings
from trainer_entry.data.collate import pop_counts
from trainer_entry.measure.hooks import StepHooks
from trainer_entry.settings import installed
from trainer_entry.settings.installed import Owner, Refused, in_installed_names
from trainer_entry.settings.parsed import ParsedArguments
from trainer_entry.tasks.task_protocol import Task, TaskData

# Loading bars would fill stderr.log with carriage-return noise.
hf_logging.disable_progress_bar()


class MeasureCallback(TrainerCallback):
    """Passes the ``Trainer``'s events on to the measurement hooks."""

    def __init__(self, hooks: StepHooks) -> None:
        self.hooks = hooks

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.hooks.train_begin(state.max_steps)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.hooks.step_end(state.global_step):
            # steady state reached (trainer_entry.measure.steadystop): every rank stops after this step
            control.should_training_stop = True

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.hooks.train_end(state.global_step)


class BenchTrainer(Trainer):
    """A ``Trainer`` that counts the tokens of every micro-batch it trains on."""

    def __init__(self, *args: Any, hooks: StepHooks | None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._hooks = hooks

    def training_step(
        self, model: Any, inputs: dict[str, Any], num_items_in_batch: Any = None
    ) -> Any:
        counts = pop_counts(inputs)  # always: the model must not see them
        if self._hooks is not None:
            self._hooks.batch(self.model, counts)
        return super().training_step(model, inputs, num_items_in_batch)


#: what a run's trainer arguments default to here (a scenario may set them)
RUN_DEFAULTS: dict[str, Any] = {"report_to": "none", "save_strategy": "no", "disable_tqdm": True}


def controlled_arguments(spec: RunSpec, parsed: ParsedArguments, on_gpu: bool) -> dict[str, Any]:
    """The trainer arguments tunematrix sets whatever the scenario says."""
    return {
        "output_dir": spec.output_dir,
        "use_cpu": not on_gpu,
        # HF's memory tracker polls RSS in a busy thread for all of train(), on every
        # rank, competing with training for the GIL and a core: it runs only when
        # asked for by name, and on GPUs only (MemoryCounters give the same figures).
        "skip_memory_metrics": not (
            spec.memory_stages == "hf-tracker" and on_gpu and parsed.measure.instrumentation
        ),
    }


#: what takes the ``hf`` backend's arguments
TRAINING_ARGUMENTS = Owner("transformers", "TrainingArguments")


def newer_field(key: str) -> str:
    """What a message adds about ``key`` when the installed ``TrainingArguments`` lacks it:
    which transformers has it (the saved list's), where that one does."""
    if key not in training_fields():
        return ""
    return f" (transformers {training_fields_version()}'s does)"


def unused_parameters_default(parsed: ParsedArguments) -> dict[str, Any]:
    """``ddp_find_unused_parameters: true`` for a task some of whose trained parameters
    take no part in the loss (``TaskLine.unused_parameters``), as TRL's ``SFTTrainer``
    sets it for vision-language models: DDP fails at the second step without it. Not
    under reentrant checkpointing, which fails with it (the scenario's own value wins)."""
    line = task_line(parsed.task)
    checkpointing = {
        **(parsed.training.get("gradient_checkpointing_kwargs") or {}),
        **(parsed.training.get("activation_checkpointing_kwargs") or {}),
    }
    if line is None or not line.unused_parameters or checkpointing.get("use_reentrant"):
        return {}
    return {"ddp_find_unused_parameters": True}


def training_kwargs(spec: RunSpec, parsed: ParsedArguments, on_gpu: bool) -> dict[str, Any]:
    """The keyword arguments of a run's ``TrainingArguments``, in the installed names: the
    scenario's, with what tunematrix controls (``SettingError`` for a setting it lacks)."""
    kwargs: dict[str, Any] = {
        **RUN_DEFAULTS,
        **unused_parameters_default(parsed),
        **parsed.training,
        **controlled_arguments(spec, parsed, on_gpu),
        "remove_unused_columns": False,
    }
    return in_installed_names(
        kwargs, installed_fields(), TRAINING_ARGUMENTS, parsed.notes, why=newer_field
    )


def training_arguments(spec: RunSpec, parsed: ParsedArguments, on_gpu: bool) -> TrainingArguments:
    """The ``TrainingArguments`` of a run: the scenario's, with what tunematrix controls."""
    kwargs = training_kwargs(spec, parsed, on_gpu)
    try:
        return TrainingArguments(**kwargs)
    except (ValueError, TypeError) as exc:
        raise Refused(TRAINING_ARGUMENTS, str(exc)) from None


def settings_of(args: TrainingArguments) -> TrainSettings:
    """What measurement reads of a run's ``TrainingArguments`` (or a subclass, ``SFTConfig``)."""
    return TrainSettings(
        per_device_train_batch_size=args.per_device_train_batch_size,
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        activation_checkpointing=bool(installed.read(args, "activation_checkpointing")),
        fsdp=args.fsdp,
        mixed_precision=getattr(args, "mixed_precision", None),
        tf32=args.tf32,
        native=args,
    )


class TrainerRun:
    """A built ``Trainer`` (or subclass): trains, and returns its metrics and log."""

    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer

    def train(self) -> TrainOutput:
        output = self.trainer.train()
        return TrainOutput(dict(output.metrics), self.trainer.state.log_history)


def hf_loss(trainer: Any, task: str) -> str:
    """What computes a ``Trainer``'s loss, in the order ``Trainer.compute_loss`` decides
    it: a subclass's own ``compute_loss``, a ``compute_loss_func``, label smoothing, else
    the model's own loss (liger's when ``use_liger_kernel`` replaced the model's forward;
    before training, when it is asked for, as transformers applies it then)."""
    replaced = losses.replaced(trainer, Trainer)
    if replaced is not None:
        return replaced
    trained = getattr(getattr(trainer, "state", None), "global_step", 0)
    asked = losses.liger_asked(trainer.args) if task == losses.CAUSAL_LM else None
    if asked is not None and not trained and not losses.liger_forward(trainer.model):
        return asked
    return losses.model_loss(trainer.model, task)


def installed_fields() -> frozenset[str]:
    """The fields of the installed ``TrainingArguments``."""
    return installed.init_fields(TrainingArguments)


def processing_class(trainer: type, tokenizer: Any) -> dict[str, Any]:
    """``trainer``'s keyword for the tokenizer (``processing_class``; ``tokenizer`` before)."""
    name = installed.installed_name("processing_class", installed.parameters(trainer))
    return {name or "processing_class": tokenizer}


class HFTrainerBackend(TrainerBackend):
    """``transformers.Trainer`` configured by ``TrainingArguments``."""

    def argument_fields(self) -> frozenset[str]:
        """The fields of the installed ``TrainingArguments`` and of the saved list."""
        return installed_fields() | training_fields()

    def arguments(self, spec: RunSpec, parsed: ParsedArguments, *, on_gpu: bool) -> dict[str, Any]:
        return training_kwargs(spec, parsed, on_gpu)

    def configure(self, spec: RunSpec, parsed: ParsedArguments, *, on_gpu: bool) -> TrainSettings:
        return settings_of(training_arguments(spec, parsed, on_gpu))

    def loss_implementation(self, trainer_run: Any, parsed: ParsedArguments) -> str:
        """The ``Trainer``'s loss (``hf_loss``): the model's own unless the trainer
        replaces it; ``transformers ForCausalLMLoss (full fp32 logits)`` for a causal LM."""
        return hf_loss(losses.trainer_of(trainer_run), parsed.task)

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
    ) -> TrainerRun:
        trainer = BenchTrainer(
            model=model,
            args=settings.native,
            train_dataset=task.dataset(data),
            data_collator=task.collator(tokenizer, parsed),
            **processing_class(Trainer, tokenizer),
            callbacks=[MeasureCallback(hooks)] if hooks is not None else [],
            hooks=hooks,
        )
        if not task.loss_counts_items:
            # the model's loss is a mean over the micro-batch whatever it is told
            # (num_items_in_batch): the Trainer must scale it for accumulation itself
            trainer.model_accepts_loss_kwargs = False
        return TrainerRun(trainer)
