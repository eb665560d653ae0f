"""A cgroup v1 memory cgroup for the tests: a real kernel OOM kill, as on a SLURM node.

``memory_cgroup`` creates one with a memory limit, skips the test where it
cannot (not root, no v1 memory controller), and afterwards kills whatever
still runs in it and removes it. ``joining`` is the ``preexec_fn`` that puts a
started process (the orchestrator, and so its launcher and ranks) into it.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

CGROUP_V1 = Path("/sys/fs/cgroup/memory")


@contextmanager
def memory_cgroup(name: str, limit_bytes: int) -> Iterator[Path]:
    """The cgroup's folder, limited to ``limit_bytes``; removed afterwards."""
    if os.geteuid() != 0 or not (CGROUP_V1 / "cgroup.procs").exists():
        pytest.skip("needs root and the cgroup v1 memory controller at /sys/fs/cgroup/memory")
    folder = CGROUP_V1 / f"tunematrix-{name}-{os.getpid()}"
    try:
        folder.mkdir()
        (folder / "memory.limit_in_bytes").write_text(str(limit_bytes))
    except OSError as exc:
        pytest.skip(f"cannot create a memory cgroup: {exc}")
    try:
        yield folder
    finally:
        for line in (folder / "cgroup.procs").read_text().split():
            try:
                os.kill(int(line), signal.SIGKILL)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 10
        while (folder / "cgroup.procs").read_text().strip() and time.monotonic() < deadline:
            time.sleep(0.1)
        folder.rmdir()


def joining(folder: Path) -> Callable[[], None]:
    """A ``preexec_fn`` that moves the new process into the cgroup ``folder``."""

    def enter() -> None:
        (folder / "cgroup.procs").write_text(str(os.getpid()))

    return enter


def left_in(folder: Path) -> list[int]:
    """The processes still in the cgroup."""
    return [int(p) for p in (folder / "cgroup.procs").read_text().split()]
