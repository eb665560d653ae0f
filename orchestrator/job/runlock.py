"""A run folder knows when a job of it is alive: ``runs/<id>/running.lock``.

Before a launch, the orchestrator takes an exclusive ``flock`` on the lock file of
each run the launch runs, writes there who holds it (host, executor, its own pid, the
launch id; then the launcher's pid), and hands the open file to the launcher
(``pass_fds``). The kernel holds the lock while the orchestrator or the launcher
lives, and frees it when both are gone, however they died. At the end of the launch
the orchestrator removes the file.

Before a cell is launched again (``run``, ``--resume``), ``stop_earlier`` looks at its
lock. A lock nobody holds is a leftover of an attempt that is over. A lock still held
means an earlier attempt's job is alive: on this host it is stopped (SIGTERM to every
process that carries its launch id, a grace period, SIGKILL), and the new attempt
starts only once the lock is free; otherwise the launch is refused in one line naming
the host and pids. Never a second copy of a cell beside the first.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import signal
import socket
import time
from collections.abc import Callable, Sequence
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.contract.clock import now
from orchestrator.contract.errors import UserError
from orchestrator.contract.layout import RunPaths
from orchestrator.contract.result import LAUNCH_ID_ENV

#: how long, after SIGKILL, an earlier attempt's processes get to be gone
KILL_WAIT_S = 10.0
#: the most of a lock file read back
RECORD_BYTES = 16 * 1024


class RunBusy(UserError):
    """An earlier attempt of a run is alive and cannot be stopped from here."""


@dataclass(frozen=True)
class Holder:
    """What a held lock file says of the attempt holding it."""

    run_dir: Path
    host: str | None = None
    executor: str | None = None
    orchestrator_pid: int | None = None
    launcher_pid: int | None = None
    launch_id: str | None = None
    started_at: str | None = None

    def describe(self, pids: Sequence[int] = ()) -> str:
        """E.g. ``launched 2026-11-28T23:10:02 by tunematrix pid 812 on gpu-3, pids 815, 818``."""
        parts = [f"launched {self.started_at}" if self.started_at else "launched"]
        if self.orchestrator_pid is not None:
            parts.append(f"by tunematrix pid {self.orchestrator_pid}")
        if self.host:
            parts.append(f"on {self.host}")
        shown = list(pids) or ([self.launcher_pid] if self.launcher_pid is not None else [])
        text = " ".join(parts)
        return f"{text}, pids {', '.join(map(str, shown))}" if shown else text


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _record(fd: int, run_dir: Path) -> Holder:
    try:
        data = json.loads(os.pread(fd, RECORD_BYTES, 0).decode("utf-8", errors="replace"))
    except (OSError, ValueError):
        data = None  # being written, or not ours: the lock alone says it is alive
    if not isinstance(data, dict):
        return Holder(run_dir)
    return Holder(
        run_dir,
        host=_str(data.get("host")),
        executor=_str(data.get("executor")),
        orchestrator_pid=_int(data.get("orchestrator_pid")),
        launcher_pid=_int(data.get("launcher_pid")),
        launch_id=_str(data.get("launch_id")),
        started_at=_str(data.get("started_at")),
    )


class RunLock:
    """The locks of one launch's runs, held from before the launch to its end."""

    def __init__(self, fds: list[int], paths: list[Path], record: dict[str, Any]) -> None:
        self._fds, self._paths, self._record = fds, paths, record

    @classmethod
    def take(cls, run_dirs: Sequence[Path], launch_id: str, executor: str) -> RunLock:
        """Lock each run folder; ``RunBusy`` if one is held (an attempt still alive)."""
        record: dict[str, Any] = {
            "host": socket.gethostname(),
            "executor": executor,
            "orchestrator_pid": os.getpid(),
            "launch_id": launch_id,
            "started_at": now("seconds"),
        }
        taken = cls([], [], record)
        try:
            for run_dir in run_dirs:
                path = RunPaths(run_dir).running
                fd = os.open(
                    path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666
                )  # the umask decides
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError as exc:
                    holder = _record(fd, run_dir)
                    os.close(fd)
                    if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                        raise RunBusy(busy_line(holder)) from None
                    raise
                taken._fds.append(fd)
                taken._paths.append(path)
                taken._write(fd)
        except BaseException:
            taken.close()
            raise
        return taken

    @property
    def fds(self) -> tuple[int, ...]:
        """The open lock files, for the launcher to inherit (``pass_fds``)."""
        return tuple(self._fds)

    def launched(self, pid: int) -> None:
        """Record the launcher's pid (its process group's id)."""
        self._record["launcher_pid"] = pid
        for fd in self._fds:
            self._write(fd)

    def _write(self, fd: int) -> None:
        # in place: a new file (an atomic rename) would be another, unlocked, inode
        data = json.dumps(self._record, sort_keys=True).encode()
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, data + b"\n", 0)
        except OSError:
            pass  # the lock holds without its record; a full disk must not stop the run

    def close(self) -> None:
        """Remove the lock files and let go of them (the job is over)."""
        for path in self._paths:
            with suppress(OSError):
                path.unlink()
        for fd in self._fds:
            os.close(fd)
        self._fds, self._paths = [], []


def holder(run_dir: Path) -> Holder | None:
    """The attempt holding ``run_dir``'s lock; None when none does (a leftover lock file
    of an attempt that is over is removed)."""
    path = RunPaths(run_dir).running
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                return _record(fd, run_dir)
            raise
        with suppress(OSError):
            path.unlink()  # nobody holds it: the attempt it names is over
        return None
    finally:
        os.close(fd)


def processes_of(launch_id: str) -> list[int]:
    """The pids of this host's processes whose environment names ``launch_id`` (the
    launcher and every rank: they inherit it), other than this one."""
    needle = f"{LAUNCH_ID_ENV}={launch_id}".encode()
    found = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = f.read()
        except OSError:
            continue
        if needle in environ.split(b"\0"):
            found.append(int(entry))
    return sorted(found)


def busy_line(found: Holder, pids: Sequence[int] = (), why: str = "") -> str:
    eid = found.run_dir.name
    return (
        f"{eid}: an earlier attempt is still running ({found.describe(pids)})"
        f"{'; ' + why if why else ''}; stop it, or wait for it to end, then run again"
    )


def _signal(pids: Sequence[int], sig: int) -> None:
    for pid in pids:
        with suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def _wait_gone(run_dir: Path, launch_id: str | None, seconds: float) -> bool:
    """Whether, within ``seconds``, the lock is free and no process of the launch is left."""
    deadline = time.monotonic() + seconds
    while True:
        if holder(run_dir) is None and not (launch_id and processes_of(launch_id)):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)


def stop_earlier(run_dir: Path, grace_s: float, say: Callable[[str], None]) -> None:
    """Make sure no earlier attempt of this run is alive before it is launched again.

    An attempt alive on this host, launched here (local or packed), is stopped: SIGTERM
    to each process carrying its launch id, ``grace_s`` for them to end, SIGKILL, and
    its lock must be free by then. Raises ``RunBusy`` (one line naming the holder) for
    one elsewhere, under a scheduler, or one that cannot be stopped.
    """
    found = holder(run_dir)
    if found is None:
        return
    if found.host is not None and found.host != socket.gethostname():
        raise RunBusy(busy_line(found, why=f"on another host ({found.host})"))
    if found.executor not in (None, "local", "packed"):
        raise RunBusy(busy_line(found, why=f"a {found.executor} job: cancel it there"))
    pids = processes_of(found.launch_id) if found.launch_id else []
    if not pids:
        raise RunBusy(busy_line(found, why="no process of its launch is visible here"))
    say(f"{run_dir.name}: stopping an earlier attempt still running ({found.describe(pids)})")
    _signal(pids, signal.SIGTERM)
    if _wait_gone(run_dir, found.launch_id, grace_s):
        return
    _signal(processes_of(found.launch_id or "") or pids, signal.SIGKILL)
    if not _wait_gone(run_dir, found.launch_id, KILL_WAIT_S):
        left = processes_of(found.launch_id or "")
        raise RunBusy(busy_line(found, left, why="it did not end when killed"))
