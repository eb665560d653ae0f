"""Several experiments of one family in one ``accelerate launch`` (``--launch family``).

The child runs their specs one after another in one process
(``python -m trainer_entry --spec A --spec B ...``): the interpreter, the
imports and the launcher are paid once. The parent watches for each run's
``result.json``: an ``ok`` result ends that experiment and starts the next
one's clock (its time limit, its sidecar window), so each gets its own
outcome, memory figures and logs, as if it had run alone. The launch's whole
output stays in ``launches/<launch_id>/``; each run folder gets its slice
(``orchestrator.contract.launch.split_log``, the sidecar's samples of its time).

A run that does not finish (``failed``, ``oom``, a time limit, Ctrl-C) ends
the launch: its process group is stopped, that experiment gets its outcome
from the evidence as any job would (``classify_run``), and those after it get
none here; the executor launches them afresh or prunes them.
"""

from __future__ import annotations

import csv
import io
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from contextlib import suppress
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from orchestrator.contract.clock import at, now
from orchestrator.contract.launch import split_log
from orchestrator.contract.layout import NodeFiles, ResultsLayout, RunPaths, write_atomic
from orchestrator.contract.outcome import Outcome, write_outcome
from orchestrator.contract.result import launch_result
from orchestrator.job import energy, utilisation
from orchestrator.job.classify import Verdict, classify
from orchestrator.job.command import accelerate_command, launch_argv
from orchestrator.job.execute import (
    Interrupted,
    Launch,
    Placement,
    Ran,
    RunOptions,
    Sidecar,
    child_environment,
    classify_run,
    cooldown_file,
    free_port,
    launch_and_wait,
    launch_overhead,
    timeout_for,
    wants_sidecar,
    write_command_script,
    write_experiment_spec,
)
from orchestrator.job.phases import phase_seconds
from orchestrator.job.sidecar import read_samples, row_figures
from orchestrator.matrix.experiment import Experiment

#: how often the parent looks for a finished run
POLL_S = 0.25
#: the sidecar writes its samples out at least this often: a run's window is read
#: once its last samples are on disk
SAMPLES_FLUSH_S = 1.5


@dataclass(frozen=True)
class Member:
    """An experiment of a shared launch: its folder and which attempt this is."""

    experiment: Experiment
    run: RunPaths
    attempt: int


@dataclass
class _Window:
    """One member's part of the launch: when it started and ended (Unix time)."""

    start_unix: float
    start_mono: float
    end_unix: float | None = None


def run_shared(
    members: Sequence[Member],
    layout: ResultsLayout,
    options: RunOptions,
    placement: Placement,
    *,
    on_begin: Callable[[Member], None] = lambda member: None,
    on_done: Callable[[Member, Outcome], None] = lambda member, outcome: None,
    on_tick: Callable[[], None] = lambda: None,
    stop: threading.Event | None = None,
) -> list[Member]:
    """Run ``members`` (two or more, one family, in order) in one launch.

    ``on_begin`` and ``on_done`` are called as each one starts and gets its outcome
    (written to its ``outcome.json`` first). Returns the members that did not run,
    after one that did not finish, with nothing of this launch left in their folders. Raises
    ``Interrupted`` after Ctrl-C (or ``stop``), once the launch is stopped and the
    member it stopped has its outcome. Never leaves a process behind.
    """
    launch_id = placement.launch_id or uuid.uuid4().hex
    files = layout.launch(launch_id)
    files.stdout.parent.mkdir(parents=True, exist_ok=True)
    first = members[0].experiment
    for member in members:
        member.run.dir.mkdir(parents=True, exist_ok=True)
        write_experiment_spec(member.experiment, member.run, layout, options)
        member.run.progress.unlink(missing_ok=True)
    port = placement.port or free_port()
    argv = launch_argv(
        first,
        members[0].run.spec.resolve(),
        port=port,
        accelerate=accelerate_command(first.python),
        later_specs=[m.run.spec.resolve() for m in members[1:]],
    )
    overlay, env = child_environment(
        first, placement.devices, cpu_share=placement.cpu_share, launch_id=launch_id
    )
    write_command_script(files.stdout.parent / "command.sh", overlay, argv, Path.cwd())
    for member in members:  # each one's own command, to re-run it alone by hand
        alone = launch_argv(
            member.experiment,
            member.run.spec.resolve(),
            port=port,
            accelerate=accelerate_command(member.experiment.python),
        )
        write_command_script(member.run.command, overlay, alone, Path.cwd())
    watcher = _Watcher(members, layout, options, placement, files, launch_id, on_begin, on_done)
    launch = Launch(
        argv=argv,
        env=env,
        files=files,
        primary=True,
        timeout_s=timeout_for(first, options),
        launch_id=launch_id,
        cooldown=cooldown_file(layout, options),
        runs=tuple(member.run.dir for member in members),
        executor=placement.executor,
    )
    watcher.launch(launch, on_tick, stop)
    return list(members[watcher.current + 1 :])


class _Watcher:
    """One shared launch from start to end (``run_shared``)."""

    def __init__(
        self,
        members: Sequence[Member],
        layout: ResultsLayout,
        options: RunOptions,
        placement: Placement,
        files: NodeFiles,
        launch_id: str,
        on_begin: Callable[[Member], None],
        on_done: Callable[[Member, Outcome], None],
    ) -> None:
        self.members = list(members)
        self.layout = layout
        self.options = options
        self.placement = placement
        self.files = files
        self.launch_id = launch_id
        self.on_begin = on_begin
        self.on_done = on_done
        self.windows: list[_Window] = []
        #: the member running now; once the launch ended, the last one it ran
        self.current = 0
        #: members whose result is in, waiting for their last samples to be written
        self.settling: list[int] = []
        #: members with their outcome written (the first ones), and those said to begin:
        #: a member is said to begin once those before it are said to end
        self.written = 0
        self.announced = 0
        self.overhead: float | None = None
        self.ran = Ran(started_at=now("milliseconds"))  # launch_and_wait's, once it starts
        self.prepared: Launch | None = None

    # -- the launch ----------------------------------------------------------------

    def launch(
        self,
        launch: Launch,
        on_tick: Callable[[], None],
        stop: threading.Event | None,
    ) -> None:
        """Start it (``launch_and_wait``, whose ``finally`` stops it), watch it, then give
        the members it ran their outcomes; ``Interrupted`` after Ctrl-C or ``stop``."""
        self.prepared = launch

        def watch(ran: Ran) -> None:
            self.ran = ran
            assert ran.proc is not None and ran.launched_unix is not None
            self._begin(ran.launched_unix, time.monotonic() - (time.time() - ran.launched_unix))
            self._wait(ran.proc, on_tick, stop)

        self.ran = launch_and_wait(
            launch, self.options, self.placement.devices, stop=stop, on_tick=on_tick, wait=watch
        )
        self._end()
        if self.ran.interrupted:
            raise Interrupted("stopped")

    def _wait(
        self,
        proc: subprocess.Popen[Any],
        on_tick: Callable[[], None],
        stop: threading.Event | None,
    ) -> None:
        """Until the launch exits, a member runs out of time, or ``stop``."""
        while True:
            deadline = self._deadline()
            try:
                proc.wait(timeout=max(0.0, min(POLL_S, deadline - time.monotonic())))
                return
            except subprocess.TimeoutExpired:
                pass
            self._advance()
            self._settle()
            if time.monotonic() >= self._deadline():
                self.ran.timed_out = True
                return
            if stop is not None and stop.is_set():
                self.ran.interrupted = True
                return
            on_tick()

    def _deadline(self) -> float:
        member = self.members[min(self.current, len(self.members) - 1)]
        return self.windows[-1].start_mono + timeout_for(member.experiment, self.options)

    def _begin(self, start_unix: float, start_mono: float) -> None:
        self.windows.append(_Window(start_unix, start_mono))
        self._announce()

    def _announce(self) -> None:
        """``on_begin`` for the members that began, each once those before it ended: the
        next run starts before the last one's samples are in, its line comes after."""
        while self.announced < len(self.windows) and self.announced <= self.written:
            self.on_begin(self.members[self.announced])
            self.announced += 1

    def _advance(self) -> None:
        """Members whose ok result is in end (all but the last: the launch's exit code
        decides it), and the next one begins."""
        while self.current < len(self.members) - 1:
            result_path = self.members[self.current].run.result
            result = launch_result(result_path, self.launch_id)
            if not result or result.get("status") != "ok":
                break
            end_unix = result_path.stat().st_mtime
            self.windows[-1].end_unix = end_unix
            self.settling.append(self.current)
            self.current += 1
            self._begin(end_unix, time.monotonic() - max(0.0, time.time() - end_unix))

    def _settle(self, *, now_all: bool = False) -> None:
        """The outcomes of the members that ended, once their samples are on disk
        (``now_all``: the sidecar has stopped, so they all are)."""
        while self.settling and (
            now_all
            or time.time() >= (self.windows[self.settling[0]].end_unix or 0) + SAMPLES_FLUSH_S
        ):
            self._finish_ok(self.settling.pop(0))

    # -- outcomes --------------------------------------------------------------------

    def _finish_ok(self, index: int) -> None:
        """The outcome of a member that finished while the launch went on."""
        member, window = self.members[index], self.windows[index]
        assert window.end_unix is not None
        result = launch_result(member.run.result, self.launch_id)
        verdict = classify(returncode=0, result=result)
        outcome = self._outcome(index, verdict, returncode=0)
        self._slices(index, window.start_unix, window.end_unix, outcome)
        self._write(index, outcome)

    def _end(self) -> None:
        """After the launch: the members that ended, then the one it ended on; the folders
        of those after it cleared of what this launch wrote there."""
        self._advance()
        self._settle(now_all=True)
        for member in self.members[self.current + 1 :]:
            _clear(member.run)
        index = self.current
        if index >= len(self.members):
            return
        member = self.members[index]
        # the evidence as a job of its own would give it: its result, the launch's exit
        # code and stderr, the kernel's word on an OOM kill; its own time limit
        assert self.prepared is not None
        launch = replace(self.prepared, timeout_s=timeout_for(member.experiment, self.options))
        verdict = classify_run(member.run, launch, self.ran)
        outcome = self._outcome(index, verdict, self.ran.returncode)
        self._slices(index, self.windows[index].start_unix, time.time(), outcome)
        self._write(index, outcome)

    def _outcome(self, index: int, verdict: Verdict, returncode: int | None) -> Outcome:
        member, window = self.members[index], self.windows[index]
        end = window.end_unix if window.end_unix is not None else time.time()
        result = launch_result(member.run.result, self.launch_id)
        if index == 0 and self.ran.launched_unix is not None:
            self.overhead = launch_overhead(result, self.ran.launched_unix)
        # stopped, not ended: the run's lifetime is not known
        stopped = self.ran.interrupted and window.end_unix is None
        return Outcome(
            status=verdict.status,
            error=verdict.error,
            failure=verdict.failure,
            log=self.layout.relative(member.run.stderr),
            returncode=returncode,
            wall_s=end - window.start_unix,
            job_s=None if stopped else end - window.start_unix,
            started_at=at(window.start_unix),
            finished_at=at(end),
            devices=list(self.placement.devices),
            attempt=member.attempt,
            executor=self.placement.executor,
            job_id=self.placement.job_id,
            run_mode="shared",
            launch_id=self.launch_id,
            launch_position=index + 1,
            launch_size=len(self.members),
            launch_overhead_s=self.overhead,
            phases=phase_seconds(window.start_unix, end, (result or {}).get("timings")),
            # the launch's one wait for the GPUs to cool, on the run it came before
            cooldown=(self.ran.cooldown or {}) if index == 0 else {},
        )

    def _slices(self, index: int, start_unix: float, end_unix: float, outcome: Outcome) -> None:
        """The member's memory samples and logs, cut from the launch's."""
        member = self.members[index]
        sidecar: Sidecar | None = self.ran.sidecar
        if sidecar is not None:
            _cut_samples(self.files.memory, member.run.memory, start_unix, end_unix)
            samples = read_samples(member.run.memory)
            windows = utilisation.run_windows(member.run.progress, member.run.result)
            outcome.memory = row_figures(samples, windows)
            outcome.memory_backend = sidecar.backend
            outcome.gpu_device_name = sidecar.devices
        elif wants_sidecar(self.options):
            outcome.memory_backend = "unavailable (the sidecar did not start; see stderr.log)"
        self._split_logs(upto=index)

    def _write(self, index: int, outcome: Outcome) -> None:
        member = self.members[index]
        write_outcome(member.run, outcome)
        self.on_done(member, outcome)
        self.written = index + 1
        self._announce()

    def _split_logs(self, upto: int) -> None:
        """Each member's part of the launch's stdout and stderr, in its own folder (those
        up to ``upto``)."""
        started = self.members[: upto + 1]
        ids = [m.experiment.experiment_id for m in self.members]
        for source, target in ((self.files.stdout, "stdout"), (self.files.stderr, "stderr")):
            try:
                text = source.read_text(errors="replace")
            except OSError:
                text = ""
            parts = split_log(text, ids)
            for member in started:
                path = member.run.stdout if target == "stdout" else member.run.stderr
                write_atomic(path, parts.get(member.experiment.experiment_id, ""))


def _clear(run: RunPaths) -> None:
    """Take out of a member's folder what a launch it did not run in wrote there."""
    for path in (run.spec, run.command, run.progress):
        path.unlink(missing_ok=True)
    with suppress(OSError):
        run.dir.rmdir()  # only when nothing else is there


#: sample kinds the sidecar writes once (the baseline before the job) or only when they
#: change (the CPUs the job may use): a slice starts with the last one before it
_STATES = ("device_baseline", utilisation.CPU_ALLOWED, *energy.STATES)


def _cut_samples(source: Path, target: Path, start_unix: float, end_unix: float) -> None:
    """The sidecar's samples between two times, after the states in force at the start."""
    rows: list[list[str]] = []
    states: dict[tuple[str, str], list[str]] = {}
    header: list[str] = []
    with suppress(OSError), source.open(newline="") as f:
        reader = csv.reader(f)
        header = next(reader, [])
        for row in reader:
            try:
                t = float(row[0])
                kind, where = row[1], row[2]
            except (IndexError, ValueError):
                continue  # a line cut short
            if start_unix <= t <= end_unix:
                rows.append(row)
            elif t < start_unix and kind in _STATES:
                states[(kind, where)] = row
    text = io.StringIO()
    # quoted as the sidecar wrote them: a reason (energy_none) may hold a comma
    csv.writer(text, lineterminator="\n").writerows([header, *states.values(), *rows])
    write_atomic(target, text.getvalue())
