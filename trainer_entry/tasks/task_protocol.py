"""The task protocol: what a run trains, and everything that follows from it.

A task (``task`` in a scenario's arguments) owns:

- the model class a model name is loaded as (``AutoModelForCausalLM``, ...),
  the keyword arguments that class needs from the data (``num_labels``), and
  the PEFT task type and trained head under LoRA;
- the data: records to prepared training examples (cached where it pays),
  the dataset a trainer iterates, and the collator that counts what every
  micro-batch fed (``trainer_entry.data.collate``: real tokens, the padded
  rectangle, each row's length);
- what a sample is for samples/s (a sequence, an image), and which modules
  run once per sample rather than once per token (FLOPs: a classifier head
  after pooling).

The rest of a run (the trainer backend, measurement, the result) is the same
for every task. Every task subclasses ``TaskDefaults`` (what a task is unless it
says otherwise); the functions here are what several tasks' preparation shares.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar, runtime_checkable

import torch

from trainer_entry.data.holdout import holdout_count, holdout_indices, split_sequences
from trainer_entry.models.for_task import ModelTask
from trainer_entry.spec_errors import SpecError

if TYPE_CHECKING:
    from trainer_entry.settings.parsed import DataConfig, ParsedArguments

T = TypeVar("T")


@dataclass
class TaskData:
    """A task's prepared training examples and what the preparation did (``meta``).

    ``examples`` is whatever the task's ``dataset`` turns into a torch dataset
    (``trainer_entry.data.tokenize.PreparedData`` for text).
    """

    examples: Any
    meta: dict[str, Any]
    #: the held-out examples of ``eval: true`` (of ``examples``' type), never trained on;
    #: None without eval (``trainer_entry.data.holdout``)
    eval_examples: Any = None


class Examples(Protocol):
    """Prepared examples that can be split: what the preparation did (``meta``), and the
    examples at some positions (their counts in the new one's ``meta``)."""

    meta: dict[str, Any]

    def take(self, indices: Sequence[int]) -> Any: ...


def with_holdout(data: Examples, size: int, parsed: ParsedArguments) -> TaskData:
    """``data`` (``size`` examples, each a document) as a task's ``TaskData``: whole, or under
    ``eval: true`` its trained and held-out parts, disjoint examples chosen as
    ``trainer_entry.data.holdout`` chooses them for every task."""
    if not parsed.evaluation.enabled:
        return TaskData(examples=data, meta=data.meta)
    train, held = holdout_indices(size, holdout_count(size, parsed.evaluation.holdout))
    trained, kept = data.take(train), data.take(held)
    trained.meta["heldout_sequences"] = len(held)
    return TaskData(examples=trained, meta=trained.meta, eval_examples=kept)


def with_split_sequences(data: Any, parsed: ParsedArguments) -> TaskData:
    """``data`` (prepared sequences, each a document, as ``split_sequences`` takes them) as a
    task's ``TaskData``: whole, or under ``eval: true`` split by ``split_sequences``."""
    if not parsed.evaluation.enabled:
        return TaskData(examples=data, meta=data.meta)
    train, held = split_sequences(data, parsed.evaluation.holdout)
    return TaskData(examples=train, meta=train.meta, eval_examples=held)


def uncached(as_given: bool) -> dict[str, Any]:
    """The data record's fields of examples made as each batch is fed, never cached."""
    return {
        "processing": "none" if as_given else None,
        "cache_key": None,
        "cache_hit": None,
        "cache_path": None,
    }


def refuse_completion_only(cfg: DataConfig, task: str, loss: str) -> None:
    """``SpecError`` under ``completion_only_loss`` for a task whose loss is ``loss``."""
    if cfg.completion_only_loss:
        raise SpecError(f"completion_only_loss does not apply to {task}: the loss is {loss}")


def refuse_for_texts(cfg: DataConfig, processor: Any, task: str, loss: str) -> None:
    """A task of tokenized texts (its loss ``loss``): ``SpecError`` under
    ``completion_only_loss``, and for a tokenizer without a pad token."""
    refuse_completion_only(cfg, task, loss)
    if processor is None or processor.pad_token_id is None:
        raise SpecError(f"{task} needs a tokenizer with a pad token")


class ReadOnce(Generic[T]):
    """What ``read`` makes of a data config, kept: read again only for another config
    (``model_kwargs`` and ``prepare`` read the records once per run)."""

    def __init__(self, read: Callable[[DataConfig], T]) -> None:
        self.read = read
        self._kept: tuple[DataConfig, T] | None = None

    def __call__(self, cfg: DataConfig) -> T:
        if self._kept is None or self._kept[0] != cfg:
            self._kept = (cfg, self.read(cfg))
        return self._kept[1]


# torch's Dataset is Any to mypy (the training stack is not followed)
class ColumnDataset(torch.utils.data.Dataset[dict[str, Any]]):
    """Equally long columns as a dataset: row ``i`` holds each column's ``i``-th value."""

    def __init__(self, **columns: Sequence[Any]) -> None:
        self.columns = columns

    def __len__(self) -> int:
        return len(next(iter(self.columns.values())))

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {name: column[i] for name, column in self.columns.items()}


class Task(ModelTask, Protocol):
    """A task: what loading its model needs (``ModelTask``: its name, modality, model
    class, LoRA's task type and head), and what training and measuring it need."""

    #: what one sample is, for samples/s (``sequences``, ``images``)
    sample_unit: str
    #: False: the model's loss is a mean over the micro-batch whatever item count the
    #: trainer passes it, so the trainer must scale the loss for accumulation itself
    loss_counts_items: bool

    def model_kwargs(self, parsed: ParsedArguments) -> dict[str, Any]:
        """Keyword arguments the model class needs from the data (``num_labels``, ...)."""
        ...

    def prepare(
        self,
        parsed: ParsedArguments,
        processor: Any,
        data_dir: Path,
        *,
        as_given: bool,
        model_config: Any,
    ) -> TaskData:
        """The training examples; ``as_given``: the file as it is (``no_data_processing``).

        With ``eval: true`` (``parsed.evaluation``) also the held-out examples
        (``TaskData.eval_examples``), split off with ``trainer_entry.data.holdout``.

        ``processor`` is the tokenizer (None for images); ``model_config`` the
        model's config (an image task reads the image size it expects).
        """
        ...

    def dataset(self, data: TaskData) -> torch.utils.data.Dataset[Any]:
        """The dataset a trainer iterates."""
        ...

    def collator(self, processor: Any, parsed: ParsedArguments) -> Any:
        """Batches examples and adds the counts ``trainer_entry.data.collate.pop_counts`` takes."""
        ...

    def per_sample_modules(self, model: Any) -> set[int]:
        """ids of the modules that run once per sample, not once per token (FLOPs)."""
        ...

    #: the lengths of a sample its FLOPs depend on (``source``, ``target``): its collator
    #: reports each row's real length along them (``trainer_entry.data.collate.ROW_DIMS``),
    #: and its FLOPs are counted (``trainer_entry.measure.counted``); () for the analytic
    #: formula of one sequence per sample (``trainer_entry.measure.flops``)
    flop_dims: tuple[str, ...]

    #: config settings the meta copy that counts FLOPs takes, which change nothing the
    #: counter counts (wav2vec2's SpecAugment masks by index, which meta cannot run)
    probe_config: Mapping[str, Any]

    def longest(self, parsed: ParsedArguments, model_config: Any) -> dict[str, int] | None:
        """Each of ``probe_batch``'s lengths at the longest a micro-batch may have, from the
        settings alone (``max_seq_len``; ``tokens`` for a task of one sequence); None where
        only the data says (a CTC model's clips). The memory prediction runs a step of it on
        fake tensors; ``SpecError`` saying why where that step cannot run."""
        ...

    def probe_batch(self, model_config: Any, lengths: Mapping[str, int]) -> dict[str, Any]:
        """One sample's model inputs, labels included, without padding, with the given
        length along each of ``flop_dims``, on the ``meta`` device (FLOPs are counted on it)."""
        ...


class TaskDefaults:
    """What a task is unless it says otherwise (every task subclasses it): the model takes
    nothing of the data, is a plain ``PeftModel`` under LoRA with no head trained in full,
    runs every module once per token and has its FLOPs from the analytic formula; a
    sample is one sequence of ``tokens`` (``max_seq_len`` at the longest), labelled with
    its own ids; the meta copy that counts FLOPs takes the model's config as it is. The
    model class is the transformers auto class named ``auto_class``."""

    flop_dims: tuple[str, ...] = ()
    probe_config: Mapping[str, Any] = {}
    #: the name of the transformers auto class ``model_class`` gives
    auto_class: str

    def model_class(self) -> Any:
        import transformers

        return getattr(transformers, self.auto_class)

    def model_kwargs(self, parsed: ParsedArguments) -> dict[str, Any]:
        return {}

    def peft_task_type(self) -> str | None:
        return None

    def head_modules(self, model: Any) -> list[str]:
        return []

    def per_sample_modules(self, model: Any) -> set[int]:
        return set()

    def longest(self, parsed: ParsedArguments, model_config: Any) -> dict[str, int] | None:
        return {"tokens": parsed.data.max_seq_len}

    def probe_batch(self, model_config: Any, lengths: Mapping[str, int]) -> dict[str, Any]:
        ids = torch.ones((1, lengths["tokens"]), dtype=torch.long, device="meta")
        return {"input_ids": ids, "labels": ids}


@runtime_checkable
class BatchedByTRL(Protocol):
    """A task whose examples TRL's own collator batches under ``sft`` (its vision collator:
    images with conversations), rather than the tokenized sequences of causal-LM: the
    backend takes the examples as ``trl_dataset`` gives them and counts each batch with
    ``count_batch``."""

    def trl_dataset(self, data: TaskData) -> Any:
        """The examples of ``data`` as the ``datasets.Dataset`` TRL takes."""
        ...

    def count_batch(
        self, batch: Mapping[str, Any], features: Sequence[Mapping[str, Any]]
    ) -> dict[str, Any]:
        """What a batch (made of the examples ``features``) fed, as the task's own collator
        counts it (``trainer_entry.data.collate``'s keys)."""
        ...
