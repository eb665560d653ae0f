"""What became of an experiment: the statuses, and the out-of-memory evidence.

``Status`` is the one list of statuses a row can have; ``ACCEPTABLE`` says which
of them leave a run's exit code at 0. ``OOM_PATTERNS`` is the one list of
out-of-memory messages: the child uses it to classify its own exceptions, the
parent to read a stderr without a result.
"""

from __future__ import annotations

import re
from typing import Literal, get_args

Status = Literal["ok", "oom", "timeout", "failed", "interrupted", "skipped", "planned"]
#: every ``Status``, in the order tables list them
STATUSES: tuple[Status, ...] = get_args(Status)
#: statuses that do not fail a run (``oom`` is a finding; ``planned``: submitted, not run yet)
ACCEPTABLE: tuple[Status, ...] = ("ok", "oom", "skipped", "planned")
#: statuses whose measurements count (a ``skipped`` row kept an earlier run's figures)
MEASURED: tuple[Status, ...] = ("ok", "skipped")
#: statuses of a run that was tried and lost
LOST: tuple[Status, ...] = ("oom", "failed", "timeout", "interrupted")

OOM_PATTERNS = (
    re.compile(r"CUDA out of memory", re.IGNORECASE),
    re.compile(r"HIP out of memory", re.IGNORECASE),
    re.compile(r"MPS backend out of memory", re.IGNORECASE),
    re.compile(r"(?:CUDA|HIP|XPU) error: out of memory", re.IGNORECASE),
    re.compile(r"torch\.(cuda\.)?OutOfMemoryError"),
    re.compile(r"\bOutOfMemoryError\b"),
    re.compile(r"CUBLAS_STATUS_ALLOC_FAILED"),
    re.compile(r"\bMemoryError\b"),
)


def looks_like_oom(text: str) -> bool:
    """Whether ``text`` (an exception message or a stderr tail) reports out-of-memory."""
    return any(p.search(text) for p in OOM_PATTERNS)
