"""The ``sft`` backend: TRL's ``SFTTrainer``, with ``SFTConfig``; the default for causal LMs.

tunematrix formats and tokenizes the records (``trainer_entry.data``: the
formattings, the prompt masks) and leaves the rest to TRL, as a user of
``SFTTrainer`` would: the sequences reach it (``data_config``) as a tokenized
dataset, and TRL truncates them to ``max_length`` (our ``max_seq_len``), drops
those left with nothing to learn, masks the prompts (``completion_only_loss``),
and flattens batches (``padding_free``). TRL's collator makes the batches;
``trainer_entry.data.collate.count_collated`` counts what each one fed.

``packing: true`` means what it means under ``hf``
(``orchestrator.contract.packing``): tunematrix cuts the blocks and TRL is fed
them as they are, so both trainers train on the same tokens in the same
blocks. TRL packs only when the scenario names its ``packing_strategy``.

A scenario's arguments mean the same under ``sft`` as under ``hf``: where
``SFTConfig``'s default differs from ``TrainingArguments``' (learning rate,
logging steps, activation checkpointing, bf16), the latter's is kept unless
the scenario sets the argument, so sweeping ``trainer`` changes the trainer
and nothing else.

TRL's per-step entropy and token accuracy are left on: they are what a user
of ``SFTTrainer`` pays for (TRL offers no setting to turn them off);
``trainer_entry.backends.trl_cost`` measures what they cost.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import datasets
import numpy as np
import pyarrow.compute as pc
import torch
from trl import SFTConfig, SFTTrainer

from orchestrator.contract import trainers
from orchestrator.contract.applicability import training_fields
from orchestrator.contract.packing import masked_note, masked_per_document, trl_strategy
from orchestrator.contract.spec import RunSpec
from trainer_entry.backends import losses, trl_cost
from trainer_entry.backends.hf import (
    RUN_DEFAULTS,
    TRAINING_ARGUMENTS,
    MeasureCallback,
    TrainerRun,
    controlled_arguments,
    newer_field,
    processing_class,
    settings_of,
)
from trainer_entry.backends.hf import installed_fields as training_arguments_fields
from trainer_entry.backends.trainer_protocol import TrainerBackend, TrainSettings
from trainer_entry.data.collate import (
    PADDED_TOKENS,
    REAL_LENGTHS,
    REAL_TOKENS,
    count_collated,
    pop_counts,
)
from trainer_entry.data.formats import IGNORE_INDEX
from trainer_entry.data.tokenize import PreparedData
from trainer_entry.measure.hooks import StepHooks
from trainer_entry.measure.steps import RankStats
from trainer_entry.settings import installed
from trainer_entry.settings.installed import Owner, Refused, in_installed_names
from trainer_entry.settings.parsed import DataConfig, ParsedArguments
from trainer_entry.spec_errors import SpecError, first_line
from trainer_entry.tasks import get_task
from trainer_entry.tasks.task_protocol import BatchedByTRL, Task, TaskData

# TRL prepares its dataset with datasets' map: no loading bars in stderr.log
datasets.disable_progress_bars()

#: SFTConfig fields that cannot do what they say here -> why, and what to do instead
REFUSED = {
    "model_init_kwargs": "tunematrix loads the model before the trainer sees it; use torch_dtype "
    "or attn_implementation",
    "chat_template_path": "the records are tokenized before the trainer sees them; use "
    "chat_template",
    "eos_token": "the records are tokenized with the tokenizer's own EOS before the trainer sees "
    "them",
    "assistant_only_loss": "the records reach the trainer tokenized, not as conversations; use "
    "formatting: chat with completion_only_loss: true",
}


#: what takes the ``sft`` backend's arguments
SFT_CONFIG = Owner("trl", "SFTConfig")


def installed_fields() -> frozenset[str]:
    """The fields of the installed ``SFTConfig`` (``TrainingArguments``' among them)."""
    return installed.init_fields(SFTConfig)


def own_fields() -> frozenset[str]:
    """The installed ``SFTConfig``'s fields that ``TrainingArguments`` lacks (what is saved)."""
    return installed_fields() - training_arguments_fields()


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def hf_defaults() -> dict[str, Any]:
    """``TrainingArguments``' defaults of the fields whose default ``SFTConfig`` changes."""
    from transformers import TrainingArguments

    hf = {f.name: f for f in dataclasses.fields(TrainingArguments) if f.init}
    out = {}
    for f in dataclasses.fields(SFTConfig):
        if f.init and f.name in hf:
            ours = _default(hf[f.name])
            if ours is not dataclasses.MISSING and ours != _default(f):
                out[f.name] = ours
    return out


def _padding_free_unpacked(parsed: ParsedArguments) -> bool:
    return bool(parsed.training.get("padding_free")) and not parsed.data.packing


def trl_packing(parsed: ParsedArguments) -> str | None:
    """TRL's packing strategy when the scenario hands packing to TRL (it named a
    ``packing_strategy``); None when tunematrix packs the blocks, or nothing is packed."""
    return trl_strategy(parsed.data.packing, parsed.training)


def data_config(parsed: ParsedArguments) -> DataConfig:
    """How the causal-LM task prepares the records for TRL.

    ``packing: true``: packed into blocks here, as for ``hf``. A ``packing_strategy``
    of TRL's: tokenized whole, TRL packs. Not packed: tokenized whole, TRL truncates;
    the exception is ``padding_free``, where TRL wants sequences already cut to
    length (it cannot enforce ``max_length`` there), so they are cut and dropped as
    for ``hf``.
    """
    if trl_packing(parsed) is not None:
        return dataclasses.replace(parsed.data, packing=False, truncate=False)
    if parsed.data.packing:
        return parsed.data
    return dataclasses.replace(parsed.data, truncate=_padding_free_unpacked(parsed))


def _owner(key: str) -> Owner:
    """Whose setting ``key`` is: ``TrainingArguments``' (which ``SFTConfig`` takes as its
    base class's) or ``SFTConfig``'s own."""
    return (
        TRAINING_ARGUMENTS
        if key in training_fields() and key not in trainers.own_fields("sft")
        else SFT_CONFIG
    )


def _newer(key: str) -> str:
    """Which release takes a setting the installed one lacks (the saved lists')."""
    if _owner(key) is TRAINING_ARGUMENTS:
        return newer_field(key)
    saved = trainers.own_fields("sft")
    return f" (trl {trainers.own_fields_version('sft')}'s does)" if key in saved else ""


def sft_kwargs(spec: RunSpec, parsed: ParsedArguments, on_gpu: bool) -> dict[str, Any]:
    """The keyword arguments of a run's ``SFTConfig``, in the installed names: the
    scenario's, our data options as TRL's own, what tunematrix controls."""
    for key in sorted(REFUSED.keys() & parsed.training.keys()):
        if parsed.training[key]:
            raise SpecError(f"trainer sft: {key} is refused: {REFUSED[key]}")
    cfg = parsed.data
    strategy = trl_packing(parsed)
    # cut (padding-free, unpacked) or packed into blocks here: TRL has nothing to truncate
    truncated_here = _padding_free_unpacked(parsed) or (cfg.packing and strategy is None)
    mode = parsed.training.get("truncation_mode", "keep_start")
    if truncated_here and mode != "keep_start":
        raise SpecError(
            f"trainer sft: truncation_mode {mode} needs TRL to truncate, which it does not do "
            "under padding_free without packing; remove truncation_mode or set packing: true"
        )
    kwargs: dict[str, Any] = {
        **RUN_DEFAULTS,
        **parsed.training,
        # our data options, as TRL's own
        "max_length": None if truncated_here else cfg.max_seq_len,
        "packing": strategy is not None,
        "completion_only_loss": cfg.completion_only_loss,
        **controlled_arguments(spec, parsed, on_gpu),
    }
    if isinstance(get_task(parsed.task), BatchedByTRL):
        # the rows reach TRL's vision collator whole (their images and turns, read by index)
        kwargs["remove_unused_columns"] = False
    if parsed.pad_to_multiple_of is not None:
        kwargs["pad_to_multiple_of"] = parsed.pad_to_multiple_of
    ours = in_installed_names(kwargs, installed_fields(), _owner, parsed.notes, why=_newer)
    # hf's defaults first (already in the installed names): a setting of the run wins
    return {**hf_defaults(), **ours}


def sft_config(spec: RunSpec, parsed: ParsedArguments, on_gpu: bool) -> SFTConfig:
    """The ``SFTConfig`` of a run: the scenario's, our data options, what tunematrix controls."""
    kwargs = sft_kwargs(spec, parsed, on_gpu)
    try:
        return SFTConfig(**kwargs)
    except (ValueError, TypeError) as exc:
        raise Refused(SFT_CONFIG, first_line(exc)) from None


def sft_dataset(prepared: PreparedData, completion_only_loss: bool) -> datasets.Dataset:
    """The prepared sequences as a dataset TRL takes as tokenized.

    The loss mask goes in as TRL's own where it can: a ``completion_mask`` under
    ``completion_only_loss`` (TRL masks the prompt), none when every token is
    learnt from. Labels given otherwise (a file taken as it is) go in as
    ``labels``, which TRL uses as they are.
    """
    columns: dict[str, list[list[int]]] = {"input_ids": [x.tolist() for x in prepared.input_ids]}
    learnt = [labels != IGNORE_INDEX for labels in prepared.labels]
    same = all(
        np.array_equal(ids[m], labels[m])
        for ids, labels, m in zip(prepared.input_ids, prepared.labels, learnt, strict=True)
    )
    if same and all(m.all() for m in learnt):
        pass  # TRL's labels are the input ids
    elif same and completion_only_loss:
        columns["completion_mask"] = [m.astype(np.int64).tolist() for m in learnt]
    else:
        columns["labels"] = [x.tolist() for x in prepared.labels]
    return datasets.Dataset.from_dict(columns)


def describe(
    meta: dict[str, Any],
    dataset: datasets.Dataset,
    prepared: PreparedData,
    cfg: DataConfig,
    max_length: int | None,
    trl_packed: bool,
) -> None:
    """Update ``meta`` (the result's ``data``) with what TRL's preparation made of ``prepared``.

    Packed by TRL: the tokens its packing left out (``bfd`` cuts sequences longer
    than ``max_length``); packed here: what ``meta`` already says (TRL was fed the
    blocks); not packed: the sequences TRL cut and those it dropped.
    """
    table = dataset.with_format("arrow")[:]
    lengths = pc.list_value_length(table.column("input_ids"))
    tokens = int(pc.sum(lengths).as_py() or 0)
    labels = pc.list_flatten(table.column("labels"))
    before = prepared.lengths()
    meta.update(
        sequences=len(dataset),
        tokens=tokens,
        label_tokens=int(pc.sum(pc.not_equal(labels, IGNORE_INDEX)).as_py() or 0),
        packing=cfg.packing,
        max_seq_len=cfg.max_seq_len,
    )
    if trl_packed:
        meta["tokens_dropped"] = sum(before) - tokens
    # when the sequences were cut here (padding-free, unpacked), meta already says so
    elif not cfg.packing and max_length is not None:
        meta["examples_truncated"] = sum(n > max_length for n in before)
        meta["examples_dropped"] = len(before) - len(dataset)


def text_counts(batch: Mapping[str, Any], features: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """What a batch of TRL's language-modeling collator fed (``count_collated``)."""
    counts = count_collated(batch, features)
    return {REAL_TOKENS: counts.real, PADDED_TOKENS: counts.padded, REAL_LENGTHS: counts.lengths}


@dataclass
class CountingCollator:
    """TRL's collator, with what each batch fed added (``trainer_entry.data.collate``):
    ``count`` reads it from the batch and the examples it was made of."""

    inner: Any
    count: Callable[[Mapping[str, Any], Sequence[Mapping[str, Any]]], dict[str, Any]] = text_counts

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        batch = dict(self.inner(features))
        batch.update(self.count(batch, features))
        return batch


class BenchSFTTrainer(SFTTrainer):
    """An ``SFTTrainer`` that hands the hooks what every micro-batch fed."""

    #: the collator TRL chose, wrapped (``SFTTrainer``'s attribute)
    data_collator: Any

    def __init__(
        self,
        *args: Any,
        hooks: StepHooks | None,
        count: Callable[[Mapping[str, Any], Sequence[Mapping[str, Any]]], dict[str, Any]]
        | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self._hooks = hooks
        # after TRL chose its collator (it refuses one given under padding-free)
        self.data_collator = CountingCollator(self.data_collator, count or text_counts)

    def training_step(self, model: Any, inputs: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        if REAL_TOKENS not in inputs:
            raise RuntimeError("a batch reached training_step without its token counts")
        counts = pop_counts(inputs)  # always: the model must not see them
        if self._hooks is not None:
            self._hooks.batch(self.model, counts)
        return super().training_step(model, inputs, *args, **kwargs)


class SFTTrainerRun(TrainerRun):
    """An ``SFTTrainer`` that, after training, says what TRL's per-step metrics cost."""

    def after_training(self, stats: RankStats, micro_batches: int) -> list[str]:
        tokens = statistics.fmean(stats.step_tokens) if stats.step_tokens else 0
        on_gpu = torch.cuda.is_available() and self.trainer.args.device.type == "cuda"
        cost = trl_cost.measure(
            self.trainer.model,
            round(tokens / max(micro_batches, 1)),
            autocast=self.trainer.accelerator.autocast,
            sync=torch.cuda.synchronize if on_gpu else None,
        )
        step = statistics.median(stats.step_times_s) if stats.step_times_s else None
        return [trl_cost.cost_note(cost, micro_batches=micro_batches, step_time_s=step)]


class SFTTrainerBackend(TrainerBackend):
    """TRL's ``SFTTrainer`` configured by ``SFTConfig``."""

    def argument_fields(self) -> frozenset[str]:
        """``SFTConfig``'s fields (``TrainingArguments``' with them), installed and saved."""
        return installed_fields() | training_fields() | trainers.own_fields("sft")

    def arguments(self, spec: RunSpec, parsed: ParsedArguments, *, on_gpu: bool) -> dict[str, Any]:
        return sft_kwargs(spec, parsed, on_gpu)

    def configure(self, spec: RunSpec, parsed: ParsedArguments, *, on_gpu: bool) -> TrainSettings:
        return settings_of(sft_config(spec, parsed, on_gpu))

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
        config: SFTConfig = settings.native
        batched = task if isinstance(task, BatchedByTRL) else None
        try:
            trainer = BenchSFTTrainer(
                model=model,
                args=config,
                # a task of images and conversations: its examples as they are, which TRL's
                # vision collator processes batch by batch
                train_dataset=batched.trl_dataset(data)
                if batched
                else sft_dataset(data.examples, parsed.data.completion_only_loss),
                **processing_class(SFTTrainer, tokenizer),
                callbacks=[MeasureCallback(hooks)] if hooks is not None else [],
                hooks=hooks,
                count=batched.count_batch if batched else None,
            )
        except ValueError as exc:  # TRL's checks of its arguments against the model and data
            raise SpecError(f"trainer sft: {first_line(exc)}") from None
        if batched:
            return SFTTrainerRun(trainer)
        prepared: PreparedData = data.examples
        max_length = installed.read(config, "max_length")
        strategy = trl_packing(parsed)
        describe(
            data.meta,
            trainer.train_dataset,
            prepared,
            parsed.data,
            max_length,
            strategy is not None,
        )
        attn = getattr(model.config, "_attn_implementation", None)
        if strategy is not None and masked_per_document(strategy, attn):
            parsed.notes.append(masked_note(strategy, attn))
        return SFTTrainerRun(trainer)

    def data_settings(self, parsed: ParsedArguments) -> DataConfig:
        """TRL truncates and packs itself where it can (``data_config``)."""
        return data_config(parsed)

    def eval_dataset(self, task: Task, data: TaskData, parsed: ParsedArguments) -> Any:
        """TRL prepares (truncates, packs) the held-out set as it did the training set."""
        if isinstance(task, BatchedByTRL):
            return task.trl_dataset(TaskData(examples=data.eval_examples, meta={}))
        return sft_dataset(data.eval_examples, parsed.data.completion_only_loss)

    def flops_notes(self, model: Any, flops_per_token: float, parsed: ParsedArguments) -> list[str]:
        """Under ``completion_only_loss`` TRL's fused LM head skips the prompt positions."""
        return (
            [masked_head_note(model, flops_per_token)] if parsed.data.completion_only_loss else []
        )

    def reruns(self, model: Any) -> dict[int, float]:
        """TRL's fused LM head (``add_fused_lm_head``, which ``SFTTrainer`` puts on the
        model) runs the head's product in tiles without calling the head, and runs it
        again in its backward to rebuild each tile's logits: once more per forward."""
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        fused = losses.trl_fused_head(base)
        head = base.get_output_embeddings() if hasattr(base, "get_output_embeddings") else None
        return {id(head): 1.0} if fused and head is not None else {}

    def loss_implementation(self, trainer_run: Any, parsed: ParsedArguments) -> str:
        """The ``SFTTrainer``'s loss (``sft_loss``): TRL's fused LM head unless the
        arguments make TRL compute it from the full logits."""
        return sft_loss(losses.trainer_of(trainer_run), parsed.task)

    def own_fields(self) -> frozenset[str]:
        return own_fields()


def sft_loss(trainer: Any, task: str) -> str:
    """What computes an ``SFTTrainer``'s loss, in the order TRL's ``compute_loss`` decides
    it: a subclass's own ``compute_loss``; a ``compute_loss_func`` and, under ``loss_type``
    ``nll``, label smoothing, both on the full logits (TRL's metrics then run the fused
    head without gradients); else the fused LM head's per-token log-probabilities under
    ``loss_type`` (``nll`` or ``dft``). Under DeepSpeed's sequence parallelism TRL hands
    the model's own loss, the fused head's nll, to the ``Trainer``: the same name."""
    loss_type = str(getattr(trainer.args, "loss_type", None) or "nll")
    replaced = losses.replaced(trainer, SFTTrainer, smoothing=loss_type == "nll")
    if replaced is not None:
        return replaced
    if not losses.trl_fused_head(trainer.model):
        # an SFTTrainer of a release without TRL's fused head: the model's own loss
        return losses.model_loss(trainer.model, task)
    return losses.trl_fused(loss_type)


def masked_head_note(model: Any, flops_per_token: float) -> str:
    """What FLOPs per token overstate under TRL's fused LM head with a prompt mask."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    weight = getattr(head, "weight", None)
    share = (
        f" (the LM head is at most {3 * 2 * weight.numel() / flops_per_token:.1%} of them)"
        if weight is not None and flops_per_token
        else ""
    )
    return (
        "flops_per_token counts the LM head for every token, but under completion_only_loss "
        "TRL's fused LM head skips the prompt positions, so flops_per_token and MFU are "
        f"overstated by up to the LM head's share times the prompt share{share}"
    )
