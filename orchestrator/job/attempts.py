"""A run folder's earlier attempt, kept: its files moved into ``attempts/<n>/``
before the experiment runs again (resume, a retry), never deleted."""

from __future__ import annotations

import shutil
from pathlib import Path

from orchestrator.contract.layout import RunPaths


def previous_attempt_dir(run_dir: Path) -> Path:
    """A fresh ``attempts/<n>`` folder inside a run folder for its earlier files."""
    attempts = RunPaths(run_dir).attempts
    n = 1
    while (attempts / str(n)).exists():
        n += 1
    return attempts / str(n)


def keep_previous_attempt(run_dir: Path) -> Path | None:
    """Move the files of an earlier, unfinished attempt into ``attempts/<n>/``."""
    if not run_dir.is_dir():
        return None
    files = [p for p in run_dir.iterdir() if p != RunPaths(run_dir).attempts]
    if not files:
        return None
    target = previous_attempt_dir(run_dir)
    target.mkdir(parents=True)
    for path in files:
        shutil.move(str(path), target / path.name)
    return target
