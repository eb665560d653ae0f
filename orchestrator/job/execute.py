"""One experiment as a job: ``accelerate launch`` in its own process group, watched by a sidecar.

``run_experiment`` is the one path every executor takes, in named steps:
``prepare_launch`` (spec, command, environment), ``launch_and_wait`` (the
sidecar and the job, the time limit), ``classify_run`` (the status from the
evidence), ``build_outcome`` and ``write_outcome``. Whatever happens — a
timeout, Ctrl-C, a stop request from the scheduler, an exception in here —
the ``finally`` blocks stop the job's whole group (TERM, a grace period,
KILL) and the sidecar, and the job's outcome is written.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from orchestrator.contract.choices import MEMORY_LOGGING
from orchestrator.contract.clock import now
from orchestrator.contract.layout import (
    NodeFiles,
    ResultsLayout,
    RunPaths,
    project_pythonpath,
    write_atomic,
)
from orchestrator.contract.modelnames import TINY_MODEL_NAMES
from orchestrator.contract.outcome import Outcome, write_outcome
from orchestrator.contract.result import LAUNCH_ID_ENV, launch_result
from orchestrator.contract.spec import MemoryStages, RunSpec, write_spec
from orchestrator.job import cooldown, energy, nodes, oomkill, runlock, utilisation
from orchestrator.job.classify import Verdict, classify, root_cause, sigkilled_pids
from orchestrator.job.command import LaunchSite, accelerate_command, job_env, launch_argv
from orchestrator.job.phases import phase_seconds
from orchestrator.job.sidecar import parse_ready, read_samples, row_figures
from orchestrator.job.tether import tethered
from orchestrator.matrix.experiment import Experiment

DEFAULT_TIMEOUT_S = 3600.0
GRACE_S = 10.0
STDERR_TAIL_BYTES = 64 * 1024


def spec_for(
    experiment: Experiment,
    run: RunPaths,
    data_dir: Path,
    *,
    memory_stages: MemoryStages | None,
    no_data_processing: bool,
) -> RunSpec:
    """The spec of one experiment's run, with absolute paths."""
    return RunSpec(
        **experiment.spec(),
        result_path=str(run.result.resolve()),
        progress_path=str(run.progress.resolve()),
        output_dir=str(run.output_dir.resolve()),
        data_dir=str(data_dir.resolve()),
        profile_dir=str(run.profile.resolve()),
        memory_stages=memory_stages,
        no_data_processing=no_data_processing,
        attempt_token=uuid.uuid4().hex,
    )


@dataclass(frozen=True)
class RunOptions:
    """How every experiment of a run is run, whichever executor runs it."""

    timeout_s: float | None = None
    resume: bool = False
    fail_fast: bool = False
    #: a key of ``orchestrator.config.values.MEMORY_LOGGING``: ``all`` (sidecar and the GPU
    #: memory stages from torch.cuda counters), ``nvidia`` (sidecar only), ``huggingface``
    #: (stages only) or ``hf-tracker`` (stages from HF's TrainerMemoryTracker, whose
    #: polling thread slows training; only when asked for by name)
    memory_logging: str = "all"
    no_data_processing: bool = False
    sidecar_interval_s: float = 0.1
    #: ``--cool-down``: before each launch, wait at most this long for each of its GPUs to
    #: be back near its temperature before its first launch (``orchestrator.job.cooldown``);
    #: 0: never
    cool_down_s: float = 0.0
    grace_s: float = GRACE_S
    #: write benchmarks.csv, summary.md and plots after the run (their prices and token
    #: budget: ``orchestrator.results.report.ReportOptions``)
    report: bool = True
    #: once an experiment ran out of memory, record the experiments of its ladder that
    #: need at least as much as pruned instead of launching them (``--no-prune``: off)
    prune: bool = True
    #: once two cells of one model, trainer and framework failed with the same error (not
    #: out of memory, not a time limit), record the others like them as not launched
    #: (``--no-stop-early``; ``RunContext.failed_alike``)
    stop_early: bool = True
    #: ``cell``: a launch per experiment; ``family``: the experiments of one family
    #: (``orchestrator.matrix.launches``) one after another in one launch
    #: (``orchestrator.job.shared``); None: the file's ``launch:``, else ``cell``
    launch: str | None = None
    #: check every cell against the installed libraries before launch (``--no-check``: off);
    #: ``recheck``: every cell again, even one whose verdict was kept (``--recheck``)
    check: bool = True
    recheck: bool = False
    #: one GPU's memory to set each GPU cell's predicted memory against (``--gpu-memory-gib``;
    #: default: the smallest GPU here, for the executors that run jobs here)
    gpu_memory_gib: float | None = None


class Interrupted(Exception):
    """Ctrl-C or SIGTERM reached the orchestrator."""


# ---------------------------------------------------------------------------
# Processes
# ---------------------------------------------------------------------------


_ports_handed_out: set[int] = set()
_ports_lock = threading.Lock()


def free_port() -> int:
    """A TCP port free right now (the kernel's pick), for the job's rendezvous.

    Never the same port twice in one orchestrator, so packed jobs that start
    together cannot be handed one port between them.
    """
    with _ports_lock:
        while True:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind(("127.0.0.1", 0))
                port = int(s.getsockname()[1])
            if port not in _ports_handed_out:
                _ports_handed_out.add(port)
                return port


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop_group(proc: subprocess.Popen[Any], grace_s: float) -> None:
    """TERM the whole process group, wait ``grace_s``, then KILL what is left."""
    pgid = proc.pid  # start_new_session: the leader's pid is the group id
    if not _group_alive(pgid):
        proc.poll()
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        proc.poll()
        if not _group_alive(pgid):
            return
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    proc.wait()


@dataclass
class Sidecar:
    proc: subprocess.Popen[str]
    backend: str
    devices: str | None

    def watch(self, pid: int) -> None:
        assert self.proc.stdin is not None
        with contextlib.suppress(BrokenPipeError, OSError):
            self.proc.stdin.write(f"{pid}\n")
            self.proc.stdin.flush()

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            if self.proc.stdin is not None:
                self.proc.stdin.close()  # EOF: the sidecar flushes and exits
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_sidecar(
    out: Path, devices: Sequence[str], interval: float, log: IO[str]
) -> Sidecar | None:
    argv = [
        sys.executable,
        "-m",
        "orchestrator.job.sidecar",
        "--out",
        str(out),
        "--devices",
        ",".join(devices),
        "--interval",
        str(interval),
    ]
    env = {**os.environ, "PYTHONPATH": project_pythonpath()}
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
        env=env,
        start_new_session=True,
    )
    assert proc.stdout is not None
    ready = proc.stdout.readline()  # after the baseline; EOF if it died
    if not ready.startswith("ready"):
        proc.kill()
        proc.wait()
        return None
    backend, extra = parse_ready(ready)
    return Sidecar(proc=proc, backend=backend, devices=extra.get("devices"))


def _tail(path: Path) -> str:
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - STDERR_TAIL_BYTES))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def write_command_script(path: Path, env: dict[str, str], argv: Sequence[str], cwd: Path) -> None:
    """``command.sh``: the exact environment overlay and command, runnable by hand."""
    lines = [
        "#!/usr/bin/env bash",
        "# Re-run this experiment by hand (the port may need changing).",
        "set -euo pipefail",
    ]
    lines.append(f"cd {shlex.quote(str(cwd))}")
    lines += [f"export {k}={shlex.quote(v)}" for k, v in env.items()]
    lines.append(shlex.join(argv))
    write_atomic(path, "\n".join(lines) + "\n", executable=True)


# ---------------------------------------------------------------------------
# One experiment, in named steps: prepare, launch (with the sidecar), wait
# (with the time limit), classify, write the outcome. Every executor runs an
# experiment through ``run_experiment``; only where it runs differs.
# ---------------------------------------------------------------------------


def _hub_free(model: str) -> bool:
    return model in TINY_MODEL_NAMES or model.startswith("config:")


def child_environment(
    experiment: Experiment,
    devices: Sequence[str],
    *,
    cpu_share: int = 1,
    launch_id: str | None = None,
) -> tuple[dict[str, str], dict[str, str]]:
    """(the overlay written to command.sh, the full environment of the job).

    ``cpu_share``: how many jobs share the machine's cores (packing on the CPU).
    ``launch_id``: names this launch on every node (a new one when not given).
    """
    overlay = job_env(experiment, devices)
    overlay["PYTHONPATH"] = project_pythonpath()
    if experiment.device == "cpu" and "OMP_NUM_THREADS" not in os.environ:
        cores = (os.cpu_count() or 1) // max(1, cpu_share)
        overlay["OMP_NUM_THREADS"] = str(max(1, cores // experiment.processes))
    if _hub_free(experiment.model_name_or_path) or experiment.hub_offline:
        # the built-in models never need the hub: fail in seconds if anything asks; a
        # model found in the cache while the hub did not answer loads from the cache
        # rather than after the hub's retries (orchestrator.running.stackcheck)
        overlay["HF_HUB_OFFLINE"] = "1"
    # not in command.sh: a run by hand is a launch of its own
    return overlay, {**os.environ, **overlay, LAUNCH_ID_ENV: launch_id or uuid.uuid4().hex}


@dataclass(frozen=True)
class Placement:
    """Where one launch of an experiment runs, as its executor decided."""

    #: the executor's name, and its id of the job (for the outcome)
    executor: str = "local"
    job_id: str | None = None
    #: ``CUDA_VISIBLE_DEVICES`` entries handed to the job (none on the CPU)
    devices: Sequence[str] = ()
    #: this node's place in a multi-node job
    site: LaunchSite = field(default_factory=LaunchSite)
    #: the rendezvous port (default: a free one here)
    port: int | None = None
    #: how many jobs share this machine's cores (packing on the CPU)
    cpu_share: int = 1
    #: the same on every node of a multi-node job (default: a new one)
    launch_id: str | None = None
    #: the jobs that ran beside this one (filled by a packing executor while it runs)
    packed_with: set[str] | None = None


@dataclass(frozen=True)
class Launch:
    """A prepared launch: the command, its environment and where its output goes."""

    argv: list[str]
    env: dict[str, str]
    files: NodeFiles
    #: the first node writes the run's files and outcome, the others only their logs
    primary: bool
    timeout_s: float
    #: names the launch on every node (``LAUNCH_ID_ENV``) and in the outcome
    launch_id: str = ""
    #: ``--cool-down``: each GPU's first temperature (``ResultsLayout.cooldown``), to wait
    #: for before launching; None: no wait
    cooldown: Path | None = None
    #: the run folders this launch runs, locked while its job lives (``runlock``; the
    #: first node's alone: the others share its folder)
    runs: tuple[Path, ...] = ()
    #: the executor's name, recorded in the locks
    executor: str = "local"


def prepare_launch(
    experiment: Experiment,
    run: RunPaths,
    layout: ResultsLayout,
    options: RunOptions,
    placement: Placement,
) -> Launch:
    """Step 1: the spec, the command and its environment (and command.sh, on the first node)."""
    site = placement.site
    primary = site.machine_rank == 0
    run.dir.mkdir(parents=True, exist_ok=True)
    if primary:
        write_experiment_spec(experiment, run, layout, options)
        # the step counter shown while it runs must be this launch's
        run.progress.unlink(missing_ok=True)
    argv = launch_argv(
        experiment,
        run.spec.resolve(),
        port=placement.port or free_port(),
        accelerate=accelerate_command(experiment.python),
        site=site,
    )
    launch_id = placement.launch_id or uuid.uuid4().hex
    overlay, env = child_environment(
        experiment, placement.devices, cpu_share=placement.cpu_share, launch_id=launch_id
    )
    if primary:
        write_command_script(run.command, overlay, argv, Path.cwd())
    return Launch(
        argv=argv,
        env=env,
        files=run.node(site.machine_rank),
        primary=primary,
        timeout_s=timeout_for(experiment, options),
        launch_id=launch_id,
        cooldown=cooldown_file(layout, options) if primary else None,
        runs=(run.dir,) if primary else (),
        executor=placement.executor,
    )


def cooldown_file(layout: ResultsLayout, options: RunOptions) -> Path | None:
    """Where a launch finds the temperature to wait for, with ``--cool-down`` (else None)."""
    return layout.cooldown if options.cool_down_s > 0 else None


@dataclass
class Ran:
    """What launching and waiting found out."""

    started_at: str
    #: when the wall time started (Unix time): its phases count from here
    wall_start_unix: float | None = None
    #: when the job was started (Unix time): its launch overhead counts from here
    launched_unix: float | None = None
    returncode: int | None = None
    job_s: float | None = None
    wall_s: float = 0.0
    timed_out: bool = False
    interrupted: bool = False
    sidecar: Sidecar | None = None
    oom_watch: oomkill.OomWatch | None = None
    proc: subprocess.Popen[Any] | None = None
    #: the wait for the GPUs to cool before the launch (``cooldown.wait``), if asked
    cooldown: dict[str, Any] | None = None


def wait_with_limit(
    proc: subprocess.Popen[Any],
    timeout_s: float,
    stop: threading.Event | None,
    on_tick: Callable[[], None],
) -> tuple[bool, bool, float]:
    """Step 3: wait for the job, at most ``timeout_s``; (timed out, stopped, job seconds).

    Wakes once a second for ``on_tick`` (the progress line) and ``stop`` (a
    scheduler's stop request); never busy-waits.
    """
    launched = time.monotonic()
    deadline = launched + timeout_s
    while True:
        try:
            proc.wait(timeout=max(0.0, min(1.0, deadline - time.monotonic())))
            return False, False, time.monotonic() - launched
        except subprocess.TimeoutExpired:
            if time.monotonic() >= deadline:
                return True, False, time.monotonic() - launched
            if stop is not None and stop.is_set():
                return False, True, time.monotonic() - launched
            on_tick()


def launch_and_wait(
    launch: Launch,
    options: RunOptions,
    devices: Sequence[str],
    *,
    stop: threading.Event | None = None,
    on_tick: Callable[[], None] = lambda: None,
    wait: Callable[[Ran], None] | None = None,
) -> Ran:
    """Step 2 and 3: start the sidecar and the job in its own process group, wait.

    ``wait``: how to wait for the job instead of ``wait_with_limit`` (a shared launch
    watches its runs one by one); it sets ``timed_out`` or ``interrupted`` on the
    ``Ran`` it is given. Whatever happens (the time limit, Ctrl-C, ``stop``, an
    exception here), the ``finally`` stops the job's whole group (TERM, a grace
    period, KILL) and the sidecar.
    """
    cooled = None
    if launch.cooldown is not None:  # before the wall time starts: the wait is its own
        try:
            cooled = cooldown.wait(launch.cooldown, devices, options.cool_down_s, stop=stop)
        except (KeyboardInterrupt, cooldown.Stopped):
            # stopped before the launch: nothing ran
            return Ran(started_at=now("milliseconds"), interrupted=True)
    # the run's lock, before anything of this launch starts: an earlier attempt still
    # alive refuses it here (``runlock``); the launcher inherits it, so it is held
    # while the job lives, whatever becomes of this process
    lock = runlock.RunLock.take(launch.runs, launch.launch_id, launch.executor)
    ran = Ran(started_at=now("milliseconds"), wall_start_unix=time.time(), cooldown=cooled)
    start = time.monotonic()
    files = launch.files
    with (
        contextlib.closing(lock),  # released last: after the job's group is stopped
        files.stdout.open("w") as out,
        files.stderr.open("w") as err,
        files.sidecar_log.open("w") as side,
    ):
        try:
            if wants_sidecar(options):
                ran.sidecar = start_sidecar(files.memory, devices, options.sidecar_interval_s, side)
            ran.oom_watch = oomkill.watch()  # the job inherits this process's cgroups
            ran.launched_unix = time.time()
            ran.proc = subprocess.Popen(
                # ended by the kernel should this process die (``tether``)
                tethered(launch.argv),
                env=launch.env,
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                pass_fds=lock.fds,
            )
            lock.launched(ran.proc.pid)
            if ran.sidecar is not None:
                ran.sidecar.watch(ran.proc.pid)
            if wait is not None:
                wait(ran)
            else:
                ran.timed_out, ran.interrupted, ran.job_s = wait_with_limit(
                    ran.proc, launch.timeout_s, stop, on_tick
                )
            if ran.interrupted:
                ran.job_s = None  # stopped, not ended: the job's lifetime is not known
        except (KeyboardInterrupt, Interrupted):
            ran.interrupted = True
        finally:
            if ran.proc is not None:
                # after Ctrl-C the user is waiting: a shorter grace before KILL
                grace = min(options.grace_s, 5.0) if ran.interrupted else options.grace_s
                stop_group(ran.proc, grace)
            if ran.sidecar is not None:
                ran.sidecar.stop()
    ran.wall_s = time.monotonic() - start
    ran.returncode = ran.proc.returncode if ran.proc is not None else None
    return ran


def classify_run(run: RunPaths, launch: Launch, ran: Ran) -> Verdict:
    """Step 4: the status from the evidence (result.json, exit code, stderr, the kernel)."""
    # another node writes no result: its launcher's exit and stderr tell its story
    result = launch_result(run.result, launch.launch_id) if launch.primary else None
    if not launch.primary and ran.returncode == 0:
        result = {"status": "ok"}
    stderr_tail = _tail(launch.files.stderr)
    host_oom = _host_oom(ran.oom_watch, ran.returncode, stderr_tail, launch.files.memory, ran.proc)
    return classify(
        returncode=ran.returncode,
        result=result,
        stderr_tail=stderr_tail,
        timed_out=ran.timed_out,
        interrupted=ran.interrupted,
        timeout_s=launch.timeout_s,
        host_oom=host_oom.found if host_oom else None,
        host_oom_checked=host_oom.checked if host_oom else False,
        folder=run.dir,
    )


def build_outcome(
    run: RunPaths,
    layout: ResultsLayout,
    options: RunOptions,
    placement: Placement,
    launch: Launch,
    ran: Ran,
    verdict: Verdict,
    attempt: int,
) -> Outcome:
    """Step 5: the outcome record of the launch (written by the first node)."""
    outcome = Outcome(
        status=verdict.status,
        error=verdict.error,
        failure=verdict.failure,
        # this node's log (node 0's: the run's stderr.log)
        log=layout.relative(launch.files.stderr),
        returncode=ran.returncode,
        wall_s=ran.wall_s,
        job_s=ran.job_s,
        started_at=ran.started_at,
        finished_at=now("milliseconds"),
        devices=list(placement.devices),
        attempt=attempt,
        executor=placement.executor,
        job_id=placement.job_id,
    )
    if ran.sidecar is not None:
        outcome.memory_backend = ran.sidecar.backend
        outcome.gpu_device_name = ran.sidecar.devices
        samples = read_samples(launch.files.memory)
        # utilisation over the measured steps where the child's files say when they were
        windows = utilisation.run_windows(run.progress, run.result) if launch.primary else []
        # a multi-node job's sidecar here samples this node only
        outcome.memory = energy.of_first_node(
            row_figures(samples, windows), placement.site.num_machines
        )
    elif wants_sidecar(options):
        outcome.memory_backend = "unavailable (the sidecar did not start; see stderr.log)"
    if ran.cooldown is not None:
        outcome.cooldown = ran.cooldown
    if placement.packed_with:
        outcome.run_mode, outcome.packed_with = "packed", sorted(placement.packed_with)
    outcome.launch_id, outcome.launch_position, outcome.launch_size = launch.launch_id, 1, 1
    if launch.primary:
        result = launch_result(run.result, launch.launch_id)
        if ran.launched_unix is not None:
            outcome.launch_overhead_s = launch_overhead(result, ran.launched_unix)
        if ran.wall_start_unix is not None:
            outcome.phases = phase_seconds(
                ran.wall_start_unix, ran.wall_start_unix + ran.wall_s, (result or {}).get("timings")
            )
    return outcome


def launch_overhead(result: Mapping[str, Any] | None, launched_unix: float) -> float | None:
    """A launch's cost before training, from its first run's result: from the launch to
    the end of the run's first step, less the model's load and the first step itself
    (``Outcome.launch_overhead_s``); None where the run did not say."""
    timings = (result or {}).get("timings") or {}
    first_step_unix = timings.get("first_step_unix")
    if not isinstance(first_step_unix, (int, float)):
        return None
    load, first_step = timings.get("model_load_s"), timings.get("first_step_s")
    if not isinstance(load, (int, float)) or not isinstance(first_step, (int, float)):
        return None
    overhead = float(first_step_unix) - launched_unix - load - first_step
    return overhead if overhead >= 0 else None  # clocks that disagree: no figure


def run_experiment(
    experiment: Experiment,
    run: RunPaths,
    layout: ResultsLayout,
    options: RunOptions,
    placement: Placement | None = None,
    *,
    attempt: int = 1,
    on_tick: Callable[[], None] = lambda: None,
    stop: threading.Event | None = None,
) -> Outcome:
    """Launch one experiment and wait for it; always leaves no process behind.

    ``placement``: where it runs (devices, this node's place in a multi-node
    job, the executor's name and job id); only the first node writes the
    run's files and outcome, the others their own logs. ``stop``: set by a
    scheduler to stop the job (Ctrl-C while packing). Returns the outcome
    (``interrupted`` after Ctrl-C or ``stop``).
    """
    placement = placement or Placement()
    launch = prepare_launch(experiment, run, layout, options, placement)
    ran = launch_and_wait(launch, options, placement.devices, stop=stop, on_tick=on_tick)
    verdict = classify_run(run, launch, ran)
    outcome = build_outcome(run, layout, options, placement, launch, ran, verdict, attempt)
    if launch.primary:
        write_outcome(run, outcome)
    else:
        # the executor merges it into the run's outcome when it collects the job
        nodes.write_node_outcome(run, placement.site.machine_rank, outcome)
    return outcome


def _host_oom(
    started: oomkill.OomWatch | None,
    returncode: int | None,
    stderr_tail: str,
    memory_csv: Path,
    proc: subprocess.Popen[Any] | None,
) -> oomkill.OomEvidence | None:
    """The kernel's word on an OOM kill, looked up only when a process of the job died of SIGKILL."""
    death = root_cause(stderr_tail)
    sigkill = (-signal.SIGKILL, 128 + signal.SIGKILL)
    if started is None or not (
        returncode in sigkill or (death is not None and death.exitcode in sigkill)
    ):
        return None
    pids = sigkilled_pids(stderr_tail)
    # the sidecar saw every process of the job's tree, the killed one included
    pids |= {int(source) for _, _, source, _ in read_samples(memory_csv) if source.isdigit()}
    if proc is not None:
        pids.add(proc.pid)
    return oomkill.evidence(started, pids)


def wants_sidecar(options: RunOptions) -> bool:
    return MEMORY_LOGGING[options.memory_logging][0]


def timeout_for(experiment: Experiment, options: RunOptions) -> float:
    """An experiment's time limit: the command line's, else the file's, else the default."""
    return options.timeout_s or experiment.timeout_s or DEFAULT_TIMEOUT_S


def write_experiment_spec(
    experiment: Experiment, run: RunPaths, layout: ResultsLayout, options: RunOptions
) -> None:
    """The child's spec.json (also written at submission, before other nodes read it)."""
    spec = spec_for(
        experiment,
        run,
        layout.data,
        memory_stages=MEMORY_LOGGING[options.memory_logging][1],
        no_data_processing=options.no_data_processing,
    )
    write_spec(spec, run.spec)
