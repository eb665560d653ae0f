"""Packing: on this machine, experiments side by side while devices are free.

Each job gets the GPUs it needs from a pool (on the CPU, ``--slots K``
processes), largest first (see ``orchestrator.executors.scheduler``); each
records that it ran packed, and with whom. Off by default: jobs side by side
share CPU, PCIe and NVLink, which changes their numbers.
"""

from __future__ import annotations

import argparse
import threading
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

from orchestrator.contract.choices import positive_int
from orchestrator.contract.errors import UserError
from orchestrator.contract.outcome import Outcome
from orchestrator.executors.base import Executor, ExecutorSection, Flags, Ready, RunContext
from orchestrator.executors.local import gpu_pool, plan_pool
from orchestrator.executors.scheduler import DevicePool, PackQueue
from orchestrator.job.execute import Interrupted, Placement, run_experiment
from orchestrator.matrix.expand import Plan


class PackedExecutor(Executor):
    name = "packed"
    title = "packed"
    summary = "run here, side by side while GPUs are free (--pack)"
    examples = (
        'tunematrix run --pack --num-gpus "1 2 4"          # side by side on this node\'s GPUs',
    )
    mode = "packed"
    runs_here = True

    def __init__(self, slots: int = 1) -> None:
        #: CPU jobs: how many processes may run at once
        self.slots = max(1, slots)

    @classmethod
    def add_flags(cls, flags: Flags) -> None:
        flags.add_argument(
            "--pack",
            action="store_true",
            help="run experiments side by side while GPUs are free (largest first). Off by "
            "default: jobs side by side share CPU, PCIe and NVLink, which changes their numbers",
        )
        flags.add_argument(
            "--slots",
            type=positive_int,
            default=1,
            metavar="K",
            help="with --pack, how many CPU processes may run at once (default: 1)",
        )

    @classmethod
    def chosen_by(cls, args: argparse.Namespace) -> bool:
        return bool(args.pack)

    @classmethod
    def check_flags(
        cls, args: argparse.Namespace, chosen: type[Executor], given: Sequence[str]
    ) -> None:
        if args.slots > 1 and not (args.pack or chosen is cls):
            raise UserError("--slots only has a meaning with --pack")
        if args.pack and chosen is not cls:
            raise UserError(f"--pack is for one machine; {chosen.title} schedules the jobs itself")

    @classmethod
    def from_args(cls, args: argparse.Namespace, section: ExecutorSection | None) -> Executor:
        return cls(slots=args.slots)

    def parallel(self, plan: Plan) -> int:
        return max(len(gpu_pool()) or 1, self.slots)

    def run(self, ctx: RunContext) -> None:
        pool = plan_pool(ctx)
        cpu_slots = [f"slot{i}" for i in range(self.slots)]
        gpu_jobs: list[tuple[int, Ready]] = []
        cpu_jobs: list[tuple[int, Ready]] = []
        for experiment in ctx.plan.experiments:
            ready = ctx.prepare(experiment, gpus=len(pool))
            if ready is None:
                continue
            if experiment.device == "cpu" and experiment.num_gpus > len(cpu_slots):
                # more processes than slots: it runs alone, on every slot
                cpu_jobs.append((len(cpu_slots), ready))
            else:
                (gpu_jobs if experiment.device == "gpu" else cpu_jobs).append(
                    (experiment.num_gpus, ready)
                )
        gpu_queue = PackQueue.of(gpu_jobs, DevicePool(pool))
        cpu_queue = PackQueue.of(cpu_jobs, DevicePool(cpu_slots))

        stop = threading.Event()
        running: dict[Future[Outcome], tuple[Ready, list[str], PackQueue[Ready], set[str]]] = {}
        workers = max(1, len(pool)) + len(cpu_slots)
        failed_fast = False
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="job") as threads:
            try:
                while running or ((len(gpu_queue) or len(cpu_queue)) and not failed_fast):
                    if not failed_fast:
                        for queue in (gpu_queue, cpu_queue):
                            for ready, devices in queue.start():
                                if ctx.skipped_unlaunched(ready):
                                    # pruned or spared by what ran since it was queued
                                    queue.pool.give(devices)
                                    continue
                                eid = ready.experiment.experiment_id
                                together: set[str] = set()
                                for other, _, _, other_with in running.values():
                                    other_with.add(eid)
                                    together.add(other.experiment.experiment_id)
                                ctx.progress.begin(eid, ready.run.progress)
                                on_cpu = ready.experiment.device == "cpu"
                                placement = Placement(
                                    executor=self.name,
                                    devices=[] if on_cpu else devices,
                                    cpu_share=len(cpu_slots) if on_cpu else 1,
                                    packed_with=together,
                                )
                                future = threads.submit(
                                    run_experiment,
                                    ready.experiment,
                                    ready.run,
                                    ctx.layout,
                                    ctx.options,
                                    placement,
                                    attempt=ready.attempt,
                                    stop=stop,
                                )
                                running[future] = (ready, devices, queue, together)
                    done, _ = wait(list(running), timeout=1.0, return_when=FIRST_COMPLETED)
                    ctx.progress.tick()
                    for future in done:
                        ready, devices, queue, _ = running.pop(future)
                        queue.pool.give(devices)
                        eid = ready.experiment.experiment_id
                        ctx.record(eid, ctx.settled(ready, future.result))
                        if ctx.stop_after_failure(eid):
                            failed_fast = True
            except (KeyboardInterrupt, Interrupted):
                # stop every running job (each stops its own process group), keep their outcomes
                stop.set()
                for future, (ready, _, _, _) in running.items():
                    ctx.record(ready.experiment.experiment_id, ctx.settled(ready, future.result))
                raise Interrupted("stopped") from None
