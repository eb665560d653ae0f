"""Sequences to batches: the dataset a trainer iterates, and the collator that counts tokens.

The collator reports the real (non padding) and padded token counts of every
batch, which is what throughput is computed from. They ride along in the
batch under the three keys below; a trainer takes them out with ``pop_counts``
before the forward pass.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from trainer_entry.data.formats import IGNORE_INDEX
from trainer_entry.data.tokenize import PreparedData

#: what the collator adds to a batch besides the model's inputs
REAL_TOKENS, PADDED_TOKENS, REAL_LENGTHS = "num_real_tokens", "num_padded_tokens", "real_lengths"
#: what a task's collator adds where it counts more than tokens: the micro-batch's counts
#: (``orchestrator.contract.trainers.COUNT_UNITS``: source tokens, audio seconds, …) and
#: each row's lengths along the dimensions its FLOPs depend on (``Task.flop_dims``)
COUNTS, ROW_DIMS = "num_counts", "row_dims"


def input_dtype(model_config: Any) -> torch.dtype | None:
    """The floating dtype of the model's weights, from its config: what a task feeds
    floating inputs (pixels, audio features) in, since a convolution takes its input as
    it is given (no autocast without mixed precision); None when the config says none."""
    dtype = getattr(model_config, "dtype", None)
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype.removeprefix("torch."), None)
    return dtype if isinstance(dtype, torch.dtype) and dtype.is_floating_point else None


class SequenceDataset(torch.utils.data.Dataset[dict[str, np.ndarray]]):
    def __init__(self, data: PreparedData) -> None:
        self.data = data

    def __len__(self) -> int:
        return len(self.data.input_ids)

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        return {"input_ids": self.data.input_ids[i], "labels": self.data.labels[i]}


@dataclass(frozen=True)
class BatchCounts:
    """What one micro-batch fed: real tokens, the padded rectangle, each row's real length."""

    real: int = 0
    padded: int = 0
    #: None: the batch did not come from ``Collator``
    lengths: list[int] | None = field(default=None)
    #: the task's counts beside tokens (``COUNT_UNITS``), real (not padding)
    counts: Mapping[str, float] = field(default_factory=dict)
    #: dimension -> each row's real length along it (``Task.flop_dims``)
    dims: Mapping[str, list[int]] = field(default_factory=dict)


def pop_counts(inputs: dict[str, Any]) -> BatchCounts:
    """Take the collator's counts out of a batch, leaving the model's inputs."""
    return BatchCounts(
        real=inputs.pop(REAL_TOKENS, 0),
        padded=inputs.pop(PADDED_TOKENS, 0),
        lengths=inputs.pop(REAL_LENGTHS, None),
        counts=inputs.pop(COUNTS, None) or {},
        dims=inputs.pop(ROW_DIMS, None) or {},
    )


@dataclass
class Collator:
    """Right-pads a batch and says how many of its tokens are real.

    ``num_real_tokens`` (attention-mask ones), ``num_padded_tokens`` (the
    whole rectangle) and ``real_lengths`` (each row's real length, what
    attention FLOPs are computed from) ride along as plain ints, which the
    trainer removes before the forward pass; being ints, they never touch the
    device. A packed row is one sequence of its full length: packing keeps no
    document boundaries, so its tokens attend across the whole row.
    """

    pad_token_id: int
    pad_to_multiple_of: int | None = None

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        batch = padded_batch(features, self.pad_token_id, self.pad_to_multiple_of)
        # a row's labels are as long as its ids: the same width
        labels = pad_rows([f["labels"] for f in features], IGNORE_INDEX, self.pad_to_multiple_of)
        return {**batch, "labels": labels}


def pad_rows(
    rows: Sequence[Any], value: int, pad_to_multiple_of: int | None = None
) -> torch.Tensor:
    """``rows`` (token ids or labels) right-padded with ``value`` into one long tensor, as
    wide as the longest (rounded up to a multiple of ``pad_to_multiple_of`` when set)."""
    width = max(len(r) for r in rows)
    if pad_to_multiple_of:
        m = pad_to_multiple_of
        width = (width + m - 1) // m * m
    out = torch.full((len(rows), width), value, dtype=torch.long)
    for row, r in enumerate(rows):
        out[row, : len(r)] = torch.as_tensor(r)
    return out


def padded_batch(
    features: Sequence[Mapping[str, Any]], pad_token_id: int, pad_to_multiple_of: int | None
) -> dict[str, Any]:
    """``input_ids`` right-padded (to a multiple of ``pad_to_multiple_of`` when set), their
    ``attention_mask``, and the three counts: real tokens, the rectangle, each row's length."""
    lengths = [len(f["input_ids"]) for f in features]
    input_ids = pad_rows([f["input_ids"] for f in features], pad_token_id, pad_to_multiple_of)
    n, width = input_ids.shape
    attention = (torch.arange(width) < torch.as_tensor(lengths)[:, None]).long()
    return {
        "input_ids": input_ids,
        "attention_mask": attention,
        REAL_TOKENS: int(sum(lengths)),
        PADDED_TOKENS: n * width,
        REAL_LENGTHS: lengths,
    }


def count_collated(batch: Mapping[str, Any], features: Sequence[Mapping[str, Any]]) -> BatchCounts:
    """What a batch made by a collator that counts nothing fed (TRL's language-modeling one).

    ``features`` are the examples the collator was given, ``batch`` what it
    made of them. A collator pads and never cuts, so the real tokens are
    every token of every example; the padded tokens are the batch's
    rectangle. The lengths are the sequences attention runs over: with an
    attention mask, each row's real tokens (its ones; a packed row without
    document boundaries is one sequence); without one (padding-free: the
    examples flattened into a single row, told apart by ``position_ids``
    restarting at 0, which transformers attends document by document), each
    document. ``ValueError`` when the batch does not hold the examples as
    described.
    """
    ids = batch["input_ids"]
    real = sum(len(f["input_ids"]) for f in features)
    padded = int(ids.numel())
    mask = batch.get("attention_mask")
    if mask is not None:
        rows = [int(n) for n in mask.sum(dim=-1).tolist()]
        if rows != [len(f["input_ids"]) for f in features]:
            raise ValueError(
                f"the batch's attention mask holds rows of {rows} tokens, its examples "
                f"{[len(f['input_ids']) for f in features]}"
            )
        return BatchCounts(real=real, padded=padded, lengths=rows)
    positions = batch.get("position_ids")
    if positions is None or positions.shape[0] != 1 or positions.shape[-1] < real:
        raise ValueError(
            "a batch without an attention mask must be one padding-free row with position_ids "
            f"covering its {real} tokens"
        )
    flat = positions[0, :real]
    starts = (flat == 0).nonzero().flatten().tolist()
    if real and (not starts or starts[0] != 0):
        raise ValueError("a padding-free row must start a document at position 0")
    lengths = [b - a for a, b in itertools.pairwise([*starts, real])]
    return BatchCounts(real=real, padded=padded, lengths=lengths)
