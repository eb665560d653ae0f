"""The SLURM executor: every experiment a SLURM job, submitted through submitit.

A job that needs more GPUs than a node has spans nodes: one task per node,
each running ``accelerate launch`` with ``--num_machines``, its
``--machine_rank`` (``SLURM_NODEID``) and the first host of the allocation as
``--main_process_ip``. Inside the job the same code as a local run launches
the experiment (process group, sidecar, time limit, outcome.json), so results
land in the same folder layout and report and compare do not care where jobs
ran. The orchestrator waits with progress (or, with ``--no-wait``, returns;
``tunematrix report`` collects later), maps SLURM's ending to our statuses
and cancels its jobs when it is interrupted.

Job states are read from ``squeue``/``scontrol`` while SLURM remembers the
job, then from ``sacct`` (accounting) or ``sacct --completion`` (a job
completion log), so a cluster without a SLURM database works too.
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestrator.contract.errors import UserError
from orchestrator.contract.layout import PROJECT_ROOT, ResultsLayout, RunPaths, write_atomic
from orchestrator.contract.result import read_result
from orchestrator.job.command import LaunchSite
from orchestrator.job.execute import (
    Interrupted,
    Outcome,
    RunOptions,
    run_experiment,
    timeout_for,
    write_experiment_spec,
    write_outcome,
)
from orchestrator.matrix.experiment import Experiment

#: seconds between squeue calls once jobs have run a minute (every second before)
POLL_S = 5.0
ACTIVE_STATES = {
    "PENDING",
    "CONFIGURING",
    "RUNNING",
    "COMPLETING",
    "SUSPENDED",
    "REQUEUED",
    "RESIZING",
    "STAGE_OUT",
    "SIGNALING",
}
#: SLURM's ending -> our status, where SLURM's word decides
ENDINGS = {
    "TIMEOUT": "timeout",
    "DEADLINE": "timeout",
    "OUT_OF_MEMORY": "oom",
    "CANCELLED": "interrupted",
    "PREEMPTED": "interrupted",
    "NODE_FAIL": "failed",
    "BOOT_FAIL": "failed",
    "FAILED": "failed",
}


@dataclass(frozen=True)
class SlurmSettings:
    """Where and how to submit (the scenarios file's ``slurm:`` section and the flags)."""

    partition: str | None = None
    account: str | None = None
    #: time limit of each job, in minutes (default: the experiment's time limit + 5)
    time_min: int | None = None
    gpus_per_node: int | None = None
    cpus_per_task: int | None = None
    mem: str | None = None
    #: further sbatch options, name -> value (``{"qos": "high"}`` -> ``--qos=high``)
    options: Mapping[str, str] = field(default_factory=dict)
    #: submit the matrix as job arrays (one per resource shape), at most this many at once
    array: bool = False
    array_parallelism: int = 256
    wait: bool = True


def parse_time(text: str) -> int:
    """SLURM time (``MM``, ``HH:MM:SS``, ``D-HH:MM:SS``, ``MM:SS``) -> whole minutes, rounded up."""
    match = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", text.strip())
    if not match:
        raise UserError(
            f"--slurm-time {text!r} is not a SLURM time (minutes, HH:MM:SS or D-HH:MM:SS)"
        )
    days, a, b, c = match.groups()
    if b is None:  # minutes
        seconds = int(a) * 60
    elif c is None:  # MM:SS
        seconds = int(a) * 60 + int(b)
    else:  # HH:MM:SS
        seconds = int(a) * 3600 + int(b) * 60 + int(c)
    seconds += int(days or 0) * 86400
    if seconds <= 0:
        raise UserError(f"--slurm-time {text!r} must be positive")
    return math.ceil(seconds / 60)


# ---------------------------------------------------------------------------
# The cluster: checks before anything is submitted
# ---------------------------------------------------------------------------


def _run(argv: Sequence[str]) -> str:
    try:
        proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        raise UserError(f"{argv[0]} did not answer in 60 s; is the SLURM controller up?") from None
    if proc.returncode != 0:
        lines = [line.strip() for line in proc.stderr.splitlines() if line.strip()]
        last = lines[-1][:300] if lines else f"exit code {proc.returncode}"
        raise UserError(
            f"{argv[0]} failed ({last}); is this machine a node of a SLURM cluster "
            "(its slurm.conf, or SLURM_CONF)?"
        )
    return proc.stdout


def _gres_gpus(gres: str) -> int:
    """GPUs in a node's gres string (``gpu:a100:4(S:0-1),shard:8`` -> 4)."""
    total = 0
    for item in gres.split(","):
        parts = item.split("(")[0].split(":")
        if parts[0] == "gpu" and len(parts) >= 2 and parts[-1].isdigit():
            total += int(parts[-1])
    return total


@dataclass(frozen=True)
class NodeInfo:
    name: str
    cpus: int
    gpus: int


def nodes(partition: str | None) -> list[NodeInfo]:
    argv = ["sinfo", "-h", "-N", "-o", "%N %c %G"]
    if partition:
        argv += ["-p", partition]
    seen: dict[str, NodeInfo] = {}
    for line in _run(argv).splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[1].isdigit():
            seen[parts[0]] = NodeInfo(
                parts[0], int(parts[1]), _gres_gpus(parts[2]) if len(parts) > 2 else 0
            )
    return list(seen.values())


def shape(
    experiment: Experiment, settings: SlurmSettings, gpus_per_node: int
) -> tuple[int, int | None, int]:
    """(nodes, GPUs per node, CPUs per task) of an experiment's job."""
    if experiment.device == "gpu":
        per_node = settings.gpus_per_node or gpus_per_node or experiment.num_gpus
        per_node = min(per_node, experiment.num_gpus)
        count = math.ceil(experiment.num_gpus / per_node)
        cpus = settings.cpus_per_task or max(1, 4 * per_node)
        return count, per_node, cpus
    return 1, None, settings.cpus_per_task or experiment.num_gpus


def expected_seconds(layout: ResultsLayout, experiment: Experiment) -> float | None:
    """How long the longest earlier ok run of this cell took, from the folder's history."""
    from orchestrator.results import history

    return history.longest_ok_job(history.path_for(layout.root), experiment.cell_id)


def _require_slurm() -> None:
    if shutil.which("sbatch") is None or shutil.which("sinfo") is None:
        raise UserError("--executor slurm: sbatch is not on the PATH (is this a SLURM login node?)")


def cluster_gpus(partition: str | None) -> int:
    """The most GPUs one node of the partition has (what ``--num-gpus`` defaults are capped at)."""
    _require_slurm()
    return max((n.gpus for n in nodes(partition)), default=0)


@dataclass(frozen=True)
class ClusterInfo:
    """What the checks found out, and what the submission uses."""

    #: the most GPUs one node has
    most_gpus: int
    #: the partition's MaxTime in minutes (None: unlimited)
    max_time_min: int | None


def _partitions() -> dict[str, int | None]:
    """Partition -> MaxTime in minutes (None: infinite); the default partition first."""
    found: dict[str, int | None] = {}
    default: list[str] = []
    for line in _run(["sinfo", "-h", "-o", "%P %l"]).splitlines():
        parts = line.split()
        if not parts:
            continue
        name = parts[0].rstrip("*")
        if parts[0].endswith("*"):
            default.append(name)
        limit = parts[1] if len(parts) > 1 else "infinite"
        try:
            found[name] = None if limit in ("infinite", "UNLIMITED", "n/a") else parse_time(limit)
        except UserError:
            found[name] = None
    return {**{d: found[d] for d in default}, **found}


def job_minutes(settings: SlurmSettings, timeout_s: float, max_time_min: int | None) -> int:
    """The SLURM time limit of a job: the user's, else the experiment's own limit + 5 minutes
    (capped at the partition's maximum, so our limit, not SLURM's, stops a job first)."""
    if settings.time_min is not None:
        return settings.time_min
    derived = math.ceil(timeout_s / 60) + 5
    return min(derived, max_time_min) if max_time_min else derived


def check_cluster(
    experiments: Sequence[Experiment],
    settings: SlurmSettings,
    layout: ResultsLayout,
    timeout_of: Callable[[Experiment], float],
) -> ClusterInfo:
    """Refuse, in one line, what SLURM would refuse (or kill) after the submission."""
    _require_slurm()
    try:
        import submitit  # noqa: F401
    except ImportError:
        raise UserError("--executor slurm needs submitit: pip install submitit") from None
    partitions = _partitions()
    if settings.partition and settings.partition not in partitions:
        raise UserError(
            f"unknown SLURM partition {settings.partition!r}; partitions: {', '.join(partitions) or 'none'}"
        )
    partition = settings.partition or next(iter(partitions), None)
    max_time = partitions.get(partition) if partition else None
    if settings.time_min is not None and max_time is not None and settings.time_min > max_time:
        raise UserError(
            f"SLURM time limit of {settings.time_min} min is above partition {partition}'s "
            f"maximum of {max_time} min"
        )
    available = nodes(settings.partition)
    if not available:
        raise UserError(f"no nodes in SLURM partition {settings.partition or '(default)'}")
    most_gpus = max(n.gpus for n in available)
    total_gpus = sum(n.gpus for n in available)
    most_cpus = max(n.cpus for n in available)
    where = f"partition {partition}" if partition else "the cluster"
    for e in experiments:
        count, per_node, cpus = shape(e, settings, most_gpus)
        if e.device == "gpu":
            if e.num_gpus > total_gpus:
                raise UserError(
                    f"{e.experiment_id} needs {e.num_gpus} GPUs; {where} has {total_gpus} "
                    f"({len(available)} node(s), at most {most_gpus} per node)"
                )
            if per_node and per_node > most_gpus:
                raise UserError(
                    f"{e.experiment_id} needs {per_node} GPUs per node; nodes of {where} have at most {most_gpus}"
                )
            if count > len(available):
                raise UserError(
                    f"{e.experiment_id} needs {count} nodes; {where} has {len(available)}"
                )
        if cpus > most_cpus:
            raise UserError(
                f"{e.experiment_id} needs {cpus} CPUs per task; nodes of {where} have at most {most_cpus}"
            )
        limit = job_minutes(settings, timeout_of(e), max_time)
        expected = expected_seconds(layout, e)
        if expected is not None and limit * 60 < expected:
            raise UserError(
                f"SLURM time limit of {limit} min is below the expected run of "
                f"{expected / 60:.1f} min ({e.experiment_id} took that long before in "
                f"{layout.root}); raise --slurm-time"
            )
    return ClusterInfo(most_gpus=most_gpus, max_time_min=max_time)


# ---------------------------------------------------------------------------
# Inside the job
# ---------------------------------------------------------------------------


def _job_id() -> str:
    array, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    if array and task:
        return f"{array}_{task}"
    return os.environ.get("SLURM_JOB_ID", "unknown")


def _first_host() -> str | None:
    nodelist = os.environ.get("SLURM_JOB_NODELIST") or os.environ.get("SLURM_NODELIST")
    if not nodelist:
        return None
    try:
        hosts = subprocess.run(
            ["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, timeout=30
        ).stdout.split()
    except (OSError, subprocess.TimeoutExpired):
        hosts = []
    return hosts[0] if hosts else nodelist.split(",")[0]


def slurm_task(
    experiment: Experiment, run: RunPaths, layout: ResultsLayout, options: RunOptions, attempt: int
) -> str:
    """What each node of the job runs (called by submitit inside the allocation)."""

    def on_term(signum: int, frame: Any) -> None:
        raise Interrupted(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_term)
    # submitit asks SLURM for an early USR2 to checkpoint and requeue; a benchmark
    # is not resumable, so it runs to SLURM's limit and stops on TERM like any job
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    job_id = _job_id()
    machines = int(os.environ.get("SLURM_JOB_NUM_NODES") or os.environ.get("SLURM_NNODES") or 1)
    rank = int(os.environ.get("SLURM_NODEID", "0"))
    site = LaunchSite(
        num_machines=machines,
        machine_rank=rank,
        main_process_ip=_first_host() if machines > 1 else None,
    )
    devices = (
        [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d]
        if experiment.device == "gpu"
        else []
    )
    # every node must agree on the port without talking: derive it from the job id
    digits = int(re.sub(r"\D", "", job_id) or "0")
    port = 20000 + digits % 20000
    outcome = run_experiment(
        experiment,
        run,
        layout,
        options,
        devices,
        attempt=attempt,
        site=site,
        port=port,
        slurm_job_id=job_id,
        # every node of the job gets the same one, so a rank that the launcher
        # stops on node 1 cannot replace node 0's report of the real failure
        launch_id=f"slurm-{job_id}-{os.environ.get('SLURM_RESTART_COUNT', '0')}-{attempt}",
    )
    return outcome.status


# ---------------------------------------------------------------------------
# States and outcomes
# ---------------------------------------------------------------------------


class Unreachable(Exception):
    """squeue could not ask the controller; no state is known."""


def states(job_ids: Iterable[str]) -> dict[str, str]:
    """The current or final state of each job (``RUNNING``, ``COMPLETED``, ``TIMEOUT``, ...).

    A job SLURM no longer knows of (no accounting, no completion log, past
    ``MinJobAge``) is ``UNKNOWN``. Raises ``Unreachable`` when the controller
    does not answer, so a slow controller never passes for ended jobs.
    """
    ids = [j for j in job_ids if j]
    out: dict[str, str] = {}
    if not ids:
        return out
    try:
        proc = subprocess.run(
            ["squeue", "-h", "-j", ",".join(ids), "-o", "%i %T"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise Unreachable(str(exc)) from None
    if proc.returncode != 0 and "invalid job id" not in proc.stderr.lower():
        raise Unreachable(" ".join(proc.stderr.split())[:300])
    for line in proc.stdout.splitlines():
        parts = line.split()
        if len(parts) == 2:
            out[parts[0]] = parts[1]
    for job in ids:
        if job in out:
            continue
        out[job] = (
            _scontrol_state(job)
            or _sacct_state(job, completion=False)
            or _sacct_state(job, completion=True)
            or "UNKNOWN"
        )
    return out


def active(state: str | None) -> bool:
    return state is not None and state.split("+")[0] in ACTIVE_STATES


def _scontrol_state(job: str) -> str | None:
    try:
        text = subprocess.run(
            ["scontrol", "show", "job", "-o", job], capture_output=True, text=True, timeout=30
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r"\bJobState=(\S+)", text)
    return match.group(1) if match else None


def _sacct_state(job: str, *, completion: bool) -> str | None:
    argv = ["sacct", "-n", "-P", "-X", "-o", "JobID,State", "-j", job]
    if completion:
        argv.insert(1, "--completion")
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in proc.stdout.splitlines():
        parts = line.split("|")
        if len(parts) >= 2 and parts[0].strip() == job:
            return parts[1].split()[0] if parts[1].strip() else None
    return None


def final_outcome(run: RunPaths, layout: ResultsLayout, job_id: str, state: str | None) -> Outcome:
    """The outcome of a finished job: the task's own, unless SLURM's ending says more."""
    recorded = read_result(run.dir / "outcome.json") or {}
    outcome = Outcome(status="failed")
    for key, value in recorded.items():
        if key in Outcome.__dataclass_fields__:
            setattr(outcome, key, value)
    outcome.executor, outcome.slurm_job_id = "slurm", job_id
    outcome.log = outcome.log or str(run.stderr.relative_to(layout.root))
    base = (state or "UNKNOWN").split("+")[0]
    own = recorded.get("status")
    # SLURM's word decides where it stopped the job; the job's own diagnosis where
    # it finished (ok, or a CUDA OOM it classified), or where SLURM only says FAILED
    if base in ENDINGS and own not in ("ok", "oom") and not (base == "FAILED" and recorded):
        outcome.status = ENDINGS[base]
        detail = f"; the job's own record: {recorded['error']}" if recorded.get("error") else ""
        outcome.error = f"SLURM ended job {job_id} as {base}{detail}"
    elif not recorded:
        outcome.status = "failed"
        outcome.error = f"SLURM job {job_id} ended {base} without an outcome"
    if not recorded:
        # the task never wrote its files: SLURM's own log of the job says why
        log = layout.root / "slurm" / job_id / f"{job_id}_0_log.err"
        if log.is_file():
            outcome.log = str(log.relative_to(layout.root))
    write_outcome(run, outcome)
    return outcome


def _submitted_without_outcome(layout: ResultsLayout) -> dict[str, RunPaths]:
    pending: dict[str, RunPaths] = {}
    if not layout.runs.is_dir():
        return pending
    for run_dir in layout.runs.iterdir():
        if (run_dir / "outcome.json").exists():
            continue
        record = read_result(run_dir / "slurm.json")
        if record and record.get("job_id"):
            pending[str(record["job_id"])] = RunPaths(run_dir)
    return pending


def settle(layout: ResultsLayout) -> tuple[int, list[str]]:
    """Give every submitted job that has ended an outcome (``tunematrix report`` calls this).

    Returns how many were collected and the ids of the jobs still queued or running.
    """
    pending = _submitted_without_outcome(layout)
    if not pending or shutil.which("squeue") is None:
        return 0, []
    try:
        found = states(pending)
    except Unreachable:
        return 0, sorted(pending)
    done, running = 0, []
    for job, run in pending.items():
        state = found.get(job)
        if active(state):
            running.append(job)
            continue
        final_outcome(run, layout, job, state)
        done += 1
    return done, sorted(running)


# ---------------------------------------------------------------------------
# The executor
# ---------------------------------------------------------------------------


@dataclass
class _Submitted:
    experiment: Experiment
    run: RunPaths
    job: Any
    attempt: int


def _executor(
    layout: ResultsLayout,
    settings: SlurmSettings,
    experiment: Experiment,
    job_shape: tuple[int, int | None, int],
    time_min: int,
) -> Any:
    import submitit

    count, per_node, cpus = job_shape
    folder = layout.root / "slurm" / "%j"
    ex = submitit.SlurmExecutor(folder=str(folder), max_num_timeout=0)
    params: dict[str, Any] = {
        "job_name": f"tunematrix-{experiment.scenario}"[:64],
        "time": time_min,
        "nodes": count,
        "ntasks_per_node": 1,
        "cpus_per_task": cpus,
        "signal_delay_s": 30,
        "setup": [
            f"export PYTHONPATH={shlex.quote(str(PROJECT_ROOT))}${{PYTHONPATH:+:$PYTHONPATH}}"
        ],
        "array_parallelism": settings.array_parallelism,
    }
    if per_node:
        params["gpus_per_node"] = per_node
    for name, value in (
        ("partition", settings.partition),
        ("account", settings.account),
        ("mem", settings.mem),
    ):
        if value:
            params[name] = value
    if settings.options:
        params["additional_parameters"] = dict(settings.options)
    ex.update_parameters(**params)
    return ex


def make_executor(settings: SlurmSettings, cluster: ClusterInfo) -> Any:
    """The runner's executor hook for SLURM (``check_cluster`` found ``cluster``)."""

    def run_on_slurm(ctx: Any, stopping: list[int]) -> None:
        from orchestrator.running.runner import _prepare

        layout: ResultsLayout = ctx.layout
        options: RunOptions = ctx.options
        todo: list[tuple[Experiment, RunPaths, int]] = []
        for experiment in ctx.plan.experiments:
            ready = _prepare(experiment, layout, options, gpus=10**6)  # checked against SLURM
            if isinstance(ready, Outcome):
                ctx.record(experiment.experiment_id, ready, counted=False)
            else:
                todo.append((experiment, ready.run, ready.attempt))

        def resources(e: Experiment) -> tuple[tuple[int, int | None, int], int]:
            minutes = job_minutes(settings, timeout_for(e, options), cluster.max_time_min)
            return shape(e, settings, cluster.most_gpus), minutes

        submitted: list[_Submitted] = []
        try:
            # one submission per experiment, or one array per resource shape
            groups: dict[Any, list[tuple[Experiment, RunPaths, int]]] = {}
            for item in todo:
                key = resources(item[0]) if settings.array else item[0].experiment_id
                groups.setdefault(key, []).append(item)
            for items in groups.values():
                e0 = items[0][0]
                job_shape, minutes = resources(e0)
                ex = _executor(layout, settings, e0, job_shape, minutes)
                for e, run, _ in items:
                    run.dir.mkdir(parents=True, exist_ok=True)
                    # every node of a multi-node job reads it; none must wait for another
                    write_experiment_spec(e, run, layout, options)
                try:
                    if settings.array and len(items) > 1:
                        jobs = ex.map_array(
                            slurm_task,
                            [e for e, _, _ in items],
                            [run for _, run, _ in items],
                            [layout] * len(items),
                            [options] * len(items),
                            [attempt for _, _, attempt in items],
                        )
                    else:
                        jobs = [
                            ex.submit(slurm_task, e, run, layout, options, attempt)
                            for e, run, attempt in items
                        ]
                except (KeyboardInterrupt, Interrupted):
                    raise
                except Exception as exc:  # sbatch said no: nothing half-submitted stays
                    _cancel(ctx, submitted)
                    words = " ".join(str(exc).split()) or type(exc).__name__
                    raise UserError(f"sbatch refused {e0.experiment_id}: {words[:300]}") from None
                for (e, run, attempt), job in zip(items, jobs, strict=True):
                    record = {
                        "job_id": str(job.job_id),
                        "submitted_at": time.time(),
                        "array": settings.array,
                    }
                    write_atomic(run.dir / "slurm.json", json.dumps(record) + "\n")
                    submitted.append(_Submitted(e, run, job, attempt))
                    ctx.progress.message(f"submitted {e.experiment_id} as SLURM job {job.job_id}")
            if not settings.wait:
                for s in submitted:
                    ctx.outcomes[s.experiment.experiment_id] = Outcome(
                        status="planned",
                        error=f"submitted to SLURM as job {s.job.job_id}; `tunematrix report` collects it",
                        executor="slurm",
                        slurm_job_id=str(s.job.job_id),
                    )
                return
            _wait(ctx, submitted, stopping)
        except (KeyboardInterrupt, Interrupted):
            _cancel(ctx, submitted)
            raise Interrupted("stopped") from None

    return run_on_slurm


def _wait(ctx: Any, submitted: list[_Submitted], stopping: list[int]) -> None:
    left = {str(s.job.job_id): s for s in submitted}
    for s in submitted:
        # the child's progress file is in the run folder, on the shared filesystem
        ctx.progress.begin(s.experiment.experiment_id, s.run.progress)
    unreachable_said = False
    waiting_since = time.monotonic()
    while left:
        try:
            found = states(left)
        except Unreachable as exc:
            if not unreachable_said:
                ctx.progress.message(f"squeue does not answer ({exc}); still waiting")
                unreachable_said = True
            found = {}
        for job_id, s in list(left.items()):
            state = found.get(job_id)
            if state is None or active(state):
                continue
            outcome = final_outcome(s.run, ctx.layout, job_id, state)
            del left[job_id]
            ctx.record(s.experiment.experiment_id, outcome)
            if ctx.stop_after_failure(s.experiment.experiment_id):
                _cancel(ctx, list(left.values()))
                return
        if left:
            # quick answers for short jobs, then a gentle pace for the controller
            pause = 1.0 if time.monotonic() - waiting_since < 60 else POLL_S
            deadline = time.monotonic() + pause
            while time.monotonic() < deadline:
                ctx.progress.tick()
                time.sleep(1.0)


def _cancel(ctx: Any, submitted: Sequence[_Submitted]) -> None:
    """scancel our jobs and wait (a little) until SLURM has let them go."""
    ids = [str(s.job.job_id) for s in submitted]
    if not ids:
        return
    subprocess.run(["scancel", *ids], capture_output=True, timeout=60)
    deadline = time.monotonic() + 60
    found: dict[str, str] = {}
    while time.monotonic() < deadline:
        try:
            found = states(ids)
        except Unreachable:
            found = {}
        if found and not any(active(st) for st in found.values()):
            break
        time.sleep(1.0)
    for s in submitted:
        eid = s.experiment.experiment_id
        if eid in ctx.outcomes:
            continue
        job_id = str(s.job.job_id)
        outcome = final_outcome(s.run, ctx.layout, job_id, found.get(job_id, "CANCELLED"))
        if outcome.status not in ("ok",):
            outcome.status = "interrupted"
            outcome.error = f"cancelled with the run (SLURM job {job_id})"
            write_outcome(s.run, outcome)
        ctx.record(eid, outcome)
