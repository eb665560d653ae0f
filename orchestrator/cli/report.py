"""``tunematrix report``."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from orchestrator.api import ids_text
from orchestrator.cli.common import Formatter, positive

_REPORT_EPILOG = """\
Examples:
  tunematrix report results
  tunematrix report results --usd-per-gpu-hour 2.5 --tokens 2e9
  tunematrix report old_benchmarks/raw_summary.csv --output report/
  tunematrix report refs/a100_80gb.csv --gpu-memory-gib 80
"""


def _record_awaited_run(source: Path, rows: Any) -> int | None:
    """A run submitted with --no-wait ends when its last job has: it enters the
    history then, as a waited-for run does (later runs check time limits against
    it). Once: env.json says whether it is still awaited."""
    from orchestrator.results import history
    from orchestrator.running import envinfo

    env = envinfo.read(source)
    if env is None or env.get("awaiting_jobs") is not True:
        return None
    env["finished_at"] = envinfo.now()
    env["awaiting_jobs"] = False
    run_id = history.record(history.path_for(source), rows, env, source)
    envinfo.write(source / "env.json", env)
    return run_id


def cmd_report(args: argparse.Namespace) -> int:
    from orchestrator import api
    from orchestrator.results.report import status_counts

    source = Path(args.source)
    gpu_memory = positive(args.gpu_memory_gib, "--gpu-memory-gib")
    price = positive(args.usd_per_gpu_hour, "--usd-per-gpu-hour")
    tokens = positive(args.tokens, "--tokens")
    running: list[str] = []
    if source.is_dir() and (source / "runs").is_dir():
        from orchestrator.contract.layout import ResultsLayout
        from orchestrator.executors.slurm import settle

        collected, running = settle(ResultsLayout(source))
        if collected:
            print(f"collected {collected} finished SLURM job(s)")
        if running:
            print(
                f"{len(running)} SLURM job(s) still queued or running ({ids_text(running)}); "
                "the report shows them as not run yet"
            )
    report = api.report(
        source,
        args.output,
        usd_per_gpu_hour=price,
        tokens=tokens,
        gpu_memory_gib=gpu_memory,
        plots=not args.no_plots,
    )
    print(
        f"tunematrix report: {len(report.rows)} experiments, {len(report.cells)} cells — "
        + status_counts(report.rows)
    )
    for path in report.written:
        print(f"  {path}")
    if source.is_dir() and not running:
        run_id = _record_awaited_run(source, report.rows)
        if run_id is not None:
            print(f"  recorded as run {run_id} in {source / 'history.sqlite'}")
    return 0


def add_parser(sub: Any) -> None:
    rep = sub.add_parser(
        "report",
        help="write the tables and plots of a results folder",
        description="Write raw_summary.csv, benchmarks.csv, summary.md and plots/ for a results "
        "folder (or a summary CSV, ours or fms-acceleration's). Runs after every run; "
        "needs no training stack.",
        epilog=_REPORT_EPILOG,
        formatter_class=Formatter,
    )
    rep.add_argument(
        "source", metavar="RESULT_DIR", help="results folder, or a raw_summary.csv/benchmarks.csv"
    )
    rep.add_argument(
        "--output",
        metavar="DIR",
        help="where to write (default: the results folder itself; for a CSV or a "
        "predecessor's folder, a tunematrix-report/ folder beside it)",
    )
    rep.add_argument(
        "--usd-per-gpu-hour",
        type=float,
        metavar="USD",
        help="price of a GPU-hour (default: the run's)",
    )
    rep.add_argument(
        "--tokens", type=float, metavar="N", help="estimate time and cost to train N tokens"
    )
    rep.add_argument(
        "--gpu-memory-gib",
        type=float,
        metavar="GIB",
        help="memory of one GPU, for a table that does not record it (default: the run's "
        "env.json, else a GPU named in the rows or the file name: a100_80gb, h100, h200…); "
        "failed runs without metrics that came near it are shown as likely OOM",
    )
    rep.add_argument("--no-plots", action="store_true", help="tables only")
    rep.set_defaults(func=cmd_report)
