"""Submitting a plan's experiments as Ray tasks, waiting with progress, cancelling.

Every experiment is submitted at once, each a task asking for its GPUs (or
CPUs): Ray's scheduler places and packs them across the nodes. Each outcome is
recorded as its task ends. On Ctrl-C every task is cancelled, gracefully first
(the task's ``run_experiment`` stops its process group and writes an
``interrupted`` outcome), then by force.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from orchestrator.contract.layout import ResultsLayout, RunPaths, write_atomic
from orchestrator.contract.outcome import Outcome, Status, read_outcome, write_outcome
from orchestrator.executors.base import Ready, RunContext
from orchestrator.executors.raycluster.cluster import (
    NodeInfo,
    alive_nodes,
    reason,
    requests,
    runtime_env,
)
from orchestrator.executors.raycluster.settings import NAME, RaySettings
from orchestrator.executors.raycluster.task import ray_task
from orchestrator.job.execute import Interrupted, write_experiment_spec

#: seconds a gracefully cancelled task has to stop its job and write its outcome
CANCEL_GRACE_S = 20.0
#: seconds between looks at the tasks
POLL_S = 0.5


@dataclass
class Submitted:
    ready: Ready
    ref: Any
    task_id: str

    @property
    def eid(self) -> str:
        return self.ready.experiment.experiment_id

    @property
    def run(self) -> RunPaths:
        return self.ready.run


def record_submission(run: RunPaths, name: str) -> None:
    """``ray.json``, written before the submission: the task's name (the task adds its id
    and where it ran; its id is also the outcome's ``job_id``)."""
    record = {"name": name, "submitted_at": time.time()}
    write_atomic(run.job_record(NAME), json.dumps(record) + "\n")


def read_record(run: RunPaths) -> dict[str, Any]:
    try:
        found = json.loads(run.job_record(NAME).read_text())
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def where_it_ran(run: RunPaths) -> str:
    """The node a task ran on, from what it recorded in ``ray.json``."""
    record = read_record(run)
    if record.get("node_ip"):
        node = NodeInfo(
            str(record.get("node_id", "?")),
            str(record["node_ip"]),
            str(record.get("hostname", "?")),
        )
        return node.describe()
    return "a Ray node (the task never started)"


def failure_status(exc: BaseException, node_alive: bool | None) -> tuple[Status, str]:
    """Our status for a task that raised ``exc`` instead of returning (pure, but for names)."""
    from ray import exceptions as rex

    if isinstance(exc, rex.OutOfMemoryError):
        return "oom", "Ray's memory monitor killed the task"
    if isinstance(exc, rex.TaskCancelledError):
        return "interrupted", "cancelled with the run"
    if isinstance(exc, (rex.NodeDiedError,)) or node_alive is False:
        return "failed", "the node died while running it"
    if isinstance(exc, (rex.WorkerCrashedError, rex.LocalRayletDiedError)):
        return "failed", "the Ray worker running it died"
    return "failed", "the Ray task raised"


def final_outcome(s: Submitted, layout: ResultsLayout, exc: BaseException | None) -> Outcome:
    """The outcome of an ended task: the job's own (outcome.json), unless Ray's ending says more."""
    recorded = read_outcome(s.run)
    if exc is None and recorded is not None:
        outcome = recorded.model_copy()
        outcome.executor, outcome.job_id = NAME, s.task_id
        return outcome
    record = read_record(s.run)
    node_alive: bool | None = None
    if record.get("node_id"):
        node_alive = any(n.node_id == record["node_id"] for n in alive_nodes())
    said: str | None = None
    if exc is None:
        status: Status = "failed"
        why = "the Ray task ended without an outcome"
    else:
        status, why = failure_status(exc, node_alive)
        if recorded is not None and recorded.status in ("ok", "oom", "timeout"):
            # the job had finished and said how before the worker went
            status, why = recorded.status, recorded.error or why
        elif recorded is not None and recorded.error:
            # Ray's ending chose the status; what the job said is kept after it
            said = recorded.error
    where = where_it_ran(s.run)
    detail = f"; {reason(exc)}" if exc is not None else ""
    outcome = recorded.model_copy() if recorded is not None else Outcome(status=status)
    outcome.status = status
    if status != "ok":
        outcome.error = f"{why} (Ray task {s.task_id} on {where}{detail})"
        if said:
            outcome.error += f"; the job said: {said}"
    outcome.executor, outcome.job_id = NAME, s.task_id
    outcome.attempt = s.ready.attempt
    outcome.log = outcome.log or layout.relative(s.run.stderr)
    write_outcome(s.run, outcome)
    return outcome


def submit_all(
    ctx: RunContext, settings: RaySettings, todo: list[Ready], submitted: list[Submitted]
) -> None:
    """Submit every experiment of ``todo``, appending each to ``submitted`` as it is
    submitted: an interrupt midway cancels what was submitted before it."""
    import ray

    remote = ray.remote(ray_task)
    cwd = os.getcwd()
    # absolute paths: the task's worker has a folder of its own
    layout = ResultsLayout(ctx.layout.root.resolve())
    # the driver's, for every task: as the same experiment run from here would have it
    threads = os.environ.get("OMP_NUM_THREADS")
    for ready in todo:
        e = ready.experiment
        ready.run.dir.mkdir(parents=True, exist_ok=True)
        write_experiment_spec(e, ready.run, ctx.layout, ctx.options)
        wanted = dict(requests(e, settings))
        gpus, cpus = wanted.pop("GPU", 0.0), wanted.pop("CPU", 0.0)
        name = f"tunematrix:{e.experiment_id}"[:128]
        # before the submission: the task may start (and add to it) at once
        record_submission(ready.run, name)
        ref = remote.options(
            name=name,
            num_cpus=cpus,
            num_gpus=gpus,
            resources=wanted or None,
            max_retries=0,
            runtime_env=runtime_env(),
        ).remote(e, layout.run(e.experiment_id), layout, ctx.options, ready.attempt, cwd, threads)
        task_id = _task_id(ref)
        submitted.append(Submitted(ready, ref, task_id))
        ctx.progress.message(f"submitted {e.experiment_id} as Ray task {task_id}")


def _task_id(ref: Any) -> str:
    """The id of the task behind ``ref`` (``ray list tasks``); the object's id where the
    reference does not tell (a Ray Client's)."""
    try:
        return str(ref.task_id().hex())
    except AttributeError:
        return str(ref.hex())


def run_on_ray(ctx: RunContext, settings: RaySettings) -> None:
    """Submit every experiment of the plan, then wait, recording each outcome as it ends."""
    todo = [
        ready
        for experiment in ctx.plan.experiments
        # the GPUs were checked against the cluster's nodes, not this machine
        if (ready := ctx.prepare(experiment, gpus=None)) is not None
    ]
    submitted: list[Submitted] = []
    try:
        submit_all(ctx, settings, todo, submitted)
        _wait(ctx, submitted)
    except (KeyboardInterrupt, Interrupted):
        cancel(ctx, submitted)
        raise Interrupted("stopped") from None


#: an experiment's task: (node id, started, ended); None where not known (yet)
Span = tuple[str | None, float | None, float | None]


def beside(eid: str, spans: Mapping[str, Span]) -> list[str]:
    """The experiments whose tasks ran on ``eid``'s node while ``eid``'s did (pure).

    A task still running has no end; one that never started has no node.
    """
    node, start, end = spans[eid]
    if node is None or start is None:
        return []
    return sorted(
        other
        for other, (o_node, o_start, o_end) in spans.items()
        if other != eid
        and o_node == node
        and o_start is not None
        and (end is None or o_start < end)
        and (o_end is None or o_end > start)
    )


def span(record: Mapping[str, Any], seen_ended: float | None) -> Span:
    """A task's span from its ``ray.json``: start and end by its node's clock; where the task
    recorded no end (it did not return), ``seen_ended``, when the driver saw it end (pure)."""

    def number(key: str) -> float | None:
        value = record.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return None
        return float(value)

    node = record.get("node_id")
    ended = number("ended_at")
    return (
        str(node) if node else None,
        number("started_at"),
        ended if ended is not None else seen_ended,
    )


def _spans(submitted: list[Submitted], ended: Mapping[str, float]) -> dict[str, Span]:
    return {s.eid: span(read_record(s.run), ended.get(s.eid)) for s in submitted}


def _mark_packed(s: Submitted, outcome: Outcome, partners: list[str]) -> None:
    """A task that shared its node with others ran packed: say so in its outcome, as
    ``--pack`` does, so its figures never pass for an exclusive run's."""
    if partners:
        outcome.run_mode, outcome.packed_with = "packed", partners
        write_outcome(s.run, outcome)


def _wait(ctx: RunContext, submitted: list[Submitted]) -> None:
    import ray

    left = {s.ref: s for s in submitted}
    #: when each task was seen to end (within POLL_S of its end)
    ended: dict[str, float] = {}
    for s in submitted:
        # the child's progress file is in the run folder, on the shared filesystem
        ctx.progress.begin(s.eid, s.run.progress)
    while left:
        try:
            # no waiting inside Ray: a signal's exception raised in its wait comes out as
            # a SystemError; the pause is Python's own
            done, _ = ray.wait(list(left), num_returns=len(left), timeout=0)
        except SystemError:
            if ctx.stopping:
                raise Interrupted("stopped") from None
            raise
        now = time.time()
        for ref in done:
            ended[left[ref].eid] = now
        for ref in done:
            s = left.pop(ref)
            outcome = final_outcome(s, ctx.layout, _raised(ref))
            _mark_packed(s, outcome, beside(s.eid, _spans(submitted, ended)))
            ctx.record(s.eid, outcome)
            if ctx.stop_after_failure(s.eid):
                cancel(ctx, list(left.values()))
                return
        if ctx.stopping:
            raise Interrupted("stopped")
        if left:
            ctx.progress.tick()
            time.sleep(POLL_S)


def _raised(ref: Any) -> BaseException | None:
    import ray

    try:
        ray.get(ref, timeout=60)
    except Exception as exc:
        return exc
    return None


def cancel(ctx: RunContext, submitted: list[Submitted]) -> None:
    """Cancel the tasks still running: gracefully (KeyboardInterrupt in the task, so
    ``run_experiment`` stops the job and writes its outcome), then by force."""
    import ray

    left = {s.ref: s for s in submitted if s.eid not in ctx.outcomes}
    if not left:
        return
    for ref in left:
        ray.cancel(ref, force=False)
    ready, pending = ray.wait(list(left), num_returns=len(left), timeout=CANCEL_GRACE_S)
    for ref in pending:
        ray.cancel(ref, force=True)
    if pending:
        ray.wait(pending, num_returns=len(pending), timeout=10.0)
    for ref, s in left.items():
        outcome = final_outcome(s, ctx.layout, _raised(ref) if ref in ready else None)
        if outcome.status != "ok":
            outcome.status = "interrupted"
            outcome.error = (
                f"cancelled with the run (Ray task {s.task_id} on {where_it_ran(s.run)})"
            )
            write_outcome(s.run, outcome)
        ctx.record(s.eid, outcome)
