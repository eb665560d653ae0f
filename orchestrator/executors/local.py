"""The default executor: on this machine, one experiment at a time.

Exclusive, because jobs side by side share CPU, PCIe and NVLink and disturb
each other's numbers. Each job gets the first GPUs it needs.
"""

from __future__ import annotations

from orchestrator.executors.base import Executor, RunContext
from orchestrator.job.execute import Interrupted, Placement, run_experiment


def gpu_pool() -> list[str]:
    """The GPUs this orchestrator may hand out, as CUDA_VISIBLE_DEVICES entries."""
    from orchestrator.job.hardware import gpu_count, visible_devices

    visible = visible_devices()
    count = gpu_count()
    if visible is not None:
        return visible[:count]
    return [str(i) for i in range(count)]


def plan_pool(ctx: RunContext) -> list[str]:
    """The GPUs for this plan's jobs (none looked for when every job runs on the CPU)."""
    return gpu_pool() if any(e.device == "gpu" for e in ctx.plan.experiments) else []


class LocalExecutor(Executor):
    name = "local"
    title = "local"
    summary = "run here, one at a time (the default)"

    def run(self, ctx: RunContext) -> None:
        pool = plan_pool(ctx)
        for experiment in ctx.plan.experiments:
            eid = experiment.experiment_id
            ready = ctx.prepare(experiment, gpus=len(pool))
            if ready is not None:
                devices = pool[: experiment.num_gpus] if experiment.device == "gpu" else []
                ctx.progress.begin(eid, ready.run.progress)
                outcome = run_experiment(
                    experiment,
                    ready.run,
                    ctx.layout,
                    ctx.options,
                    Placement(executor=self.name, devices=devices),
                    attempt=ready.attempt,
                    on_tick=ctx.progress.tick,
                )
                ctx.record(eid, outcome)
                if ctx.stopping:
                    raise Interrupted("stopped")
            if ctx.stop_after_failure(eid):
                return
