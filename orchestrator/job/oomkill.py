"""Evidence that the kernel's out-of-memory killer ended a job.

A process killed by the OOM killer gets SIGKILL and writes nothing; the
launcher then stops the job's other ranks, which report "interrupted". The
signal alone does not say who sent it (a user's ``kill -9``, a scheduler, the
OOM killer), so a host OOM is recorded only with the kernel's own word for it:

- the ``oom_kill`` counter of the memory cgroup the job runs in, or of one of
  its ancestors (cgroup v1 ``memory.oom_control``, v2 ``memory.events``),
  read before the launch and after the job ended — a limit set by a batch scheduler or
  by hand on any of them is where a kill would be counted;
- the kernel log (``/dev/kmsg``, readable by root): a ``Killed process <pid>``
  line after the launch naming a process of the job.

A watch is cheap (a few small files read at launch); the kernel log is read
only after a job that lost a process to SIGKILL.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
_KILLED_LINE = re.compile(r"Killed process (\d+) \(([^)]*)\)")
#: how much of the kernel log to read at most (records are a few hundred bytes)
_KMSG_MAX_RECORDS = 50_000


def parse_oom_kill_count(text: str) -> int | None:
    """``oom_kill N`` from the text of ``memory.oom_control`` or ``memory.events``."""
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill" and value.strip().isdigit():
            return int(value)
    return None


def memory_cgroups(proc_cgroup: str, root: Path = CGROUP_ROOT) -> list[Path]:
    """The memory cgroup folders of a process (from ``/proc/<pid>/cgroup``), innermost first.

    cgroup v1 lines look like ``4:memory:/batch/uid_0/job_12``; v2 has one
    line ``0::/path``. Each ancestor up to the hierarchy's root is listed too,
    because a limit on any of them can end the job.
    """
    dirs: list[Path] = []
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if "memory" in controllers.split(","):
            base = root / "memory"
        elif controllers == "" and (root / "cgroup.controllers").exists():
            base = root  # the unified (v2) hierarchy mounted at the root
        else:
            continue
        relative = Path(path.lstrip("/"))
        chain = [relative, *relative.parents]
        dirs += [base / p for p in chain if (base / p).is_dir()]
    return dirs


def _read_count(folder: Path) -> int | None:
    for name in ("memory.oom_control", "memory.events"):
        try:
            count = parse_oom_kill_count((folder / name).read_text())
        except OSError:
            continue
        if count is not None:
            return count
    return None


@dataclass
class OomWatch:
    """oom_kill counters of a job's memory cgroups at its launch, and when that was."""

    counters: dict[Path, int] = field(default_factory=dict)
    #: CLOCK_MONOTONIC at the launch, in µs: the kernel log's time base
    since_us: int = 0

    @property
    def can_see_cgroups(self) -> bool:
        return bool(self.counters)


def watch(pid: int | None = None) -> OomWatch:
    """Start watching the memory cgroups of ``pid`` (default: this process, whose children inherit them)."""
    since = int(time.clock_gettime(time.CLOCK_MONOTONIC) * 1e6)
    try:
        text = Path(f"/proc/{pid or os.getpid()}/cgroup").read_text()
    except OSError:
        return OomWatch(since_us=since)
    counters = {}
    for folder in memory_cgroups(text):
        count = _read_count(folder)
        if count is not None:
            counters[folder] = count
    return OomWatch(counters=counters, since_us=since)


def parse_kmsg_kills(records: Iterable[str], since_us: int) -> dict[int, str]:
    """``{pid: "Killed process …" line}`` from ``/dev/kmsg`` records newer than ``since_us``.

    A record is ``priority,sequence,microseconds,flags;message``.
    """
    kills: dict[int, str] = {}
    for record in records:
        head, sep, message = record.partition(";")
        fields = head.split(",")
        if not sep or len(fields) < 3 or not fields[2].isdigit() or int(fields[2]) < since_us:
            continue
        match = _KILLED_LINE.search(message)
        if match:
            kills[int(match.group(1))] = message[: match.end()].strip()
    return kills


def _kmsg_records() -> list[str]:
    """Every record the kernel log holds now; [] where it cannot be read (not root)."""
    records: list[str] = []
    try:
        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return records
    try:
        while len(records) < _KMSG_MAX_RECORDS:
            try:
                chunk = os.read(fd, 8192)  # one record per read
            except BlockingIOError:
                break  # read everything there is
            except OSError as exc:
                if exc.errno == 32:  # EPIPE: a record was overwritten while reading
                    continue
                break
            if not chunk:
                break
            records.append(chunk.decode(errors="replace"))
    finally:
        os.close(fd)
    return records


@dataclass(frozen=True)
class OomEvidence:
    #: what the kernel said, one line; None when it reported no OOM kill
    found: str | None
    #: whether any source could be read at all (cgroup counters or the kernel log)
    checked: bool


def evidence(started: OomWatch, pids: Iterable[int]) -> OomEvidence:
    """Did the OOM killer kill a process of the job (``pids``) since ``started``?"""
    job = set(pids)
    records = _kmsg_records()
    # printk's clock and CLOCK_MONOTONIC can differ slightly; the pid match
    # is what ties a kill to this job, the time only keeps out old ones
    kills = parse_kmsg_kills(records, started.since_us - 2_000_000)
    for pid in sorted(job & set(kills)):
        return OomEvidence(found=f"kernel: {kills[pid]}", checked=True)
    for folder, before in started.counters.items():
        after = _read_count(folder)
        if after is not None and after > before:
            return OomEvidence(
                found=f"memory cgroup {folder}: oom_kill {before} → {after}", checked=True
            )
    return OomEvidence(found=None, checked=bool(records) or started.can_see_cgroups)
