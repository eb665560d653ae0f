"""Every path of a results folder, owned in one place, and safe file writes.

No other module joins result paths from strings: they ask ``ResultsLayout``
(the folder) or ``RunPaths`` (one experiment's folder).
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from orchestrator.contract.errors import UserError

#: The project checkout (or install) root, where the shipped configs live.
PROJECT_ROOT = Path(__file__).resolve().parents[2]

_SAFE_COMPONENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def shipped(name: str) -> Path:
    """A config file shipped with tunematrix (``scenarios.yaml``, ``defaults.yaml``, ...)."""
    return PROJECT_ROOT / name


@dataclass(frozen=True)
class RunPaths:
    """The files of one experiment under ``runs/<experiment_id>/``."""

    dir: Path

    @property
    def spec(self) -> Path:
        return self.dir / "spec.json"

    @property
    def command(self) -> Path:
        return self.dir / "command.sh"

    @property
    def stdout(self) -> Path:
        return self.dir / "stdout.log"

    @property
    def stderr(self) -> Path:
        return self.dir / "stderr.log"

    @property
    def memory(self) -> Path:
        return self.dir / "memory.csv"

    @property
    def result(self) -> Path:
        return self.dir / "result.json"

    @property
    def progress(self) -> Path:
        """Where the child says, while it trains, which step it has reached."""
        return self.dir / "progress.json"

    @property
    def output_dir(self) -> Path:
        """Where the trainer may write its own files (checkpoints are off by default)."""
        return self.dir / "trainer_output"


@dataclass(frozen=True)
class ResultsLayout:
    """The layout of a results folder (see DESIGN.md, "Results folder")."""

    root: Path

    @property
    def env(self) -> Path:
        return self.root / "env.json"

    @property
    def plan_csv(self) -> Path:
        return self.root / "plan.csv"

    @property
    def raw_summary(self) -> Path:
        return self.root / "raw_summary.csv"

    @property
    def benchmarks(self) -> Path:
        return self.root / "benchmarks.csv"

    @property
    def summary_md(self) -> Path:
        return self.root / "summary.md"

    @property
    def plots(self) -> Path:
        return self.root / "plots"

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def runs(self) -> Path:
        return self.root / "runs"

    @property
    def lock(self) -> Path:
        return self.root / ".lock"

    def run(self, experiment_id: str) -> RunPaths:
        """The folder of one experiment; the id must be a single safe path component."""
        if not _SAFE_COMPONENT.match(experiment_id) or ".." in experiment_id:
            raise UserError(f"experiment id {experiment_id!r} is not a safe folder name")
        return RunPaths(self.runs / experiment_id)


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so that readers see the old file or the new one, whole."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
