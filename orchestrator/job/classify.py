"""An experiment's status from what its run left behind. Pure.

The child's ``result.json`` is the primary evidence; the exit code and the
tail of stderr only explain runs that left no (or no trustworthy) result. A
process that exits 0 without a result is ``failed``, never ``ok``.

A child's ``interrupted`` is trusted only when the parent stopped the job
(Ctrl-C, a stop request): otherwise the launcher stopped the ranks because a
peer died, and the run is explained from the launcher's root cause — a rank
killed by SIGKILL is ``oom`` ("host memory") when the kernel reported an
out-of-memory kill of the job (see ``orchestrator.job.oomkill``), ``failed`` when
it did not.

The out-of-memory messages are ``orchestrator.contract.outcome.OOM_PATTERNS``,
shared with the child.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from orchestrator.contract.outcome import OOM_PATTERNS, Status, looks_like_oom
from orchestrator.contract.result import one_line

# `[rank1]: ` prefixes that torch.distributed adds to each line of a rank's output
_RANK_PREFIX = re.compile(r"^\[(?:rank|default)\d*\]:\s?")
_ERROR_LINE = re.compile(
    r"^(?:[\w.]+(?:Error|Exception|Interrupt)|trainer_entry: error|error)\b.*", re.IGNORECASE
)


@dataclass(frozen=True)
class Verdict:
    """What the evidence says of a run: its status and a one-line error."""

    status: Status
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


@dataclass(frozen=True)
class RankDeath:
    """The launcher's report of the first process of the job that died."""

    #: negative: the signal that ended it
    exitcode: int
    rank: int | None = None
    pid: int | None = None

    @property
    def who(self) -> str:
        pid = f" (pid {self.pid})" if self.pid is not None else ""
        return f"rank {self.rank}{pid}" if self.rank is not None else f"the training process{pid}"


_ROOT_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)", re.MULTILINE)
_ROOT_EXIT = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)(?:\s*\(pid:\s*(\d+)\))?", re.MULTILINE)
_SIMPLE_DIED = re.compile(r"died with <Signals\.\w+: (\d+)>")
_SIGKILLED_PID = re.compile(
    r"exitcode\s*:\s*-9\s*\(pid:\s*(\d+)\)|Signal 9 \(SIGKILL\) received by PID (\d+)"
)


def root_cause(stderr_tail: str) -> RankDeath | None:
    """What the launcher names as the first failure, from its stderr.

    torchrun's elastic agent (several processes) prints a ``Root Cause`` block
    with the rank, ``exitcode`` and pid; accelerate's one-process launcher
    raises ``CalledProcessError`` ending in ``died with <Signals.SIGKILL: 9>``.
    """
    text = stderr_tail
    at = text.rfind("Root Cause")
    if at >= 0:
        block = text[at:].split("=====", 1)[0]
        code = _ROOT_EXIT.search(block)
        if code:
            rank = _ROOT_RANK.search(block)
            return RankDeath(
                exitcode=int(code.group(1)),
                rank=int(rank.group(1)) if rank else None,
                pid=int(code.group(2)) if code.group(2) else None,
            )
    died = _SIMPLE_DIED.search(text)
    if died:
        return RankDeath(exitcode=-int(died.group(1)))
    return None


def sigkilled_pids(stderr_tail: str) -> set[int]:
    """Pids the launcher reports as ended by SIGKILL."""
    return {int(a or b) for a, b in _SIGKILLED_PID.findall(stderr_tail)}


def _is_sigkill(code: int | None) -> bool:
    return code is not None and code in (-signal.SIGKILL, 128 + signal.SIGKILL)


def classify(
    *,
    returncode: int | None,
    result: Mapping[str, Any] | None,
    stderr_tail: str = "",
    timed_out: bool = False,
    interrupted: bool = False,
    timeout_s: float | None = None,
    host_oom: str | None = None,
    host_oom_checked: bool = False,
) -> Verdict:
    """The status and one-line error of one finished (or stopped) run.

    ``returncode`` as ``subprocess`` gives it: negative for a signal.
    ``interrupted``: the parent stopped the job (the only case in which a
    child's own ``interrupted`` is believed). ``host_oom``: the kernel's
    report of an out-of-memory kill in the job's cgroups or of one of its
    processes (``orchestrator.job.oomkill``); ``host_oom_checked``: whether such a
    report could have been read at all.
    """
    if interrupted:
        return Verdict("interrupted", "stopped by the user (Ctrl-C / SIGTERM)")
    if timed_out:
        limit = f" of {timeout_s:g} s" if timeout_s else ""
        return Verdict(
            "timeout", f"exceeded the time limit{limit}; the job's process group was killed"
        )

    status = result.get("status") if result else None
    if status == "ok":
        if returncode == 0:
            return Verdict("ok", None)
        return Verdict(
            "failed",
            f"exit code {returncode} after writing a complete result; see stderr.log"
            + (f" ({stderr_error(stderr_tail)})" if stderr_error(stderr_tail) else ""),
        )
    if status in ("oom", "failed", "timeout") and result is not None:
        error = result.get("error") or f"the child reported {status}"
        return Verdict(status, one_line(str(error)))
    # A child's "interrupted" that the parent did not cause: the launcher
    # stopped it because a peer died. Explain the run from that peer.

    if returncode == 0:
        return Verdict("failed", "exited 0 without writing a result")
    if looks_like_oom(stderr_tail):
        line = next(
            (
                one_line(_RANK_PREFIX.sub("", raw))
                for raw in stderr_tail.splitlines()
                if any(p.search(raw) for p in OOM_PATTERNS)
            ),
            "out of memory",
        )
        return Verdict("oom", line)
    death = root_cause(stderr_tail)
    if _is_sigkill(returncode) and (death is None or not _is_sigkill(death.exitcode)):
        death = RankDeath(exitcode=-signal.SIGKILL, rank=None)
        who = "the job's launcher"
    else:
        who = death.who if death is not None else ""
    if death is not None and _is_sigkill(death.exitcode):
        if host_oom:
            return Verdict(
                "oom",
                f"host memory: {who} was killed by the kernel's out-of-memory killer ({host_oom})",
            )
        if host_oom_checked:
            return Verdict(
                "failed",
                f"{who} was killed by SIGKILL, not by the out-of-memory killer "
                "(no OOM kill in the job's memory cgroups or the kernel log)",
            )
        return Verdict(
            "failed",
            f"{who} was killed by SIGKILL; whether by the out-of-memory killer is unknown "
            "(neither the memory cgroup counters nor the kernel log could be read)",
        )
    if death is not None and death.exitcode < 0:
        return Verdict("failed", f"{who} was killed by {_signal_name(-death.exitcode)}")
    if returncode is not None and returncode < 0:
        return Verdict("failed", f"killed by {_signal_name(-returncode)}")
    detail = stderr_error(stderr_tail)
    return Verdict(
        "failed", f"exit code {returncode}" + (f": {detail}" if detail else " and no error output")
    )
