"""Run a plan: each experiment an ``accelerate launch`` subprocess, watched by a sidecar.

One job at a time (the default: co-running jobs share CPU, PCIe and NVLink).
Each job runs in its own process group with an explicit environment and a
time limit; whatever happens — a timeout, Ctrl-C, an exception in here — the
``finally`` blocks stop the job's whole group (TERM, a grace period, KILL) and
the sidecar. After every job its outcome is written, and ``raw_summary.csv``
is rewritten, so an interrupted run keeps everything it finished.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from orchestrator import envinfo
from orchestrator.experiment import Experiment
from orchestrator.launcher import accelerate_command, job_env, launch_argv
from orchestrator.matrix import Plan
from orchestrator.paths import ResultsLayout, RunPaths, write_atomic
from orchestrator.progress import Progress
from orchestrator.result import read_result
from orchestrator.resultsdir import keep_previous_attempt, open_results
from orchestrator.sidecar import parse_ready, read_samples, summarize
from orchestrator.spec import spec_for, write_spec
from orchestrator.status import classify
from orchestrator.summary import build_row, write_raw_summary

DEFAULT_TIMEOUT_S = 3600.0
GRACE_S = 10.0
STDERR_TAIL_BYTES = 64 * 1024

#: statuses after which a run still exits 0: a benchmark may legitimately run out of memory
ACCEPTABLE = ("ok", "oom", "skipped")


@dataclass(frozen=True)
class RunOptions:
    timeout_s: float | None = None
    resume: bool = False
    fail_fast: bool = False
    #: ``all``, ``nvidia`` (sidecar only) or ``huggingface`` (HF metrics only)
    memory_logging: str = "all"
    no_data_processing: bool = False
    sidecar_interval_s: float = 0.1
    grace_s: float = GRACE_S
    #: for the report: the price of a GPU-hour and a token budget to estimate
    usd_per_gpu_hour: float | None = None
    tokens: float | None = None
    #: write benchmarks.csv, summary.md and plots after the run
    report: bool = True


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

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


class Interrupted(Exception):
    """Ctrl-C or SIGTERM reached the orchestrator."""


# ---------------------------------------------------------------------------
# Processes
# ---------------------------------------------------------------------------


def free_port() -> int:
    """A TCP port free right now (the kernel's pick), for the job's rendezvous."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
        "orchestrator.sidecar",
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
    from orchestrator.paths import PROJECT_ROOT

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


def _hub_free(model: str) -> bool:
    return model == "tiny-llama" or model.startswith("config:")


def child_environment(
    experiment: Experiment, devices: Sequence[str]
) -> tuple[dict[str, str], dict[str, str]]:
    """(the overlay written to command.sh, the full environment of the job)."""
    overlay = job_env(experiment, devices)
    overlay["PYTHONPATH"] = _pythonpath()
    if experiment.device == "cpu" and "OMP_NUM_THREADS" not in os.environ:
        overlay["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // experiment.num_gpus))
    if _hub_free(experiment.model_name_or_path):
        # the built-in models never need the hub: fail in seconds if anything asks
        overlay["HF_HUB_OFFLINE"] = "1"
    return overlay, {**os.environ, **overlay}


def run_experiment(
    experiment: Experiment,
    run: RunPaths,
    layout: ResultsLayout,
    options: RunOptions,
    devices: Sequence[str],
    *,
    attempt: int = 1,
    on_tick: Callable[[], None] = lambda: None,
) -> Outcome:
    """Launch one experiment and wait for it; always leaves no process behind."""
    run.dir.mkdir(parents=True, exist_ok=True)
    spec = spec_for(
        experiment,
        run,
        layout.data,
        hf_memory_metrics=options.memory_logging in ("all", "huggingface"),
        no_data_processing=options.no_data_processing,
    )
    write_spec(spec, run.spec)
    port = free_port()
    argv = launch_argv(experiment, run.spec.resolve(), port=port, accelerate=accelerate_command())
    overlay, env = child_environment(experiment, devices)
    write_command_script(run.command, overlay, argv, Path.cwd())

    timeout = options.timeout_s or experiment.timeout_s or DEFAULT_TIMEOUT_S
    outcome = Outcome(
        status="failed", log=_relative(run.stderr, layout), devices=list(devices), attempt=attempt
    )
    proc: subprocess.Popen[Any] | None = None
    sidecar: Sidecar | None = None
    timed_out = interrupted = False
    start = time.monotonic()
    outcome.started_at = envinfo.now()
    with (
        run.stdout.open("w") as out,
        run.stderr.open("w") as err,
        (run.dir / "sidecar.log").open("w") as side,
    ):
        try:
            if options.memory_logging in ("all", "nvidia"):
                sidecar = start_sidecar(run.memory, devices, options.sidecar_interval_s, side)
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
    outcome.finished_at = envinfo.now()
    outcome.returncode = proc.returncode if proc is not None else None
    result = read_result(run.result)
    classified = classify(
        returncode=outcome.returncode,
        result=result,
        stderr_tail=_tail(run.stderr),
        timed_out=timed_out,
        interrupted=interrupted,
        timeout_s=timeout,
    )
    outcome.status, outcome.error = classified.status, classified.error
    if sidecar is not None:
        outcome.memory_backend = sidecar.backend
        outcome.gpu_device_name = sidecar.devices
        outcome.memory = summarize(read_samples(run.memory))
    elif options.memory_logging in ("all", "nvidia"):
        outcome.memory_backend = "unavailable (the sidecar did not start; see stderr.log)"
    write_atomic(
        run.dir / "outcome.json", json.dumps(outcome.as_dict(), indent=2, sort_keys=True) + "\n"
    )
    if interrupted:
        raise Interrupted(outcome)
    return outcome


# ---------------------------------------------------------------------------
# The matrix
# ---------------------------------------------------------------------------


def gpu_pool() -> list[str]:
    """The GPUs this orchestrator may hand out, as CUDA_VISIBLE_DEVICES entries."""
    from orchestrator.hardware import gpu_count, visible_devices

    visible = visible_devices()
    count = gpu_count()
    if visible is not None:
        return visible[:count]
    return [str(i) for i in range(count)]


def _relative(path: Path, layout: ResultsLayout) -> str:
    """A path inside the results folder, relative to it (the folder may move)."""
    try:
        return str(path.relative_to(layout.root))
    except ValueError:
        return str(path)


def _previous_ok(run: RunPaths) -> bool:
    result = read_result(run.result)
    outcome = read_result(run.dir / "outcome.json")
    return bool(
        result and result.get("status") == "ok" and outcome and outcome.get("status") == "ok"
    )


def _skipped_outcome(run: RunPaths, layout: ResultsLayout) -> Outcome:
    previous = read_result(run.dir / "outcome.json") or {}
    outcome = Outcome(status="skipped", error=None, log=_relative(run.stderr, layout))
    for key in Outcome.__dataclass_fields__:
        if key not in ("status", "error", "log") and key in previous:
            setattr(outcome, key, previous[key])
    return outcome


@dataclass
class RunReport:
    outcomes: dict[str, Outcome]
    layout: ResultsLayout
    moved_to: Path | None
    interrupted: bool
    history_run_id: int | None = None
    report_error: str | None = None

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for o in self.outcomes.values():
            out[o.status] = out.get(o.status, 0) + 1
        return out

    @property
    def exit_code(self) -> int:
        if self.interrupted:
            return 130
        return 0 if all(o.status in ACCEPTABLE for o in self.outcomes.values()) else 1


def _summary_rows(
    plan: Plan, layout: ResultsLayout, outcomes: dict[str, Outcome]
) -> list[dict[str, Any]]:
    """One row per planned experiment, with this run's statuses (skipped, not run...)."""
    rows = []
    for e in plan.experiments:
        outcome = outcomes.get(e.experiment_id) or Outcome(status="interrupted", error="not run")
        result = read_result(layout.run(e.experiment_id).result)
        rows.append(build_row(e.spec(), outcome.as_dict(), result))
    return rows


def _write_summary(plan: Plan, layout: ResultsLayout, outcomes: dict[str, Outcome]) -> None:
    write_raw_summary(_summary_rows(plan, layout, outcomes), layout.raw_summary)


def _report_and_record(
    run_report: RunReport,
    rows: list[dict[str, Any]],
    env: dict[str, Any],
    options: RunOptions,
    say: Callable[[str], None],
) -> None:
    """The full report and the history entry; a failure here never costs the results."""
    try:
        from orchestrator import history
        from orchestrator.report import CostSettings, write_report

        root = run_report.layout.root
        report = write_report(
            root,
            root,
            CostSettings(usd_per_gpu_hour=options.usd_per_gpu_hour, tokens=options.tokens),
            rows=rows,
        )
        run_report.history_run_id = history.record(history.path_for(root), report.rows, env, root)
    except Exception as exc:  # the run's files are written; the report can be redone
        run_report.report_error = f"{type(exc).__name__}: {exc}"
        say(
            f"the report failed ({run_report.report_error}); run `tunematrix report {run_report.layout.root}`"
        )


def run_plan(
    plan: Plan,
    results: Path,
    options: RunOptions,
    *,
    argv: list[str],
    progress: Progress | None = None,
    log: Callable[[str], None] | None = None,
) -> RunReport:
    """Run every experiment of ``plan`` into ``results``; return what happened."""
    from orchestrator.plan import write_plan_csv

    progress = progress or Progress(len(plan.experiments))
    say = log or progress.message
    outcomes: dict[str, Outcome] = {}
    interrupted = False

    stopping: list[int] = []

    def on_signal(signum: int, frame: Any) -> None:
        # The first signal stops the run; more while it cleans up are ignored,
        # so a second Ctrl-C cannot leave a job or the sidecar behind.
        if not stopping:
            stopping.append(signum)
            raise Interrupted(f"signal {signum}")

    previous_handlers = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        with open_results(results, resume=options.resume) as opened:
            layout = opened.layout
            if opened.moved_to is not None:
                say(f"the earlier run in {results} was moved to {opened.moved_to}")
            env = envinfo.collect(argv)
            env["cost"] = {"usd_per_gpu_hour": options.usd_per_gpu_hour}
            write_atomic(layout.env, json.dumps(env, indent=2) + "\n")
            write_plan_csv(plan, layout.plan_csv)
            pool = gpu_pool() if any(e.device == "gpu" for e in plan.experiments) else []
            try:
                for experiment in plan.experiments:
                    eid = experiment.experiment_id
                    run = layout.run(eid)
                    if options.resume and _previous_ok(run):
                        outcomes[eid] = _skipped_outcome(run, layout)
                        progress.finish(eid, "skipped", 0.0, "already ok", counted=False)
                        continue
                    attempt = 1
                    if run.dir.exists():
                        kept = keep_previous_attempt(run.dir)
                        if kept is not None:
                            attempt = int(kept.name) + 1
                    if experiment.device == "gpu" and experiment.num_gpus > len(pool):
                        outcome = Outcome(
                            status="failed",
                            error=f"needs {experiment.num_gpus} GPU(s); {len(pool)} visible to the orchestrator",
                            attempt=attempt,
                        )
                        run.dir.mkdir(parents=True, exist_ok=True)
                        write_atomic(
                            run.dir / "outcome.json", json.dumps(outcome.as_dict(), indent=2) + "\n"
                        )
                        outcomes[eid] = outcome
                        progress.finish(
                            eid, outcome.status, 0.0, outcome.error or "", counted=False
                        )
                    else:
                        devices = pool[: experiment.num_gpus] if experiment.device == "gpu" else []
                        progress.begin(eid)
                        outcome = run_experiment(
                            experiment,
                            run,
                            layout,
                            options,
                            devices,
                            attempt=attempt,
                            on_tick=progress.tick,
                        )
                        outcomes[eid] = outcome
                        progress.finish(
                            eid, outcome.status, outcome.wall_s or 0.0, outcome.error or ""
                        )
                    _write_summary(plan, layout, outcomes)
                    if options.fail_fast and outcomes[eid].status not in ACCEPTABLE:
                        say(f"stopping: --fail-fast and {eid} ended {outcomes[eid].status}")
                        for rest in plan.experiments:
                            outcomes.setdefault(
                                rest.experiment_id,
                                Outcome(
                                    status="interrupted",
                                    error=f"not run: --fail-fast stopped after {eid}",
                                ),
                            )
                        break
            except Interrupted as exc:
                interrupted = True
                current = exc.args[0] if exc.args and isinstance(exc.args[0], Outcome) else None
                if current is not None:
                    for e in plan.experiments:
                        if e.experiment_id not in outcomes:
                            outcomes[e.experiment_id] = current
                            progress.finish(e.experiment_id, "interrupted", current.wall_s or 0.0)
                            break
                for e in plan.experiments:
                    outcomes.setdefault(
                        e.experiment_id,
                        Outcome(status="interrupted", error="not run: the run was interrupted"),
                    )
            finally:
                _write_summary(plan, layout, outcomes)
                env["finished_at"] = envinfo.now()
                env["interrupted"] = interrupted
                write_atomic(layout.env, json.dumps(env, indent=2) + "\n")
            run_report = RunReport(
                outcomes=outcomes, layout=layout, moved_to=opened.moved_to, interrupted=interrupted
            )
            if options.report:
                _report_and_record(
                    run_report, _summary_rows(plan, layout, outcomes), env, options, say
                )
            return run_report
    finally:
        for sig, handler in previous_handlers.items():
            signal.signal(sig, handler)
