"""The default executor: on this machine, one experiment at a time.

Exclusive, because jobs side by side share CPU, PCIe and NVLink and disturb
each other's numbers. Each job gets the first GPUs it needs. With
``--launch family`` the experiments of one family (``orchestrator.matrix.launches``)
run one after another in one launch (``orchestrator.job.shared``); after one
that does not finish, the rest of its family are pruned or spared as this run
has shown, and the others launched afresh.
"""

from __future__ import annotations

from orchestrator.contract.outcome import Outcome
from orchestrator.executors.base import Executor, Ready, RunContext
from orchestrator.job.execute import Interrupted, Placement, run_experiment
from orchestrator.job.shared import Member, run_shared
from orchestrator.matrix.experiment import Experiment
from orchestrator.matrix.launches import families


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
    shares_launches = True
    runs_here = True

    def run(self, ctx: RunContext) -> None:
        pool = plan_pool(ctx)
        if ctx.options.launch == "family":
            self._run_families(ctx, pool)
            return
        for experiment in ctx.plan.experiments:
            eid = experiment.experiment_id
            ready = ctx.prepare(experiment, gpus=len(pool))
            if ready is not None:
                self._alone(ctx, ready, pool)
            if ctx.stop_after_failure(eid):
                return

    def _alone(self, ctx: RunContext, ready: Ready, pool: list[str]) -> None:
        experiment = ready.experiment
        eid = experiment.experiment_id
        ctx.progress.begin(eid, ready.run.progress)
        placement = Placement(executor=self.name, devices=_devices(experiment, pool))
        outcome = ctx.settled(
            ready,
            lambda: run_experiment(
                experiment,
                ready.run,
                ctx.layout,
                ctx.options,
                placement,
                attempt=ready.attempt,
                on_tick=ctx.progress.tick,
            ),
        )
        ctx.record(eid, outcome)
        if ctx.stopping:
            raise Interrupted("stopped")

    def _run_families(self, ctx: RunContext, pool: list[str]) -> None:
        """Each family in one launch; after one that did not finish, the rest of it
        afresh (those this run shows need not run: pruned or spared)."""
        for family in families(ctx.plan.experiments):
            waiting = [r for e in family if (r := ctx.prepare(e, gpus=len(pool))) is not None]
            while waiting:
                last: str | None
                if len(waiting) == 1:
                    self._alone(ctx, waiting[0], pool)
                    last = waiting[0].experiment.experiment_id
                    waiting = []
                else:
                    last, waiting = self._shared(ctx, waiting, pool)
                if last is not None and ctx.stop_after_failure(last):
                    return
                waiting = [r for r in waiting if not ctx.skipped_unlaunched(r)]

    def _shared(
        self, ctx: RunContext, readies: list[Ready], pool: list[str]
    ) -> tuple[str | None, list[Ready]]:
        """One launch of ``readies``: (the last experiment it ran, those it did not run)."""
        members = [Member(r.experiment, r.run, r.attempt) for r in readies]
        ended: list[str] = []

        def on_begin(member: Member) -> None:
            ctx.progress.begin(member.experiment.experiment_id, member.run.progress)

        def on_done(member: Member, outcome: Outcome) -> None:
            ended.append(member.experiment.experiment_id)
            ctx.record(member.experiment.experiment_id, outcome)

        experiment = readies[0].experiment
        left = run_shared(
            members,
            ctx.layout,
            ctx.options,
            Placement(executor=self.name, devices=_devices(experiment, pool)),
            on_begin=on_begin,
            on_done=on_done,
            on_tick=ctx.progress.tick,
        )
        if ctx.stopping:
            raise Interrupted("stopped")
        unrun = {m.experiment.experiment_id for m in left}
        return (ended[-1] if ended else None), [
            r for r in readies if r.experiment.experiment_id in unrun
        ]


def _devices(experiment: Experiment, pool: list[str]) -> list[str]:
    return pool[: experiment.num_gpus] if experiment.device == "gpu" else []
