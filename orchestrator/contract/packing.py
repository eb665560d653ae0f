"""What ``packing: true`` means, under every trainer, and when TRL's own packing is asked for.

``packing: true`` is one thing everywhere: tunematrix concatenates the
tokenized examples and cuts blocks of exactly ``max_seq_len`` tokens (the tail
shorter than a block is dropped), and every trainer is fed those blocks. Their
tokens attend across the whole block, so the token counts, the FLOPs per token
and the attention kernel are the same under ``hf`` and ``sft``.

TRL's own packing runs only when a scenario names a ``packing_strategy``
(an ``SFTConfig`` argument). Its ``bfd`` and ``bfd_split`` keep documents
apart: each document attends to itself only. That is fast only with an
attention kernel that takes per-document lengths (flash-attention's varlen
path); under ``sdpa`` or ``eager`` transformers builds per-document masks,
and the same training measured several times slower on a GPU.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: the argument that hands packing to TRL (``SFTConfig``'s)
STRATEGY_KEY = "packing_strategy"
#: TRL's strategies that keep documents apart (per-document attention)
PER_DOCUMENT = frozenset({"bfd", "bfd_split"})


def trl_strategy(packing: bool | None, arguments: Mapping[str, Any]) -> str | None:
    """TRL's packing strategy when a run hands packing to TRL, None when tunematrix packs
    (or nothing is packed)."""
    if not packing:
        return None
    strategy = arguments.get(STRATEGY_KEY)
    return None if strategy is None else str(strategy)


def masked_per_document(strategy: str | None, attn_implementation: str | None) -> bool:
    """Whether per-document attention runs through masks: a per-document strategy under
    an attention implementation that takes no per-document lengths (``sdpa`` by default)."""
    if strategy not in PER_DOCUMENT:
        return False
    # flash_attention_2/3 and the hub's flash kernels take the lengths (varlen)
    return "flash" not in (attn_implementation or "sdpa")


def masked_note(strategy: str, attn_implementation: str | None) -> str:
    """The line that says a run's per-document attention went through masks."""
    return (
        f"packing_strategy {strategy} keeps documents apart, and under "
        f"attn_implementation {attn_implementation or 'sdpa'} their attention runs through "
        "per-document masks, which measured about 4x slower on a GPU than the same tokens in "
        "blocks; only a kernel that takes per-document lengths (flash_attention_2) makes it fast"
    )
