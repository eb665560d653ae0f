"""``tunematrix report``."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from orchestrator import api
from orchestrator.cli.common import Formatter, add_energy_prices

_REPORT_EPILOG = """\
Examples:
  tunematrix report results
  tunematrix report results --usd-per-gpu-hour 2.5 --tokens 2e9
  tunematrix report results --usd-per-kwh 0.15 --grams-co2-per-kwh 400 --rank-by energy
  tunematrix report old_benchmarks/raw_summary.csv --output report/
  tunematrix report refs/a100_80gb.csv --gpu-memory-gib 80
"""


def cmd_report(args: argparse.Namespace) -> int:
    done = api.settle_and_report(
        args.source,
        args.output,
        usd_per_gpu_hour=args.usd_per_gpu_hour,
        tokens=args.tokens,
        gpu_memory_gib=args.gpu_memory_gib,
        plots=not args.no_plots,
        flags=True,
        loss_tolerance=args.loss_tolerance,
        usd_per_kwh=args.usd_per_kwh,
        grams_co2_per_kwh=args.grams_co2_per_kwh,
        rank_by=args.rank_by,
    )
    for settled in done.settled:
        if settled.collected:
            print(f"collected {settled.collected} finished {settled.noun}(s)")
        if settled.running:
            print(
                f"{len(settled.running)} {settled.noun}(s) still queued or running "
                f"({api.ids_text(settled.running)}); the report shows them as not run yet"
            )
    report = done.report
    for line in report.warnings:  # a run file the read could not read: its row reads failed
        print(f"warning: {line}", file=sys.stderr)
    print(
        f"tunematrix report: {len(report.rows)} experiments, {len(report.cells)} cells — "
        + done.statuses
    )
    for path in report.written:
        print(f"  {path}")
    if done.history_run_id is not None:
        print(f"  recorded as run {done.history_run_id} in {done.history}")
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
    rep.add_argument(
        "--loss-tolerance",
        type=float,
        metavar="FRACTION",
        help="loss gap (mean over the common steps, relative to the baseline's mean loss) "
        "past which a framework or trainer variant differs from its baseline (default: 0.05)",
    )
    add_energy_prices(rep)
    rep.add_argument(
        "--rank-by",
        choices=("speed", "energy"),
        default="speed",
        help="what the recommendation ranks cells by: tokens/s, or joules per token",
    )
    rep.add_argument("--no-plots", action="store_true", help="tables only")
    rep.set_defaults(func=cmd_report)
