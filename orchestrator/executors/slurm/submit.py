"""Submitting a plan's experiments as SLURM jobs (through submitit), waiting, cancelling.

One job per experiment, or one array per resource shape. The orchestrator
waits with progress (or, with ``--no-wait``, returns; ``tunematrix report``
collects later), and cancels its jobs when it is interrupted.
"""

from __future__ import annotations

import shlex
import subprocess
import time
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.contract.errors import UserError
from orchestrator.contract.layout import PROJECT_ROOT, ResultsLayout, RunPaths
from orchestrator.contract.outcome import Outcome, write_outcome
from orchestrator.executors.base import Ready, RunContext
from orchestrator.executors.slurm.cluster import ClusterInfo, job_minutes, shape
from orchestrator.executors.slurm.jobs import (
    Unreachable,
    active,
    final_outcome,
    record_submission,
    states,
)
from orchestrator.executors.slurm.settings import NAME, SlurmSettings
from orchestrator.executors.slurm.task import slurm_task
from orchestrator.job import nodes
from orchestrator.job.execute import Interrupted, timeout_for, write_experiment_spec
from orchestrator.matrix.experiment import Experiment

#: seconds between squeue calls once jobs have run a minute (every second before)
POLL_S = 5.0

JobShape = tuple[int, int | None, int]


@dataclass
class Submitted:
    experiment: Experiment
    run: RunPaths
    #: submitit's job
    job: Any
    attempt: int

    @property
    def job_id(self) -> str:
        return str(self.job.job_id)


def sbatch_parameters(
    settings: SlurmSettings, experiment: Experiment, job_shape: JobShape, time_min: int
) -> dict[str, Any]:
    """submitit's ``SlurmExecutor`` parameters of one job (or array) of this shape."""
    count, per_node, cpus = job_shape
    params: dict[str, Any] = {
        "job_name": f"tunematrix-{experiment.scenario}"[:64],
        "time": time_min,
        "nodes": count,
        "ntasks_per_node": 1,
        "cpus_per_task": cpus,
        # no early USR2: submitit asks for one to checkpoint and requeue, but a
        # benchmark is not resumable, and under a short limit SLURM sends it as the
        # job starts, before the task can ignore it (the job then ends FAILED, not
        # TIMEOUT); "@0" asks SLURM for no signal before TERM at the limit
        "signal_delay_s": 0,
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
    if settings.exclusive:
        params["exclusive"] = True
    if settings.options:
        params["additional_parameters"] = dict(settings.options)
    return params


def _submitit_executor(
    layout: ResultsLayout,
    settings: SlurmSettings,
    experiment: Experiment,
    job_shape: JobShape,
    time_min: int,
) -> Any:
    import submitit

    ex = submitit.SlurmExecutor(folder=str(layout.job_logs(NAME, "%j")), max_num_timeout=0)
    ex.update_parameters(**sbatch_parameters(settings, experiment, job_shape, time_min))
    return ex


def run_on_slurm(ctx: RunContext, settings: SlurmSettings, cluster: ClusterInfo) -> None:
    """Submit every experiment of the plan, then wait (or return, with ``--no-wait``)."""
    todo = [
        ready
        for experiment in ctx.plan.experiments
        # the GPUs were checked against the cluster, not this machine
        if (ready := ctx.prepare(experiment, gpus=None)) is not None
    ]

    def resources(e: Experiment) -> tuple[JobShape, int]:
        minutes = job_minutes(settings, timeout_for(e, ctx.options), cluster.max_time_min)
        return shape(e, settings, cluster.most_gpus, cluster.most_cpus), minutes

    submitted: list[Submitted] = []
    try:
        # one submission per experiment, or one array per resource shape
        groups: dict[Hashable, list[Ready]] = {}
        for ready in todo:
            e = ready.experiment
            key: Hashable = resources(e) if settings.array else e.experiment_id
            groups.setdefault(key, []).append(ready)
        for items in groups.values():
            _submit_group(ctx, settings, items, resources(items[0].experiment), submitted)
        if not settings.wait:
            for s in submitted:
                ctx.outcomes[s.experiment.experiment_id] = Outcome(
                    status="planned",
                    error=f"submitted to SLURM as job {s.job_id}; `tunematrix report` collects it",
                    executor=NAME,
                    job_id=s.job_id,
                )
            return
        _wait(ctx, submitted)
    except (KeyboardInterrupt, Interrupted):
        _cancel(ctx, submitted)
        raise Interrupted("stopped") from None


def _submit_group(
    ctx: RunContext,
    settings: SlurmSettings,
    items: list[Ready],
    resources: tuple[JobShape, int],
    submitted: list[Submitted],
) -> None:
    """Submit one group (one experiment, or an array of one shape), adding its jobs to
    ``submitted``; on a refusal, cancel every job ``submitted`` holds."""
    e0 = items[0].experiment
    job_shape, minutes = resources
    ex = _submitit_executor(ctx.layout, settings, e0, job_shape, minutes)
    for ready in items:
        ready.run.dir.mkdir(parents=True, exist_ok=True)
        nodes.clear_node_outcomes(ready.run)
        # every node of a multi-node job reads it; none must wait for another
        write_experiment_spec(ready.experiment, ready.run, ctx.layout, ctx.options)
    try:
        if settings.array and len(items) > 1:
            jobs = ex.map_array(
                slurm_task,
                [r.experiment for r in items],
                [r.run for r in items],
                [ctx.layout] * len(items),
                [ctx.options] * len(items),
                [r.attempt for r in items],
            )
        else:
            jobs = [
                ex.submit(slurm_task, r.experiment, r.run, ctx.layout, ctx.options, r.attempt)
                for r in items
            ]
    except (KeyboardInterrupt, Interrupted):
        raise
    except Exception as exc:  # sbatch said no: nothing half-submitted stays
        _cancel(ctx, submitted)
        words = " ".join(str(exc).split()) or type(exc).__name__
        raise UserError(f"sbatch refused {e0.experiment_id}: {words[:300]}") from None
    for ready, job in zip(items, jobs, strict=True):
        s = Submitted(ready.experiment, ready.run, job, ready.attempt)
        record_submission(ready.run, s.job_id, settings.array)
        submitted.append(s)
        ctx.progress.message(f"submitted {ready.experiment.experiment_id} as SLURM job {s.job_id}")


def _wait(ctx: RunContext, submitted: list[Submitted]) -> None:
    left = {s.job_id: s for s in submitted}
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


def _cancel(ctx: RunContext, submitted: Sequence[Submitted]) -> None:
    """scancel our jobs and wait (a little) until SLURM has let them go."""
    ids = [s.job_id for s in submitted]
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
        outcome = final_outcome(s.run, ctx.layout, s.job_id, found.get(s.job_id, "CANCELLED"))
        if outcome.status not in ("ok",):
            outcome.status = "interrupted"
            outcome.error = f"cancelled with the run (SLURM job {s.job_id})"
            write_outcome(s.run, outcome)
        ctx.record(eid, outcome)
