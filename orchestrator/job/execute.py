"""One experiment as a job: ``accelerate launch`` in its own process group, watched by a sidecar.

Whatever happens — a timeout, Ctrl-C, a stop request from the scheduler, an
exception in here — the ``finally`` blocks stop the job's whole group (TERM,
a grace period, KILL) and the sidecar, and the job's outcome is written.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from orchestrator.config.values import MEMORY_LOGGING
from orchestrator.contract.layout import ResultsLayout, RunPaths, write_atomic
from orchestrator.contract.result import LAUNCH_ID_ENV, read_result
from orchestrator.contract.spec import MemoryStages, RunSpec, write_spec
from orchestrator.job import oomkill
from orchestrator.job.classify import classify, root_cause, sigkilled_pids
from orchestrator.job.command import LaunchSite, accelerate_command, job_env, launch_argv
from orchestrator.job.sidecar import parse_ready, read_samples, summarize
from orchestrator.matrix.experiment import Experiment
from orchestrator.running import envinfo

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
        memory_stages=memory_stages,
        no_data_processing=no_data_processing,
    )


@dataclass(frozen=True)
class RunOptions:
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
    grace_s: float = GRACE_S
    #: for the report: the price of a GPU-hour and a token budget to estimate
    usd_per_gpu_hour: float | None = None
    tokens: float | None = None
    #: write benchmarks.csv, summary.md and plots after the run
    report: bool = True
    #: run jobs side by side while devices are free (see orchestrator.executors.scheduler)
    pack: bool = False
    #: CPU jobs: how many processes may run at once when packing
    slots: int = 1


@dataclass
class Outcome:
    status: str
    error: str | None = None
    log: str | None = None
    returncode: int | None = None
    #: from the experiment's start to the end of its cleanup (spec, sidecar, job, stop)
    wall_s: float | None = None
    #: from launching the job to its exit: the child's own lifetime
    job_s: float | None = None
    started_at: str | None = None
    finished_at: str | None = None
    memory: dict[str, Any] = field(default_factory=dict)
    memory_backend: str | None = None
    gpu_device_name: str | None = None
    devices: list[str] = field(default_factory=list)
    attempt: int = 1
    #: ``alone`` or ``packed`` (with ``packed_with``: the jobs that ran beside it)
    run_mode: str = "alone"
    packed_with: list[str] = field(default_factory=list)
    #: ``local`` or ``slurm`` (with the SLURM job id)
    executor: str = "local"
    slurm_job_id: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


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
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        proc.poll()
        if not _group_alive(pgid):
            return
        time.sleep(0.1)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


@dataclass
class Sidecar:
    proc: subprocess.Popen[str]
    backend: str
    devices: str | None

    def watch(self, pid: int) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(f"{pid}\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass

    def stop(self) -> None:
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()  # EOF: the sidecar flushes and exits
        except OSError:
            pass
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
    env = {**os.environ, "PYTHONPATH": _pythonpath()}
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


def _pythonpath() -> str:
    """The orchestrator's own import path first, so children run this same code."""
    from orchestrator.contract.layout import PROJECT_ROOT

    current = os.environ.get("PYTHONPATH")
    return str(PROJECT_ROOT) + (os.pathsep + current if current else "")


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
    write_atomic(path, "\n".join(lines) + "\n")
    path.chmod(0o755)


# ---------------------------------------------------------------------------
# One experiment
# ---------------------------------------------------------------------------


def _relative(path: Path, layout: ResultsLayout) -> str:
    """A path inside the results folder, relative to it (the folder may move)."""
    try:
        return str(path.relative_to(layout.root))
    except ValueError:
        return str(path)


def _hub_free(model: str) -> bool:
    return model == "tiny-llama" or model.startswith("config:")


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
    overlay["PYTHONPATH"] = _pythonpath()
    if experiment.device == "cpu" and "OMP_NUM_THREADS" not in os.environ:
        cores = (os.cpu_count() or 1) // max(1, cpu_share)
        overlay["OMP_NUM_THREADS"] = str(max(1, cores // experiment.num_gpus))
    if _hub_free(experiment.model_name_or_path):
        # the built-in models never need the hub: fail in seconds if anything asks
        overlay["HF_HUB_OFFLINE"] = "1"
    # not in command.sh: a run by hand is a launch of its own
    return overlay, {**os.environ, **overlay, LAUNCH_ID_ENV: launch_id or uuid.uuid4().hex}


def run_experiment(
    experiment: Experiment,
    run: RunPaths,
    layout: ResultsLayout,
    options: RunOptions,
    devices: Sequence[str],
    *,
    attempt: int = 1,
    on_tick: Callable[[], None] = lambda: None,
    stop: threading.Event | None = None,
    packed_with: set[str] | None = None,
    cpu_share: int = 1,
    site: LaunchSite | None = None,
    port: int | None = None,
    slurm_job_id: str | None = None,
    launch_id: str | None = None,
) -> Outcome:
    """Launch one experiment and wait for it; always leaves no process behind.

    ``stop``: set by a scheduler to stop the job (Ctrl-C while packing).
    ``packed_with``: filled by the scheduler with the jobs that ran beside this
    one. ``site``: this node's place in a multi-node job (SLURM); only the
    first node writes the run's files and outcome, the others their own logs.
    ``launch_id``: the same on every node of a multi-node job.
    Returns the outcome (``interrupted`` after Ctrl-C or ``stop``).
    """
    site = site or LaunchSite()
    primary = site.machine_rank == 0
    run.dir.mkdir(parents=True, exist_ok=True)
    if primary:
        write_experiment_spec(experiment, run, layout, options)
        # the step counter shown while it runs must be this launch's
        run.progress.unlink(missing_ok=True)
    port = port or free_port()
    argv = launch_argv(
        experiment, run.spec.resolve(), port=port, accelerate=accelerate_command(), site=site
    )
    overlay, env = child_environment(experiment, devices, cpu_share=cpu_share, launch_id=launch_id)
    if primary:
        write_command_script(run.command, overlay, argv, Path.cwd())
    suffix = "" if primary else f".node{site.machine_rank}"
    stdout_path = run.dir / f"stdout{suffix}.log" if suffix else run.stdout
    stderr_path = run.dir / f"stderr{suffix}.log" if suffix else run.stderr
    memory_path = run.dir / f"memory{suffix}.csv" if suffix else run.memory

    timeout = timeout_for(experiment, options)
    outcome = Outcome(
        status="failed",
        log=_relative(run.stderr, layout),
        devices=list(devices),
        attempt=attempt,
        executor="slurm" if slurm_job_id else "local",
        slurm_job_id=slurm_job_id,
    )
    proc: subprocess.Popen[Any] | None = None
    sidecar: Sidecar | None = None
    oom_watch: oomkill.OomWatch | None = None
    timed_out = interrupted = False
    start = time.monotonic()
    outcome.started_at = envinfo.now("milliseconds")
    with (
        stdout_path.open("w") as out,
        stderr_path.open("w") as err,
        (run.dir / f"sidecar{suffix}.log").open("w") as side,
    ):
        try:
            if _wants_sidecar(options):
                sidecar = start_sidecar(memory_path, devices, options.sidecar_interval_s, side)
            oom_watch = oomkill.watch()  # the job inherits this process's cgroups
            proc = subprocess.Popen(
                argv,
                env=env,
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
            launched = time.monotonic()
            if sidecar is not None:
                sidecar.watch(proc.pid)
            deadline = launched + timeout
            while True:
                # wake once a second for the progress line; no busy waiting
                try:
                    proc.wait(timeout=max(0.0, min(1.0, deadline - time.monotonic())))
                    outcome.job_s = time.monotonic() - launched
                    break
                except subprocess.TimeoutExpired:
                    if time.monotonic() >= deadline:
                        timed_out = True
                        outcome.job_s = time.monotonic() - launched
                        break
                    if stop is not None and stop.is_set():
                        interrupted = True
                        break
                    on_tick()
        except (KeyboardInterrupt, Interrupted):
            interrupted = True
        finally:
            if proc is not None:
                # after Ctrl-C the user is waiting: a shorter grace before KILL
                stop_group(proc, min(options.grace_s, 5.0) if interrupted else options.grace_s)
            if sidecar is not None:
                sidecar.stop()
    outcome.wall_s = time.monotonic() - start
    outcome.finished_at = envinfo.now("milliseconds")
    outcome.returncode = proc.returncode if proc is not None else None
    result = read_result(run.result) if primary else None
    stderr_tail = _tail(stderr_path)
    host_oom = _host_oom(oom_watch, outcome.returncode, stderr_tail, memory_path, proc)
    classified = classify(
        returncode=outcome.returncode,
        result=result if primary else {"status": "ok"},
        stderr_tail=stderr_tail,
        timed_out=timed_out,
        interrupted=interrupted,
        timeout_s=timeout,
        host_oom=host_oom.found if host_oom else None,
        host_oom_checked=host_oom.checked if host_oom else False,
    )
    outcome.status, outcome.error = classified.status, classified.error
    if sidecar is not None:
        outcome.memory_backend = sidecar.backend
        outcome.gpu_device_name = sidecar.devices
        outcome.memory = summarize(read_samples(memory_path))
    elif _wants_sidecar(options):
        outcome.memory_backend = "unavailable (the sidecar did not start; see stderr.log)"
    if packed_with:
        outcome.run_mode, outcome.packed_with = "packed", sorted(packed_with)
    if primary:
        write_outcome(run, outcome)
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


def _wants_sidecar(options: RunOptions) -> bool:
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


def write_outcome(run: RunPaths, outcome: Outcome) -> None:
    write_atomic(
        run.dir / "outcome.json", json.dumps(outcome.as_dict(), indent=2, sort_keys=True) + "\n"
    )
