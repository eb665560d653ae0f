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
for every task.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from trainer_entry.data.holdout import holdout_count, holdout_indices
from trainer_entry.models.for_task import ModelTask

if TYPE_CHECKING:
    import torch

    from trainer_entry.settings.parsed import ParsedArguments


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
