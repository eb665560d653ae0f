"""The executor protocol: what every way of running a plan's experiments declares and does.

An executor is one subclass of ``Executor`` plus one line in
``orchestrator.executors.registry``. It declares

- its command-line flags (``add_flags``), whether they choose it without
  ``--executor`` (``chosen_by``), and what they refuse (``check_flags``);
- its own typed section of the scenarios file (``section``: a pydantic model
  deriving from ``ExecutorSection``, under the executor's name), and how the
  flags and the section make an executor (``from_args``);
- the packages it needs besides the training stack (``needs``);
- its checks before anything is written or submitted (``check``), and what
  ``tunematrix doctor`` shows about this machine for it (``probe``, ``readiness``);
- how it runs a plan's experiments (``run``, given a ``RunContext``); each
  experiment itself runs through ``orchestrator.job.execute.run_experiment``;
- how it collects its jobs that ended after the run returned (``settle``).

Nothing outside an executor's own module branches on its name.
"""

from __future__ import annotations

import argparse
import errno
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Protocol

from pydantic import BaseModel, ConfigDict

from orchestrator.contract.errors import UserError
from orchestrator.contract.layout import ResultsLayout, RunPaths
from orchestrator.contract.outcome import (
    ACCEPTABLE,
    Outcome,
    Skip,
    read_outcome,
    skipped,
    write_outcome,
)
from orchestrator.contract.result import read_result
from orchestrator.executors.console import Progress
from orchestrator.job import runlock
from orchestrator.job.attempts import keep_previous_attempt
from orchestrator.job.classify import write_failure
from orchestrator.job.execute import RunOptions, timeout_for
from orchestrator.matrix import prune
from orchestrator.matrix.expand import Plan
from orchestrator.matrix.experiment import Experiment


@dataclass(frozen=True)
class Need:
    """A package an executor (or the matrix) needs installed, and how to install it."""

    #: the module to import
    module: str
    #: who needs it, for the message
    why: str
    #: how to install it
    install: str
    #: where an ``environments:`` entry's interpreter needs it: the versions its probe
    #: found (None: this interpreter, looked up with ``find``)
    versions: Mapping[str, str | None] | None = field(default=None, compare=False)


class ExecutorSection(BaseModel):
    """An executor's section of the scenarios file: unknown keys and loose types are errors."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class Flags(Protocol):
    """Where an executor adds its flags (an argparse argument group)."""

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action: ...


@dataclass(frozen=True)
class Ready:
    """An experiment to run: its folder, and which attempt this is."""

    experiment: Experiment
    run: RunPaths
    attempt: int


@dataclass(frozen=True)
class Preflight:
    """What an executor's checks before a run look at."""

    experiments: Sequence[Experiment]
    layout: ResultsLayout
    options: RunOptions
    #: how long an earlier ok run of an experiment's cell took (the folder's history)
    expected_s: Callable[[Experiment], float | None] = lambda experiment: None

    def timeout_s(self, experiment: Experiment) -> float:
        """The experiment's own time limit (``orchestrator.job.execute.timeout_for``)."""
        return timeout_for(experiment, self.options)


@dataclass(frozen=True)
class Settled:
    """What ``settle`` did with the jobs of an earlier run that had not ended then."""

    #: jobs that had ended and now have their outcome
    collected: int
    #: ids of the jobs still queued or running
    running: list[str]
    #: what messages call one job ("batch job")
    noun: str
    #: how a user stops the running ones ("cancel them")
    cancel: str


State = Literal["ok", "miss", "bad", "warn", "info"]


@dataclass(frozen=True)
class Readiness:
    """What ``tunematrix doctor`` says of an executor on this machine."""

    #: its line: ok, warn or info, and what was found
    state: State
    detail: str
    #: what it lacks here to be usable, besides its packages
    lacks: tuple[str, ...] = ()
    #: this is a machine it runs from: a missing package of it is a miss, not information
    present: bool = False


class RunContext:
    """What an executor gets to run a plan: the plan, the results folder, the options,
    the progress display, and where outcomes go.

    ``record`` keeps an experiment's outcome, updates the progress and calls
    ``on_record`` (the runner rewrites ``raw_summary.csv`` there), so an
    interrupted run keeps everything it finished.
    """

    def __init__(
        self,
        plan: Plan,
        layout: ResultsLayout,
        options: RunOptions,
        progress: Progress,
        say: Callable[[str], None],
        *,
        on_record: Callable[[Mapping[str, Outcome]], None] = lambda outcomes: None,
        signals: Sequence[int] = (),
    ) -> None:
        self.plan = plan
        self.layout = layout
        self.options = options
        self.progress = progress
        self.say = say
        self.outcomes: dict[str, Outcome] = {}
        self._on_record = on_record
        self._signals = signals
        #: the experiments that ran out of memory in this run, as pruning sees them
        self._out_of_memory: list[prune.Footprint] = []
        #: and those that ran ok: an ok run at least as large contradicts an OOM
        self._fitted: list[prune.Footprint] = []
        #: per kind of cell (``_alike``), its cells that failed in this run: cell id ->
        #: (the first failed experiment's id, its error as compared, ``same_error``); two
        #: cells failed alike spare the others
        self._failed: dict[tuple[str, ...], dict[str, tuple[str, str]]] = {}
        #: the first experiment of this run that failed for a full disk, and the folder its
        #: error names: every later one would fail alike, whatever its model
        self._disk_full: tuple[str, str | None] | None = None
        #: the summary could not be rewritten for a full disk (said once)
        self._summary_unwritten = False
        self._planned = {e.experiment_id: e for e in plan.experiments}

    @property
    def stopping(self) -> bool:
        """A signal asked the run to stop (the job it stopped has recorded its outcome)."""
        return bool(self._signals)

    def prepare(self, experiment: Experiment, gpus: int | None = None) -> Ready | None:
        """The experiment, ready to run; None when it gets an outcome without running.

        With ``resume``, an experiment already ok is ``skipped`` (its earlier
        figures kept). The files of an earlier, unfinished attempt go to
        ``attempts/<n>/``. ``gpus``: how many GPUs the executor can hand out
        (None: it does not count them here); an experiment needing more is
        ``failed`` without running. With ``prune``, an experiment that needs at least
        the memory of one that ran out of memory in this run
        (``orchestrator.matrix.prune``) is ``skipped`` as pruned, with only its
        ``outcome.json``; with ``stop_early``, one like two cells that already failed
        with the same error in this run (``failed_alike``) is ``skipped`` as not
        launched. A resumed run decides both afresh.
        """
        eid = experiment.experiment_id
        run = self.layout.run(eid)
        # never a second copy beside an earlier attempt still alive: stopped, or refused
        runlock.stop_earlier(run.dir, self.options.grace_s, self.say)
        if self.options.resume:
            skipped = _skipped(run, self.layout)
            if skipped is not None:
                self.record(eid, skipped, counted=False)
                return None
        _drop_unlaunched_record(run)
        attempt = 1
        kept = keep_previous_attempt(run.dir)
        if kept is not None:
            attempt = int(kept.name) + 1
        ready = Ready(experiment=experiment, run=run, attempt=attempt)
        # a cell certain not to fit (pruned) is not launched on any machine: said first
        if self.skipped_unlaunched(ready):
            return None
        if gpus is not None and experiment.device == "gpu" and experiment.num_gpus > gpus:
            outcome = Outcome(
                status="failed",
                error=f"needs {experiment.num_gpus} GPU(s); {gpus} visible to the orchestrator",
                attempt=attempt,
            )
            run.dir.mkdir(parents=True, exist_ok=True)
            write_outcome(run, outcome)
            self.record(eid, outcome, counted=False)
            return None
        return ready

    def skipped_unlaunched(self, ready: Ready) -> bool:
        """Record ``ready`` as ``skipped`` without launching it, and say so, when this run
        already shows it need not run: pruned (``prune``: a cell of its ladder that needs
        no more memory ran out of it, or its predicted memory is over the device's) or spared
        (``stop_early``: the disk was full when an experiment of this run ran, or
        ``failed_alike``).

        ``prepare`` asks it; an executor that prepares everything before launching
        anything (``--pack``) asks again just before it launches each one.
        """
        experiment = ready.experiment
        culprit = (
            prune.pruned_by(prune.footprint(experiment), self._out_of_memory, self._fitted)
            if self.options.prune and self._out_of_memory
            else None
        )
        skip = Skip(cause="out_of_memory", follows=culprit) if culprit is not None else None
        if skip is None and self.options.prune:
            skip = predicted_over(experiment)
        if skip is None and self.options.stop_early and self._disk_full is not None:
            first_id, folder = self._disk_full
            skip = Skip(cause="disk_full", follows=first_id, detail=folder)
        first = self.failed_alike(experiment) if skip is None and self.options.stop_early else None
        if first is not None:
            skip = Skip(cause="same_error", follows=first)
        if skip is None:
            return False
        outcome = skipped(skip, attempt=ready.attempt)
        try:
            ready.run.dir.mkdir(parents=True, exist_ok=True)
            write_outcome(ready.run, outcome)
        except OSError as exc:  # a full disk: the record is kept in this run's summary only
            if exc.errno != errno.ENOSPC:
                raise
        self.record(experiment.experiment_id, outcome, counted=False)
        return True

    def failed_alike(self, experiment: Experiment) -> str | None:
        """The first of two cells like ``experiment``'s (same model, trainer, framework
        and interpreter) that failed with the same error in this run, or None: with
        ``stop_early`` the others would fail the same way, so they are not launched.

        Two repeats of one cell count once; a failure that may be memory or says nothing
        (``Outcome.failure``: ``unexplained``) never counts."""
        failures = self._failed.get(_alike(experiment), {})
        seen: dict[str, str] = {}
        for first, error in failures.values():
            if error in seen:
                return seen[error]
            seen[error] = first
        return None

    def record(self, eid: str, outcome: Outcome, counted: bool = True) -> None:
        """Keep an experiment's outcome; ``counted``: it ran (for the progress and ETA).

        The first failure for a full disk (``Outcome.failure``) spares every experiment
        after it, with ``stop_early``; a summary that cannot be rewritten for a full disk
        is said once, and the run goes on."""
        self.outcomes[eid] = outcome
        failure = outcome.failure if outcome.status == "failed" else None
        if failure is not None and failure.cause == "disk_full":
            if self._disk_full is None:
                self._disk_full = (eid, failure.folder)
        elif outcome.status == "oom" and eid in self._planned:
            self._out_of_memory.append(prune.footprint(self._planned[eid]))
        elif outcome.status == "ok" and eid in self._planned:
            self._fitted.append(prune.footprint(self._planned[eid]))
        elif outcome.status == "failed" and counted and eid in self._planned:
            experiment = self._planned[eid]
            # an error that says why (not a SIGKILL of unknown cause, not silence)
            if outcome.error and failure is None:
                self._failed.setdefault(_alike(experiment), {}).setdefault(
                    experiment.cell_id, (eid, same_error(outcome.error, experiment))
                )
        note = outcome.error or ("already ok" if outcome.status == "skipped" else "")
        self.progress.finish(eid, outcome.status, outcome.wall_s or 0.0, note, counted=counted)
        try:
            self._on_record(self.outcomes)
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
            if not self._summary_unwritten:
                self._summary_unwritten = True
                self.say(f"the summary could not be rewritten: {exc.strerror} ({self.layout.root})")

    def settled(self, ready: Ready, launched: Callable[[], Outcome]) -> Outcome:
        """``launched()``'s outcome of ``ready`` (a run, or a packed job's result); one
        whose own files could not be written for a full disk is ``failed`` as such
        (``write_failed``) rather than an end to the whole run."""
        try:
            return launched()
        except OSError as exc:
            outcome = self.write_failed(ready, exc)
            if outcome is None:
                raise
            return outcome

    def write_failed(self, ready: Ready, exc: OSError) -> Outcome | None:
        """The outcome of ``ready`` when writing its own files (spec, command, outcome)
        raised ``exc`` for a full disk: ``failed``, disk full, written where it still can
        be (``record`` it); None when ``exc`` is another error (raise it)."""
        verdict = write_failure(exc, ready.run.dir)
        if verdict is None:
            return None
        outcome = Outcome(
            status=verdict.status,
            error=verdict.error,
            failure=verdict.failure,
            attempt=ready.attempt,
        )
        with suppress(OSError):
            write_outcome(ready.run, outcome)
        return outcome

    def stop_after_failure(self, eid: str) -> bool:
        """With ``fail_fast``, after a failure: fill in the rest as not run and say stop."""
        if self.options.fail_fast and self.outcomes[eid].status not in ACCEPTABLE:
            self.say(f"stopping: --fail-fast and {eid} ended {self.outcomes[eid].status}")
            self.fill(f"not run: --fail-fast stopped after {eid}")
            return True
        return False

    def fill(self, why: str) -> None:
        """Every experiment without an outcome yet is ``interrupted``, for ``why``."""
        for e in self.plan.experiments:
            self.outcomes.setdefault(e.experiment_id, Outcome(status="interrupted", error=why))


def _alike(experiment: Experiment) -> tuple[str, ...]:
    """What failures are compared within: one model, trained by one trainer under one
    framework and interpreter (an error of TRL's or of FSDP's spares no other cell)."""
    env = experiment.environment
    return (
        experiment.model_name_or_path,
        experiment.trainer,
        experiment.framework,
        env.name if env is not None else "",
    )


#: what differs between two reports of one error: memory addresses
_ADDRESSES = re.compile(r"0x[0-9a-fA-F]+")


def same_error(error: str | None, experiment: Experiment) -> str:
    """``error`` as compared between experiments: its experiment's own ids and memory
    addresses taken out, so the same fault in two cells reads the same."""
    text = (error or "no error recorded").replace(experiment.experiment_id, "<experiment>")
    text = text.replace(experiment.cell_id, "<experiment>")
    return _ADDRESSES.sub("0x…", text)


def _drop_unlaunched_record(run: RunPaths) -> None:
    """Remove the record of an earlier pruning or sparing (a folder with only that
    ``outcome.json``): nothing ran, so it is no attempt to keep."""
    previous = read_outcome(run)
    if previous is None or previous.skip is None:
        return
    if [p.name for p in run.dir.iterdir()] == [run.outcome.name]:
        run.outcome.unlink()


def predicted_over(experiment: Experiment) -> Skip | None:
    """Why an experiment predicted to need more memory than its device has is pruned
    (``orchestrator.running.memoryfit``); None when it is not."""
    memory = experiment.memory
    if memory is None or not memory.prunes or not memory.capacity_bytes:
        return None
    return Skip(
        cause="predicted_over", detail=memory.prediction.pruned_reason(memory.capacity_bytes)
    )


def _skipped(run: RunPaths, layout: ResultsLayout) -> Outcome | None:
    """The outcome of an experiment already ok (result and outcome), kept on resume."""
    result = read_result(run.result)
    previous = read_outcome(run)
    if not (result and result.get("status") == "ok" and previous and previous.status == "ok"):
        return None
    return previous.model_copy(
        update={"status": "skipped", "error": None, "log": layout.relative(run.stderr)}
    )


class Executor(ABC):
    """One way of running a plan's experiments (see the module's docstring)."""

    #: what ``--executor`` takes, the key of its scenarios file section, and the
    #: ``executor`` of its outcomes
    name: ClassVar[str]
    #: how messages name it ("local", "packed")
    title: ClassVar[str]
    #: what it does, for ``--executor``'s help
    summary: ClassVar[str]
    #: the title of its flags' group in ``run --help`` (None: the general "how to run" group)
    flags_title: ClassVar[str | None] = None
    #: command lines for ``run --help``'s examples
    examples: ClassVar[tuple[str, ...]] = ()
    #: its section of the scenarios file (None: it has none)
    section: ClassVar[type[ExecutorSection] | None] = None
    #: packages it needs besides the training stack
    needs: ClassVar[tuple[Need, ...]] = ()
    #: it keeps logs of its own in the results folder (``ResultsLayout.executor_logs``),
    #: which move aside with the rest of a run
    keeps_logs: ClassVar[bool] = False
    #: how ``env.json`` names the way jobs ran: ``exclusive`` (one at a time) or ``packed``
    mode: ClassVar[str] = "exclusive"
    #: prefixes of the environment variables it sets in a job, recorded in ``env.json``
    env_prefixes: ClassVar[tuple[str, ...]] = ()
    #: it runs a family's experiments in one launch when asked (``--launch family``)
    shares_launches: ClassVar[bool] = False
    #: its jobs run on this machine, whose GPUs ``--cool-down`` reads before each launch
    runs_here: ClassVar[bool] = False

    # -- the command line and the scenarios file --------------------------------

    @classmethod
    def add_flags(cls, flags: Flags) -> None:
        """Add the executor's own flags to the ``run`` command."""
        return None

    @classmethod
    def chosen_by(cls, args: argparse.Namespace) -> bool:
        """Whether its own flags choose it when ``--executor`` is left at its default."""
        return False

    @classmethod
    def check_flags(
        cls, args: argparse.Namespace, chosen: type[Executor], given: Sequence[str]
    ) -> None:
        """Refuse its flags (``given``: those set, as typed) where they mean nothing.

        Called for every executor, whichever is ``chosen``.
        """
        if given and chosen is not cls:
            raise UserError(f"{', '.join(given)}: only with --executor {cls.name}")

    @classmethod
    def from_args(cls, args: argparse.Namespace, section: ExecutorSection | None) -> Executor:
        """The executor the flags and the file's section ask for (flags win)."""
        return cls()

    @classmethod
    def default(cls) -> Executor:
        """The executor with no flags and no section (the Python API's)."""
        return cls()

    # -- before a run -------------------------------------------------------------

    def gpu_counter(self) -> Callable[[], int] | None:
        """How to count the GPUs of one machine its jobs run on, when that is not this one
        (the plan's default GPU counts are capped there); None: this machine's."""
        return None

    def parallel(self, plan: Plan) -> int:
        """How many experiments may run at once (for the progress and ETA)."""
        return 1

    def check(self, preflight: Preflight) -> None:
        """Refuse, in one ``UserError`` line, what would fail after the submission."""
        return None

    # -- the run ------------------------------------------------------------------

    @abstractmethod
    def run(self, ctx: RunContext) -> None:
        """Run every experiment of ``ctx.plan``, recording each outcome with ``ctx.record``.

        Raises ``orchestrator.job.execute.Interrupted`` when a signal stopped
        the run, after stopping (or cancelling) its jobs.
        """

    @classmethod
    def settle(cls, layout: ResultsLayout) -> Settled | None:
        """Give the jobs of an earlier run into ``layout`` that have ended their outcome.

        None when it has nothing of its own to collect.
        """
        return None

    # -- tunematrix doctor --------------------------------------------------------

    @classmethod
    def probe(cls) -> Any:
        """Look at this machine for it (reads only; quick). None: nothing to look at."""
        return None

    @classmethod
    def readiness(cls, probe: Any) -> Readiness | None:
        """What doctor says of it, from ``probe``'s facts (pure). None: no line."""
        return None
