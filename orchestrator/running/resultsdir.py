"""Opening a results folder for a run: a lock, and nothing of an earlier run lost.

- A lock file (``RESULT_DIR/.lock``, ``flock``) keeps two orchestrators from
  writing one folder; the second gets a one-line error naming the first.
- Without resume, the outputs of an earlier run are moved aside to
  ``RESULT_DIR.<timestamp>/`` before anything is written, never deleted:
  the tables, ``runs/`` and the logs executors keep of their jobs (such as
  ``<executor>/<job id>/``), so the moved outcomes' logs move with them. The
  prepared-data cache (``data/``) and the history of runs (``history.sqlite``)
  stay, since later runs use them, and so do dotfiles such as ``.gitkeep``.
- Before they are moved, a job of the earlier run still alive (its run folder's
  ``running.lock`` held) is stopped, or the run refused (``runlock.stop_earlier``):
  moved away, it would train on beside the new run.
- A folder that is not empty but holds no tunematrix outputs (``--results .``
  by mistake, say) is refused rather than reorganised.
"""

from __future__ import annotations

import errno
import fcntl
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from orchestrator.contract.errors import UserError
from orchestrator.contract.layout import ResultsLayout
from orchestrator.job import runlock
from orchestrator.job.execute import GRACE_S

#: What a run writes at the top of its folder (the data cache stays put).
RUN_OUTPUTS = tuple(path.name for path in ResultsLayout(Path()).run_outputs)
#: kept in place across runs: the prepared-data cache and the history of runs
KEEP = tuple(path.name for path in ResultsLayout(Path()).kept)


@dataclass(frozen=True)
class OpenedResults:
    layout: ResultsLayout
    #: where an earlier run's outputs went, if they were moved
    moved_to: Path | None


def _entries(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if not p.name.startswith("."))


def _lock(path: Path) -> int:
    # 0o666: the user's umask decides, as for any new file
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        holder = ""
        with suppress(OSError):
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip()
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            by = f" (pid {holder})" if holder else ""
            raise UserError(
                f"results folder {path.parent} is in use by another tunematrix run{by}; "
                "wait for it or choose another --results"
            ) from None
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    return fd


def _aside_name(root: Path) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    candidate = root.with_name(f"{root.name}.{stamp}")
    n = 1
    while candidate.exists():
        candidate = root.with_name(f"{root.name}.{stamp}-{n}")
        n += 1
    return candidate


def run_outputs(layout: ResultsLayout) -> tuple[str, ...]:
    """Everything a run writes at the top of its folder: ``RUN_OUTPUTS`` and the
    folders where executors keep logs of their jobs."""
    from orchestrator.executors.registry import log_folders

    return (*RUN_OUTPUTS, *log_folders(layout))


def move_aside(root: Path) -> Path | None:
    """Move an earlier run's outputs to ``root.<timestamp>/``; None if there were none."""
    present = [name for name in run_outputs(ResultsLayout(root)) if (root / name).exists()]
    if not present:
        return None
    target = _aside_name(root)
    target.mkdir()
    for name in present:
        os.rename(root / name, target / name)
    return target


def stop_earlier_jobs(root: Path, grace_s: float, say: Callable[[str], None]) -> None:
    """Stop any job of an earlier run of ``root`` still alive (``runlock.stop_earlier``),
    before its folders are moved: moved away, it would train on beside the new run."""
    try:
        names = os.listdir(root / "runs")
    except OSError:
        return
    for name in sorted(names):
        runlock.stop_earlier(root / "runs" / name, grace_s, say)


@contextmanager
def open_results(
    root: Path,
    *,
    resume: bool,
    grace_s: float = GRACE_S,
    say: Callable[[str], None] = print,
) -> Iterator[OpenedResults]:
    """Lock ``root`` for a run; without ``resume``, stop what an earlier run left alive
    (``stop_earlier_jobs``; ``say`` says so) and move its outputs aside first."""
    if root.exists() and not root.is_dir():
        raise UserError(f"results folder {root} exists and is not a folder")
    root.mkdir(parents=True, exist_ok=True)
    if not os.access(root, os.W_OK):
        raise UserError(f"results folder {root} is not writable")
    fd = _lock(root / ".lock")
    try:
        entries = _entries(root)
        known = set(run_outputs(ResultsLayout(root))) | set(KEEP)
        if entries and not known & set(entries):
            raise UserError(
                f"results folder {root} is not empty and holds no tunematrix results "
                f"({', '.join(entries[:5])}{', ...' if len(entries) > 5 else ''}); "
                "choose an empty or new folder"
            )
        if not resume:  # a resumed run checks each cell before it launches it
            stop_earlier_jobs(root, grace_s, say)
        moved = None if resume else move_aside(root)
        yield OpenedResults(layout=ResultsLayout(root), moved_to=moved)
    finally:
        os.close(fd)
