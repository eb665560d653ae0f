"""Sequences to batches: the dataset a trainer iterates, and the collator that counts tokens.

The collator reports the real (non padding) and padded token counts of every
batch, which is what throughput is computed from. They ride along in the
batch under the three keys below; a trainer takes them out with ``pop_counts``
before the forward pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from trainer_entry.data.formats import IGNORE_INDEX
from trainer_entry.data.tokenize import PreparedData

#: what the collator adds to a batch besides the model's inputs
REAL_TOKENS, PADDED_TOKENS, REAL_LENGTHS = "num_real_tokens", "num_padded_tokens", "real_lengths"


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


def pop_counts(inputs: dict[str, Any]) -> BatchCounts:
    """Take the collator's counts out of a batch, leaving the model's inputs."""
    return BatchCounts(
        real=inputs.pop(REAL_TOKENS, 0),
        padded=inputs.pop(PADDED_TOKENS, 0),
        lengths=inputs.pop(REAL_LENGTHS, None),
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
        lengths = [len(f["input_ids"]) for f in features]
        width = max(lengths)
        if self.pad_to_multiple_of:
            m = self.pad_to_multiple_of
            width = (width + m - 1) // m * m
        n = len(features)
        input_ids = torch.full((n, width), self.pad_token_id, dtype=torch.long)
        labels = torch.full((n, width), IGNORE_INDEX, dtype=torch.long)
        attention = torch.zeros((n, width), dtype=torch.long)
        for row, (f, length) in enumerate(zip(features, lengths, strict=True)):
            input_ids[row, :length] = torch.as_tensor(f["input_ids"])
            labels[row, :length] = torch.as_tensor(f["labels"])
            attention[row, :length] = 1
        return {
            "input_ids": input_ids,
            "attention_mask": attention,
            "labels": labels,
            REAL_TOKENS: int(sum(lengths)),
            PADDED_TOKENS: n * width,
            REAL_LENGTHS: lengths,
        }
