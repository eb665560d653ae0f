"""The held-out split of ``eval: true``: which prepared examples are evaluated, not trained on.

One rule for every task. The unit split is the document: a prepared sequence
before packing (a record's tokens, a text with its class), or an image. The
examples held out are chosen by a hash of their position in the prepared data
(SHA-256 of ``HOLDOUT_SALT`` and the index), so the choice is the same on every
machine, rank and library version, does not depend on the data's order of
classes or lengths, and a larger ``holdout`` keeps the smaller one's examples.
The two parts are disjoint and together the whole prepared set.

The split is made in memory after the data is prepared (or read from the
cache): the cache holds the whole set, keyed as before, so cells without eval
read and train on exactly what they did, and cells with eval share their cache
entry. A packed causal-LM run is split into documents first and each part
packed on its own, so no document lands in both (``trainer_entry.tasks.causal_lm``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Sequence
from typing import Any, TypeVar

import numpy as np

from trainer_entry.data.formats import IGNORE_INDEX
from trainer_entry.data.tokenize import PreparedData, sequences
from trainer_entry.settings.parsed import DataConfig
from trainer_entry.spec_errors import SpecError

#: the default held-out share of the prepared examples, and its cap
DEFAULT_FRACTION = 0.1
DEFAULT_CAP = 256
#: what the position is hashed with (changing it changes every split)
HOLDOUT_SALT = "tunematrix-holdout-v1"

T = TypeVar("T")


def holdout_count(total: int, holdout: int | float | None) -> int:
    """How many of ``total`` examples are held out: ``holdout`` examples (an int ≥ 1) or
    that share of them (a float in (0, 1), rounded up); None: 10%, at most 256.

    At least one example is held out and at least one is left to train on;
    ``SpecError`` where that is impossible.
    """
    if total < 2:
        raise SpecError(
            f"eval needs at least 2 examples (one to train on, one held out); the data has {total}"
        )
    if holdout is None:
        count = min(DEFAULT_CAP, math.ceil(DEFAULT_FRACTION * total))
    elif isinstance(holdout, float):
        count = math.ceil(holdout * total)
    else:
        count = int(holdout)
    if count >= total:
        raise SpecError(
            f"holdout {holdout} leaves nothing to train on: the data has {total} examples"
        )
    return max(1, count)


def holdout_indices(total: int, count: int) -> tuple[list[int], list[int]]:
    """(the indices trained on, the indices held out) of ``total`` examples, each ascending."""
    order = sorted(
        range(total),
        key=lambda i: hashlib.sha256(f"{HOLDOUT_SALT}:{i}".encode()).digest(),
    )
    held = sorted(order[:count])
    chosen = set(held)
    return [i for i in range(total) if i not in chosen], held


def label_tokens(labels: Sequence[Any]) -> int:
    """Tokens that carry a loss (a class id counts one)."""
    return int(sum(np.count_nonzero(np.asarray(x) != IGNORE_INDEX) for x in labels))


def _take(values: Any, indices: list[int]) -> Any:
    if isinstance(values, np.ndarray):
        return values[np.asarray(indices, dtype=np.int64)]
    return [values[i] for i in indices]


def split_sequences(data: T, holdout: int | float | None) -> tuple[T, T]:
    """(the part trained on, the part held out) of prepared sequences.

    ``data`` is a dataclass with ``input_ids`` (one array per sequence), ``labels``
    (per sequence: a label array, or a class id) and ``meta``
    (``trainer_entry.data.tokenize.PreparedData``, the classification task's
    ``ClassifiedTexts``). Each part's ``meta`` counts its own sequences, tokens and
    label tokens; the trained part's also says how many were held out.
    """
    ids: list[np.ndarray] = data.input_ids  # type: ignore[attr-defined]
    labels = data.labels  # type: ignore[attr-defined]
    meta: dict[str, Any] = data.meta  # type: ignore[attr-defined]
    count = holdout_count(len(ids), holdout)
    train, held = holdout_indices(len(ids), count)
    parts = []
    for indices in (train, held):
        part_ids, part_labels = _take(ids, indices), _take(labels, indices)
        part_meta = {
            **meta,
            "sequences": len(indices),
            "tokens": int(sum(len(x) for x in part_ids)),
            "label_tokens": label_tokens(part_labels),
        }
        parts.append(
            dataclasses.replace(  # type: ignore[type-var]
                data, input_ids=part_ids, labels=part_labels, meta=part_meta
            )
        )
    parts[0].meta["heldout_sequences"] = count  # type: ignore[attr-defined]
    return parts[0], parts[1]


def pack_part(data: PreparedData, cfg: DataConfig, part: str) -> PreparedData:
    """One part of split documents packed into rows of ``max_seq_len``, as the whole set
    would have been (``trainer_entry.data.tokenize.sequences``); ``part`` names it in an error."""
    meta = {
        k: v for k, v in data.meta.items() if k not in ("examples_truncated", "examples_dropped")
    }
    meta.update(packing=True, max_seq_len=cfg.max_seq_len)
    try:
        ids, labels = sequences(zip(data.input_ids, data.labels, strict=True), cfg, meta)
    except SpecError as exc:
        raise SpecError(f"eval: {part}: {exc}; change holdout or max_seq_len") from None
    return PreparedData(input_ids=ids, labels=labels, meta=meta)
