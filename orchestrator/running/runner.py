"""Run a plan: every experiment once (per repeat), one at a time or packed, then report.

Exclusive (the default) runs one job at a time, because jobs side by side
share CPU, PCIe and NVLink and disturb each other's numbers. ``--pack`` hands
each job the GPUs it needs from a pool and runs jobs side by side while GPUs
are free (on the CPU, ``--slots K`` processes), largest first; each records
whether it ran alone or packed, and with whom. After every job its outcome is
written and ``raw_summary.csv`` rewritten, so an interrupted run keeps
everything it finished.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.contract.layout import ResultsLayout, RunPaths
from orchestrator.contract.outcome import ACCEPTABLE
from orchestrator.contract.result import read_result
from orchestrator.executors.scheduler import DevicePool, PackQueue
from orchestrator.job.execute import (
    DEFAULT_TIMEOUT_S,
    Interrupted,
    Outcome,
    RunOptions,
    _relative,
    run_experiment,
    write_outcome,
)
from orchestrator.matrix.expand import Plan
from orchestrator.matrix.experiment import Experiment
from orchestrator.results.rows import build_row, write_raw_summary
from orchestrator.running import envinfo
from orchestrator.running.progress import Progress
from orchestrator.running.resultsdir import keep_previous_attempt, open_results

__all__ = ["DEFAULT_TIMEOUT_S", "Outcome", "RunOptions", "RunReport", "run_plan"]

#: statuses after which a run still exits 0: a benchmark may legitimately run out of memory


def gpu_pool() -> list[str]:
    """The GPUs this orchestrator may hand out, as CUDA_VISIBLE_DEVICES entries."""
    from orchestrator.running.hardware import gpu_count, visible_devices

    visible = visible_devices()
    count = gpu_count()
    if visible is not None:
        return visible[:count]
    return [str(i) for i in range(count)]


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
    reported: bool = False  # summary.md and benchmarks.csv were written by this run

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
        from orchestrator.results import history
        from orchestrator.results.report import CostSettings, write_report

        root = run_report.layout.root
        report = write_report(
            root,
            root,
            CostSettings(usd_per_gpu_hour=options.usd_per_gpu_hour, tokens=options.tokens),
            rows=rows,
        )
        run_report.reported = True
        run_report.history_run_id = history.record(history.path_for(root), report.rows, env, root)
    except Exception as exc:  # the run's files are written; the report can be redone
        run_report.report_error = f"{type(exc).__name__}: {exc}"
        say(
            f"the report failed ({run_report.report_error}); "
            f"run `tunematrix report {run_report.layout.root}`"
        )


# ---------------------------------------------------------------------------
# Before a job: resume, earlier attempts, impossible requests
# ---------------------------------------------------------------------------


@dataclass
class _Ready:
    experiment: Experiment
    run: RunPaths
    attempt: int


def _prepare(
    experiment: Experiment, layout: ResultsLayout, options: RunOptions, gpus: int
) -> _Ready | Outcome:
    """What to run, or the outcome an experiment gets without running."""
    run = layout.run(experiment.experiment_id)
    if options.resume and _previous_ok(run):
        return _skipped_outcome(run, layout)
    attempt = 1
    if run.dir.exists():
        kept = keep_previous_attempt(run.dir)
        if kept is not None:
            attempt = int(kept.name) + 1
    if experiment.device == "gpu" and experiment.num_gpus > gpus:
        outcome = Outcome(
            status="failed",
            error=f"needs {experiment.num_gpus} GPU(s); {gpus} visible to the orchestrator",
            attempt=attempt,
        )
        run.dir.mkdir(parents=True, exist_ok=True)
        write_outcome(run, outcome)
        return outcome
    return _Ready(experiment=experiment, run=run, attempt=attempt)


# ---------------------------------------------------------------------------
# Executors
# ---------------------------------------------------------------------------


class _Context:
    """What the executors share: the plan, the folder, the outcomes so far."""

    def __init__(
        self,
        plan: Plan,
        layout: ResultsLayout,
        options: RunOptions,
        progress: Progress,
        say: Callable[[str], None],
    ) -> None:
        self.plan = plan
        self.layout = layout
        self.options = options
        self.progress = progress
        self.say = say
        self.outcomes: dict[str, Outcome] = {}
        self.pool = gpu_pool() if any(e.device == "gpu" for e in plan.experiments) else []

    def record(self, eid: str, outcome: Outcome, counted: bool = True) -> None:
        self.outcomes[eid] = outcome
        note = outcome.error or ("already ok" if outcome.status == "skipped" else "")
        self.progress.finish(eid, outcome.status, outcome.wall_s or 0.0, note, counted=counted)
        _write_summary(self.plan, self.layout, self.outcomes)

    def stop_after_failure(self, eid: str) -> bool:
        if self.options.fail_fast and self.outcomes[eid].status not in ACCEPTABLE:
            self.say(f"stopping: --fail-fast and {eid} ended {self.outcomes[eid].status}")
            self.fill(f"not run: --fail-fast stopped after {eid}")
            return True
        return False

    def fill(self, why: str) -> None:
        for e in self.plan.experiments:
            self.outcomes.setdefault(e.experiment_id, Outcome(status="interrupted", error=why))


def _run_exclusive(ctx: _Context, stopping: list[int]) -> None:
    """One job at a time, each on the first GPUs it needs."""
    for experiment in ctx.plan.experiments:
        eid = experiment.experiment_id
        ready = _prepare(experiment, ctx.layout, ctx.options, len(ctx.pool))
        if isinstance(ready, Outcome):
            ctx.record(eid, ready, counted=False)
        else:
            devices = ctx.pool[: experiment.num_gpus] if experiment.device == "gpu" else []
            ctx.progress.begin(eid, ready.run.progress)
            outcome = run_experiment(
                experiment,
                ready.run,
                ctx.layout,
                ctx.options,
                devices,
                attempt=ready.attempt,
                on_tick=ctx.progress.tick,
            )
            ctx.record(eid, outcome)
            if stopping:
                raise Interrupted("stopped")
        if ctx.stop_after_failure(eid):
            return


def _run_packed(ctx: _Context, stopping: list[int]) -> None:
    """Jobs side by side while devices are free, largest first (see orchestrator.executors.scheduler)."""
    options = ctx.options
    cpu_slots = [f"slot{i}" for i in range(max(1, options.slots))]
    gpu_jobs: list[tuple[int, _Ready]] = []
    cpu_jobs: list[tuple[int, _Ready]] = []
    for experiment in ctx.plan.experiments:
        ready = _prepare(experiment, ctx.layout, options, len(ctx.pool))
        if isinstance(ready, Outcome):
            ctx.record(experiment.experiment_id, ready, counted=False)
            continue
        if experiment.device == "cpu" and experiment.num_gpus > len(cpu_slots):
            # more processes than slots: it runs alone, on every slot
            cpu_jobs.append((len(cpu_slots), ready))
        else:
            (gpu_jobs if experiment.device == "gpu" else cpu_jobs).append(
                (experiment.num_gpus, ready)
            )
    gpu_queue = PackQueue.of(gpu_jobs, DevicePool(ctx.pool))
    cpu_queue = PackQueue.of(cpu_jobs, DevicePool(cpu_slots))

    stop = threading.Event()
    running: dict[Future[Outcome], tuple[_Ready, list[str], PackQueue[_Ready], set[str]]] = {}
    workers = max(1, len(ctx.pool)) + len(cpu_slots)
    failed_fast = False
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="job") as executor:
        try:
            while running or ((len(gpu_queue) or len(cpu_queue)) and not failed_fast):
                if not failed_fast:
                    for queue in (gpu_queue, cpu_queue):
                        for ready, devices in queue.start():
                            eid = ready.experiment.experiment_id
                            together: set[str] = set()
                            for _, (other, _, _, other_with) in running.items():
                                other_with.add(eid)
                                together.add(other.experiment.experiment_id)
                            ctx.progress.begin(eid, ready.run.progress)
                            future = executor.submit(
                                run_experiment,
                                ready.experiment,
                                ready.run,
                                ctx.layout,
                                options,
                                devices if ready.experiment.device == "gpu" else [],
                                attempt=ready.attempt,
                                stop=stop,
                                packed_with=together,
                                cpu_share=len(cpu_slots) if ready.experiment.device == "cpu" else 1,
                            )
                            running[future] = (ready, devices, queue, together)
                done, _ = wait(list(running), timeout=1.0, return_when=FIRST_COMPLETED)
                ctx.progress.tick()
                for future in done:
                    ready, devices, queue, _ = running.pop(future)
                    queue.pool.give(devices)
                    eid = ready.experiment.experiment_id
                    ctx.record(eid, future.result())
                    if ctx.stop_after_failure(eid):
                        failed_fast = True
        except (KeyboardInterrupt, Interrupted):
            # stop every running job (each stops its own process group), keep their outcomes
            stop.set()
            for future, (ready, _, _, _) in running.items():
                ctx.record(ready.experiment.experiment_id, future.result())
            raise Interrupted("stopped") from None


def run_plan(
    plan: Plan,
    results: Path,
    options: RunOptions,
    *,
    argv: list[str],
    progress: Progress | None = None,
    log: Callable[[str], None] | None = None,
    executor: Callable[[Any, list[int]], None] | None = None,
) -> RunReport:
    """Run every experiment of ``plan`` into ``results``; return what happened.

    ``executor`` runs the experiments (default: exclusive, or packed with
    ``options.pack``); the SLURM executor plugs in here.
    """
    from orchestrator.matrix.table import write_plan_csv

    parallel = 1
    if options.pack:
        parallel = max(len(gpu_pool()) or 1, options.slots)
    progress = progress or Progress(len(plan.experiments), parallel=parallel)
    say = log or progress.message
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
            env["mode"] = "packed" if options.pack else "exclusive"
            envinfo.write(layout.env, env)
            write_plan_csv(plan, layout.plan_csv)
            ctx = _Context(plan, layout, options, progress, say)
            chosen = executor or (_run_packed if options.pack else _run_exclusive)
            try:
                chosen(ctx, stopping)
            except (Interrupted, KeyboardInterrupt):
                interrupted = True
                ctx.fill("not run: the run was interrupted")
            finally:
                _write_summary(plan, layout, ctx.outcomes)
                env["finished_at"] = envinfo.now()
                env["interrupted"] = interrupted
                # submitted without waiting: `tunematrix report` records the run once they end
                env["awaiting_jobs"] = any(o.status == "planned" for o in ctx.outcomes.values())
                envinfo.write(layout.env, env)
            run_report = RunReport(
                outcomes=ctx.outcomes,
                layout=layout,
                moved_to=opened.moved_to,
                interrupted=interrupted,
            )
            finished = any(o.status != "planned" for o in ctx.outcomes.values())
            if options.report and finished:  # nothing to report while jobs are only submitted
                _report_and_record(
                    run_report, _summary_rows(plan, layout, ctx.outcomes), env, options, say
                )
            return run_report
    finally:
        for sig, handler in previous_handlers.items():
            signal.signal(sig, handler)
