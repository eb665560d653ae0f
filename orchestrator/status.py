"""An experiment's status from what its run left behind. Pure.

The child's ``result.json`` is the primary evidence; the exit code and the
tail of stderr only explain runs that left no (or no trustworthy) result. A
process that exits 0 without a result is ``failed``, never ``ok``.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from orchestrator.result import one_line

_OOM_PATTERNS = (
    re.compile(r"CUDA out of memory", re.IGNORECASE),
    re.compile(r"HIP out of memory", re.IGNORECASE),
    re.compile(r"torch\.(cuda\.)?OutOfMemoryError"),
    re.compile(r"\bOutOfMemoryError\b"),
    re.compile(r"CUBLAS_STATUS_ALLOC_FAILED"),
    re.compile(r"\bMemoryError\b"),
)
# `[rank1]: ` prefixes that torch.distributed adds to each line of a rank's output
_RANK_PREFIX = re.compile(r"^\[(?:rank|default)\d*\]:\s?")
_ERROR_LINE = re.compile(
    r"^(?:[\w.]+(?:Error|Exception|Interrupt)|trainer_entry: error|error)\b.*", re.IGNORECASE
)


@dataclass(frozen=True)
class Outcome:
    status: str
    error: str | None


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(code).name
    except ValueError:
        return f"signal {code}"


def stderr_error(stderr_tail: str) -> str | None:
    """The most telling error line of a child's stderr, rank prefixes removed."""
    lines = [_RANK_PREFIX.sub("", line).strip() for line in stderr_tail.splitlines()]
    lines = [line for line in lines if line]
    # The launcher's own "ChildFailedError" report comes last and says little;
    # the child's exception line comes before it.
    for line in reversed(lines):
        if "ChildFailedError" in line or line.startswith(("torch.distributed", "Root Cause", "[")):
            continue
        if _ERROR_LINE.match(line):
            return one_line(line.removeprefix("trainer_entry: error: "))
    return one_line(lines[-1]) if lines else None


def looks_like_oom(stderr_tail: str) -> bool:
    return any(p.search(stderr_tail) for p in _OOM_PATTERNS)


def classify(
    *,
    returncode: int | None,
    result: Mapping[str, Any] | None,
    stderr_tail: str = "",
    timed_out: bool = False,
    interrupted: bool = False,
    timeout_s: float | None = None,
) -> Outcome:
    """The status and one-line error of one finished (or stopped) run.

    ``returncode`` as ``subprocess`` gives it: negative for a signal.
    """
    if interrupted:
        return Outcome("interrupted", "stopped by the user (Ctrl-C / SIGTERM)")
    if timed_out:
        limit = f" of {timeout_s:g} s" if timeout_s else ""
        return Outcome(
            "timeout", f"exceeded the time limit{limit}; the job's process group was killed"
        )

    status = result.get("status") if result else None
    if status == "ok":
        if returncode == 0:
            return Outcome("ok", None)
        return Outcome(
            "failed",
            f"exit code {returncode} after writing a complete result; see stderr.log"
            + (f" ({stderr_error(stderr_tail)})" if stderr_error(stderr_tail) else ""),
        )
    if status in ("oom", "failed", "interrupted", "timeout") and result is not None:
        error = result.get("error") or f"the child reported {status}"
        return Outcome(str(status), one_line(str(error)))

    # No usable result: explain from the exit code and stderr.
    if returncode == 0:
        return Outcome("failed", "exited 0 without writing a result")
    if looks_like_oom(stderr_tail):
        line = next(
            (
                one_line(_RANK_PREFIX.sub("", raw))
                for raw in stderr_tail.splitlines()
                if any(p.search(raw) for p in _OOM_PATTERNS)
            ),
            "out of memory",
        )
        return Outcome("oom", line)
    if returncode is not None and returncode in (-signal.SIGKILL, 128 + signal.SIGKILL):
        return Outcome(
            "oom",
            "killed by signal 9 (SIGKILL) without a result: most likely the kernel's out-of-memory killer",
        )
    if returncode is not None and returncode < 0:
        return Outcome("failed", f"killed by {_signal_name(-returncode)}")
    detail = stderr_error(stderr_tail)
    return Outcome(
        "failed", f"exit code {returncode}" + (f": {detail}" if detail else " and no error output")
    )
