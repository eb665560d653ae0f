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

A failure whose evidence shows a full disk (ENOSPC in the words of Python, the C
library, Rust's safetensors or torch's shared memory; torch's checkpoint writer's short
writes) stays ``failed``, with an error that names the folder and its free space now:
``disk full: <folder> has 312 KiB free (No space left on device)``
(``disk_full_error``). Every later run writing there would fail alike, so a run stops
early after one (``orchestrator.executors.base``).
"""

from __future__ import annotations

import errno
import re
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.contract.layout import free_bytes
from orchestrator.contract.outcome import OOM_PATTERNS, Failure, Status, looks_like_oom
from orchestrator.contract.result import one_line

# `[rank1]: ` prefixes that torch.distributed adds to each line of a rank's output
_RANK_PREFIX = re.compile(r"^\[(?:rank|default)\d*\]:\s?")
_ERROR_LINE = re.compile(
    r"^(?:[\w.]+(?:Error|Exception|Interrupt)|trainer_entry: error|error)\b.*", re.IGNORECASE
)


@dataclass(frozen=True)
class Verdict:
    """What the evidence says of a run: its status, a one-line error, and why it failed
    where what follows depends on it (``Outcome.failure``)."""

    status: Status
    error: str | None
    failure: Failure | None = None
    #: it failed without a word (on a disk with nothing free, that is why)
    silent: bool = False


#: a failure whose error stands for no other cell's
UNEXPLAINED = Failure(cause="unexplained")


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


# -- a full disk -------------------------------------------------------------------

#: what ENOSPC reads as: Python's ``OSError: [Errno 28] No space left on device``, the C
#: library's ``strerror`` (torch's legacy writer: ``write(): fd 3 failed with No space
#: left on device``; its shared memory: ``unable to write to file </torch_…>: No space
#: left on device (28)``), safetensors' ``Error while serializing: I/O error: No space
#: left on device (os error 28)`` (older: ``IoError(Os { code: 28, kind: StorageFull,
#: … })``)
_NO_SPACE = (
    re.compile(r"No space left on device", re.IGNORECASE),
    re.compile(r"\[Errno 28\]|\(os error 28\)|\bENOSPC\b|\bkind: StorageFull\b"),
)
#: torch's checkpoint writer (``torch.save``'s zip archive) when a write comes up short:
#: ``[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534`` (torch 2.13
#: on a full tmpfs) or ``PytorchStreamWriter failed writing file data/0: file write failed``
_TORCH_SHORT_WRITE = (
    re.compile(r"PytorchStreamWriter failed writing [^\n]*?: file write failed"),
    re.compile(r"inline_container\.cc:\d+\] \. (unexpected pos \d+ vs \d+)"),
)
#: how a disk-full failure's error starts (``disk_full_error``)
DISK_FULL = "disk full"
#: a path the OS error names (``… No space left on device: '/x/y'``)
_NAMED_PATH = re.compile(r"No space left on device: '(/[^']+)'")
#: torch's shared memory (``/dev/shm``): ``unable to write to file </torch_…>``
_TORCH_SHM = re.compile(r"unable to write to file </torch_")


def disk_full_cause(text: str) -> str | None:
    """What in ``text`` (an error, a stderr tail) shows a full disk, in a few words;
    None when nothing does."""
    if any(p.search(text) for p in _NO_SPACE):
        return "No space left on device"
    for pattern in _TORCH_SHORT_WRITE:
        found = pattern.search(text)
        if found:
            return f"torch.save: {found.group(found.lastindex or 0)}"
    return None


def human_bytes(size: float) -> str:
    """``312 KiB``, ``1.5 GiB``: a size in bytes, for a message."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            break
        size /= 1024
    return f"{size:.0f} {unit}" if unit == "B" or size >= 100 else f"{size:.1f} {unit}"


def _full_folder(text: str, folder: Path | None) -> Path | None:
    """The folder whose disk was full: the one the error names (a path, torch's shared
    memory), else ``folder`` (the run's)."""
    if _TORCH_SHM.search(text):
        return Path("/dev/shm")
    named = _NAMED_PATH.search(text)
    if named:
        path = Path(named.group(1))
        return path if path.is_dir() else path.parent
    return folder


def disk_full_error(folder: Path | None, cause: str) -> str:
    """``disk full: /r/runs/x has 312 KiB free (No space left on device)``: the folder's
    free space read now."""
    if folder is None:
        return f"{DISK_FULL} ({cause})"
    free = free_bytes(folder)
    room = f" has {human_bytes(free)} free" if free is not None else ""
    return f"{DISK_FULL}: {folder}{room} ({cause})"


def disk_full(folder: Path | None, cause: str) -> Verdict:
    """A failure for a full disk: its error (``disk_full_error``) and its folder as data."""
    return Verdict(
        "failed",
        disk_full_error(folder, cause),
        Failure(cause="disk_full", folder=None if folder is None else str(folder)),
    )


def _disk_full(verdict: Verdict, evidence: str, folder: Path | None) -> Verdict:
    """``verdict`` as a full disk when it is a failure and ``evidence`` shows one (or,
    silent, it left the run's folder with nothing free)."""
    if verdict.status != "failed":
        return verdict
    cause = disk_full_cause(evidence)
    if cause is not None:
        return disk_full(_full_folder(evidence, folder), cause)
    if verdict.silent and folder is not None and free_bytes(folder) == 0:
        return disk_full(folder, verdict.error or "")
    return verdict


def write_failure(exc: OSError, folder: Path) -> Verdict | None:
    """The verdict on a run whose own files (spec, command, outcome) could not be written
    because the disk is full; None when ``exc`` is some other error."""
    if exc.errno != errno.ENOSPC:
        return None
    where = Path(exc.filename).parent if isinstance(exc.filename, str) else folder
    return disk_full(where, "No space left on device")


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
    folder: Path | None = None,
) -> Verdict:
    """The status and one-line error of one finished (or stopped) run.

    ``returncode`` as ``subprocess`` gives it: negative for a signal.
    ``interrupted``: the parent stopped the job (the only case in which a
    child's own ``interrupted`` is believed). ``host_oom``: the kernel's
    report of an out-of-memory kill in the job's cgroups or of one of its
    processes (``orchestrator.job.oomkill``); ``host_oom_checked``: whether such a
    report could have been read at all. ``folder``: where the run writes (its run
    folder), whose free space a disk-full error states (``disk_full_error``).
    """
    verdict = _classify(
        returncode=returncode,
        result=result,
        stderr_tail=stderr_tail,
        timed_out=timed_out,
        interrupted=interrupted,
        timeout_s=timeout_s,
        host_oom=host_oom,
        host_oom_checked=host_oom_checked,
    )
    # the child's own report of its failure, when it made one, else its stderr
    reported = result.get("error") if result and result.get("status") == "failed" else None
    evidence = str(reported) if reported else stderr_tail
    return _disk_full(verdict, evidence, folder)


def _classify(
    *,
    returncode: int | None,
    result: Mapping[str, Any] | None,
    stderr_tail: str,
    timed_out: bool,
    interrupted: bool,
    timeout_s: float | None,
    host_oom: str | None,
    host_oom_checked: bool,
) -> Verdict:
    """``classify``, before a full disk is looked for."""
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
        return Verdict("failed", "exited 0 without writing a result", silent=True)
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
                UNEXPLAINED,
            )
        return Verdict(
            "failed",
            f"{who} was killed by SIGKILL; whether by the out-of-memory killer is unknown "
            "(neither the memory cgroup counters nor the kernel log could be read)",
            UNEXPLAINED,
        )
    if death is not None and death.exitcode < 0:
        return Verdict("failed", f"{who} was killed by {_signal_name(-death.exitcode)}")
    if returncode is not None and returncode < 0:
        return Verdict("failed", f"killed by {_signal_name(-returncode)}")
    detail = stderr_error(stderr_tail)
    if detail:
        return Verdict("failed", f"exit code {returncode}: {detail}")
    return Verdict(
        "failed", f"exit code {returncode} and no error output", UNEXPLAINED, silent=True
    )
