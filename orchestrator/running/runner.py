"""Run a plan: open the results folder, let an executor run every experiment, then report.

How the experiments run (one at a time, packed side by side, submitted to a
cluster) is the executor's (``orchestrator.executors``); this module does
what every run shares: the folder (moved aside or resumed, locked), env.json
and plan.csv, the signals, ``raw_summary.csv`` rewritten after every
outcome (so an interrupted run keeps everything it finished), and the report
and history entry at the end.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.contract.clock import now
from orchestrator.contract.errors import UserError
from orchestrator.contract.layout import ResultsLayout
from orchestrator.contract.outcome import ACCEPTABLE, Outcome, tally
from orchestrator.contract.result import read_result
from orchestrator.executors.base import Executor, Preflight, RunContext
from orchestrator.executors.console import Progress
from orchestrator.job.execute import DEFAULT_TIMEOUT_S, Interrupted, RunOptions
from orchestrator.matrix.expand import Plan
from orchestrator.matrix.experiment import Experiment
from orchestrator.results.options import ReportOptions
from orchestrator.results.rows import build_row, write_raw_summary
from orchestrator.running import envinfo
from orchestrator.running.resultsdir import open_results

__all__ = ["DEFAULT_TIMEOUT_S", "Outcome", "RunOptions", "RunReport", "preflight", "run_plan"]


@dataclass
class RunReport:
    outcomes: dict[str, Outcome]
    layout: ResultsLayout
    moved_to: Path | None
    interrupted: bool
    history_run_id: int | None = None
    report_error: str | None = None
    reported: bool = False  # summary.md and benchmarks.csv were written by this run
    #: what the report was written with
    reporting: ReportOptions = field(default_factory=ReportOptions)

    def counts(self) -> dict[str, int]:
        return tally(self.outcomes.values())

    @property
    def exit_code(self) -> int:
        if self.interrupted:
            return 130
        return 0 if all(o.status in ACCEPTABLE for o in self.outcomes.values()) else 1


def _summary_rows(
    plan: Plan, layout: ResultsLayout, outcomes: Mapping[str, Outcome]
) -> list[dict[str, Any]]:
    """One row per planned experiment, with this run's statuses (skipped, not run...)."""
    rows = []
    for e in plan.experiments:
        outcome = outcomes.get(e.experiment_id) or Outcome(status="interrupted", error="not run")
        result = read_result(layout.run(e.experiment_id).result)
        rows.append(build_row(e.spec(), outcome.as_dict(), result))
    return rows


def _write_summary(plan: Plan, layout: ResultsLayout, outcomes: Mapping[str, Outcome]) -> None:
    write_raw_summary(_summary_rows(plan, layout, outcomes), layout.raw_summary)


def _report_and_record(
    run_report: RunReport,
    rows: list[dict[str, Any]],
    env: dict[str, Any],
    say: Callable[[str], None],
) -> None:
    """The full report and the history entry; a failure here never costs the results."""
    try:
        from orchestrator.results import history

        root = run_report.layout.root
        report = run_report.reporting.write(root, root, rows=rows)
        run_report.reported = True
        run_report.history_run_id = history.record(history.path_for(root), report.rows, env, root)
    except Exception as exc:  # the run's files are written; the report can be redone
        run_report.report_error = f"{type(exc).__name__}: {exc}"
        say(
            f"the report failed ({run_report.report_error}); "
            f"run `tunematrix report {run_report.layout.root}`"
        )


def preflight(executor: Executor, plan: Plan, layout: ResultsLayout, options: RunOptions) -> None:
    """The executor's checks before anything is written (with the folder's history)."""
    from orchestrator.results import history

    def expected_s(experiment: Experiment) -> float | None:
        return history.longest_ok_job(layout.history, experiment.cell_id)

    if options.launch == "family" and not executor.shares_launches:
        raise UserError(
            f"--launch family: the {executor.title} executor runs a launch per experiment; "
            "run with the local executor, or --launch cell"
        )
    if options.cool_down_s > 0 and not executor.runs_here:
        raise UserError(
            f"--cool-down waits for this machine's GPUs: the {executor.title} executor runs "
            "its jobs elsewhere; run with the local executor (or --pack), or without it"
        )
    executor.check(Preflight(plan.experiments, layout, options, expected_s))


def run_plan(
    plan: Plan,
    results: Path,
    options: RunOptions,
    *,
    argv: list[str],
    progress: Progress | None = None,
    log: Callable[[str], None] | None = None,
    executor: Executor | None = None,
    reporting: ReportOptions | None = None,
) -> RunReport:
    """Run every experiment of ``plan`` into ``results``; return what happened.

    ``executor`` runs the experiments (default: the local one, one at a
    time); its ``check`` (``preflight``) is the caller's, before this.
    ``reporting``: the report's prices and token budget (recorded in env.json too).
    """
    from orchestrator.executors.local import LocalExecutor
    from orchestrator.matrix.table import write_plan_csv

    executor = executor or LocalExecutor()
    reporting = reporting or ReportOptions()
    progress = progress or Progress(len(plan.experiments), parallel=executor.parallel(plan))
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
        with open_results(
            results, resume=options.resume, grace_s=options.grace_s, say=say
        ) as opened:
            layout = opened.layout
            if opened.moved_to is not None:
                say(f"the earlier run in {results} was moved to {opened.moved_to}")
            env = envinfo.collect(argv)
            env["cost"] = {
                "usd_per_gpu_hour": reporting.usd_per_gpu_hour,
                "usd_per_kwh": reporting.usd_per_kwh,
                "grams_co2_per_kwh": reporting.grams_co2_per_kwh,
            }
            env["mode"] = executor.mode
            env["executor"] = executor.name
            if plan.environments:  # the interpreters the jobs ran under, as the plan found them
                env["environments"] = [e.record() for e in plan.environments]
            envinfo.write(layout.env, env)
            write_plan_csv(plan, layout.plan_csv)

            def on_record(outcomes: Mapping[str, Outcome]) -> None:
                _write_summary(plan, layout, outcomes)

            ctx = RunContext(
                plan, layout, options, progress, say, on_record=on_record, signals=stopping
            )
            try:
                executor.run(ctx)
            except (Interrupted, KeyboardInterrupt):
                interrupted = True
                ctx.fill("not run: the run was interrupted")
            finally:
                _write_summary(plan, layout, ctx.outcomes)
                env["finished_at"] = now()
                env["interrupted"] = interrupted
                # submitted without waiting: `tunematrix report` records the run once they end
                env["awaiting_jobs"] = any(o.status == "planned" for o in ctx.outcomes.values())
                envinfo.write(layout.env, env)
            run_report = RunReport(
                outcomes=ctx.outcomes,
                layout=layout,
                moved_to=opened.moved_to,
                interrupted=interrupted,
                reporting=reporting,
            )
            finished = any(o.status != "planned" for o in ctx.outcomes.values())
            if options.report and finished:  # nothing to report while jobs are only submitted
                _report_and_record(run_report, _summary_rows(plan, layout, ctx.outcomes), env, say)
            return run_report
    finally:
        for sig, handler in previous_handlers.items():
            signal.signal(sig, handler)
