"""Every path of a results folder, owned in one place, and safe file writes.

No other module joins result paths from strings: they ask ``ResultsLayout``
(the folder) or ``RunPaths`` (one experiment's folder).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from orchestrator.contract.errors import UserError

#: The project checkout (or install) root, where the shipped configs live.
PROJECT_ROOT = Path(__file__).resolve().parents[2]

_SAFE_COMPONENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def project_pythonpath() -> str:
    """A job's ``PYTHONPATH``: the orchestrator's own import path first, so children run
    this same code, then whatever this process was given."""
    current = os.environ.get("PYTHONPATH")
    return str(PROJECT_ROOT) + (os.pathsep + current if current else "")


def cache_root() -> Path:
    """The user's tunematrix cache, shared by every results folder: ``$TUNEMATRIX_CACHE``,
    else ``$XDG_CACHE_HOME/tunematrix``, else ``~/.cache/tunematrix`` (the tiny models the
    child builds, the check's kept verdicts)."""
    explicit = os.environ.get("TUNEMATRIX_CACHE")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "tunematrix"


def shipped(name: str) -> Path:
    """A config file shipped with tunematrix (``scenarios.yaml``, ``defaults.yaml``, ...)."""
    return PROJECT_ROOT / name


@dataclass(frozen=True)
class NodeFiles:
    """What one node of a job writes into the run folder (the first node: the run's own files)."""

    stdout: Path
    stderr: Path
    memory: Path
    sidecar_log: Path


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

    @property
    def profile(self) -> Path:
        """Where a profiled run writes its traces, one per rank (``profile_trace``)."""
        return self.dir / "profile"

    def profile_trace(self, rank: int) -> Path:
        return profile_trace(self.profile, rank)

    @property
    def outcome(self) -> Path:
        """The parent's record of the run (``orchestrator.contract.outcome``)."""
        return self.dir / "outcome.json"

    @property
    def sidecar_log(self) -> Path:
        return self.dir / "sidecar.log"

    @property
    def running(self) -> Path:
        """Locked while a job of this run is alive; says which (``orchestrator.job.runlock``)."""
        return self.dir / "running.lock"

    @property
    def attempts(self) -> Path:
        """Where the files of earlier, unfinished attempts are kept (``attempts/<n>/``)."""
        return self.dir / "attempts"

    def job_record(self, executor: str) -> Path:
        """What an executor that submits jobs keeps of the submission (``<executor>.json``)."""
        return self.dir / self.job_record_name(executor)

    @staticmethod
    def job_record_name(executor: str) -> str:
        """The file name of ``job_record``."""
        return f"{_component(executor)}.json"

    def node(self, rank: int) -> NodeFiles:
        """The files node ``rank`` of a job writes; node 0 writes the run's own."""
        if rank == 0:
            return NodeFiles(self.stdout, self.stderr, self.memory, self.sidecar_log)
        suffix = f".node{rank}"
        return NodeFiles(
            self.dir / f"stdout{suffix}.log",
            self.dir / f"stderr{suffix}.log",
            self.dir / f"memory{suffix}.csv",
            self.dir / f"sidecar{suffix}.log",
        )


@dataclass(frozen=True)
class ResultsLayout:
    """The layout of a results folder: every path a run, report or compare reads or writes."""

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

    @property
    def history(self) -> Path:
        """The history of runs into this folder (kept when a run is moved aside)."""
        return self.root / "history.sqlite"

    @property
    def scaling_csv(self) -> Path:
        return self.root / "scaling.csv"

    @property
    def compare_csv(self) -> Path:
        return self.root / "compare.csv"

    @property
    def compare_md(self) -> Path:
        return self.root / "compare.md"

    @property
    def fit(self) -> Path:
        """Where ``tunematrix run`` puts the search of its scenarios with ``search:``."""
        return self.root / "fit"

    @property
    def fit_json(self) -> Path:
        """A fit's answer per search (``tunematrix fit``), with its probes."""
        return self.root / "fit.json"

    @property
    def fit_md(self) -> Path:
        return self.root / "fit.md"

    @property
    def cooldown(self) -> Path:
        """Each GPU's temperature before the first launch that used it (``--cool-down``):
        later launches wait until their GPUs are back near theirs."""
        return self.root / "cooldown.json"

    @property
    def run_outputs(self) -> tuple[Path, ...]:
        """What a run and its report write at the top of the folder (executor logs aside)."""
        return (
            self.env,
            self.plan_csv,
            self.raw_summary,
            self.benchmarks,
            self.summary_md,
            self.plots,
            self.runs,
            self.launches,
            self.scaling_csv,
            self.compare_csv,
            self.compare_md,
            self.fit,
            self.fit_json,
            self.fit_md,
            self.cooldown,
        )

    @property
    def kept(self) -> tuple[Path, ...]:
        """What stays when a run is moved aside: the prepared-data cache and the history."""
        return (self.data, self.history)

    @property
    def launches(self) -> Path:
        """Where launches shared by several experiments keep their own files
        (``--launch family``: ``launches/<launch_id>/``)."""
        return self.root / "launches"

    def launch(self, launch_id: str) -> NodeFiles:
        """The whole output of one shared launch: its logs, the sidecar's samples and
        log (each experiment of it gets its own slice in its run folder)."""
        folder = self.launches / _component(launch_id)
        return NodeFiles(
            folder / "stdout.log",
            folder / "stderr.log",
            folder / "memory.csv",
            folder / "sidecar.log",
        )

    def run(self, experiment_id: str) -> RunPaths:
        """The folder of one experiment; the id must be a single safe path component."""
        if not _SAFE_COMPONENT.match(experiment_id) or ".." in experiment_id:
            raise UserError(f"experiment id {experiment_id!r} is not a safe folder name")
        return RunPaths(self.runs / experiment_id)

    def run_folders(self) -> list[RunPaths]:
        """Every experiment folder under ``runs/``, in name order."""
        return [RunPaths(self.runs / name) for name in self.run_names()]

    def run_names(self) -> list[str]:
        """The names of the experiment folders under ``runs/``, in order."""
        try:
            with os.scandir(self.runs) as entries:
                return sorted(e.name for e in entries if e.is_dir())
        except (FileNotFoundError, NotADirectoryError):
            return []

    def executor_logs(self, executor: str) -> Path:
        """The folder where an executor keeps logs of its own (``<executor>/``)."""
        return self.root / _component(executor)

    def job_logs(self, executor: str, job_id: str) -> Path:
        """The logs of one of an executor's jobs (``<executor>/<job_id>/``).

        ``job_id`` may be a placeholder the executor fills in (``%j``).
        """
        return self.executor_logs(executor) / job_id

    def relative(self, path: Path) -> str:
        """A path inside the folder, relative to it (the folder may move); others as they are."""
        try:
            return str(path.relative_to(self.root))
        except ValueError:
            return str(path)


def profile_trace(folder: Path, rank: int) -> Path:
    """Rank ``rank``'s Chrome/Perfetto trace in a run's profile folder."""
    return folder / f"rank{int(rank)}.json"


def _component(name: str) -> str:
    if not _SAFE_COMPONENT.match(name) or ".." in name:
        raise UserError(f"{name!r} is not a safe folder name")
    return name


def umask() -> int:
    """The process's umask: from ``/proc`` where it can, else set and put back at once."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    current = os.umask(0o022)
    os.umask(current)
    return current


def file_mode(*, executable: bool = False) -> int:
    """The mode a new file gets under the user's umask (``0o644`` under ``0o022``)."""
    return (0o777 if executable else 0o666) & ~umask()


def nearest_existing(path: Path) -> Path:
    """``path``, or its nearest parent that exists (a results folder not made yet)."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def free_bytes(path: Path) -> int | None:
    """The bytes a user may still write on ``path``'s file system (its nearest existing
    parent's); None where that cannot be read."""
    try:
        return shutil.disk_usage(nearest_existing(path)).free
    except OSError:
        return None


def write_atomic(path: Path, text: str, *, executable: bool = False) -> None:
    """Write ``text`` to ``path`` so that readers see the old file or the new one, whole.

    The file gets the mode the user's umask gives a new file (the temporary
    file it is renamed from is created private; teammates must read results).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, file_mode(executable=executable))
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
