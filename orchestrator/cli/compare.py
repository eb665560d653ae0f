"""``tunematrix compare``."""

from __future__ import annotations

import argparse
from typing import Any

from orchestrator import api
from orchestrator.cli.common import Formatter

_COMPARE_EPILOG = """\
Examples:
  tunematrix compare results results.20261120-101500
  tunematrix compare results refs/a100_80gb.csv --metric train_tokens_per_second
  tunematrix compare results run:3 --threshold 0.05
  tunematrix compare results --across environment --baseline old
  tunematrix history results              (the run ids)
"""


def cmd_compare(args: argparse.Namespace) -> int:
    result = api.compare(
        args.new,
        args.ref,
        metrics=args.metric,
        threshold=args.threshold,
        out=api.compare_folder(args.new, args.output),
        plots=not args.no_plots,
        history=args.history,
        flags=True,
        across=args.across,
        baseline=args.baseline,
        loss_tolerance=args.loss_tolerance,
    )
    print(*api.comparison_lines(result, args.across), sep="\n")
    return 1 if len(result.regressions) else 0


def add_parser(sub: Any) -> None:
    cmp_ = sub.add_parser(
        "compare",
        help="compare a run against a reference; exit 1 on a regression",
        description="Match the cells of NEW and REF and flag regressions. NEW and REF are "
        "results folders, summary CSVs (ours or fms-acceleration's), or run:<id> from the "
        "history of NEW's results folder.",
        epilog=_COMPARE_EPILOG,
        formatter_class=Formatter,
    )
    cmp_.add_argument("new", metavar="NEW")
    cmp_.add_argument("ref", metavar="REF", nargs="?", help="the reference (not with --across)")
    cmp_.add_argument(
        "--across",
        metavar="COLUMN",
        help="compare within NEW alone: each value of COLUMN (environment, or another key "
        "column) against the --baseline one, matched on every other key",
    )
    cmp_.add_argument(
        "--baseline",
        metavar="VALUE",
        help="with --across: the value taken as the reference (default: the first)",
    )
    cmp_.add_argument(
        "--metric",
        action="append",
        default=[],
        metavar="NAME",
        help="metric to compare; repeatable (default: throughput, step time, peak memory, MFU)",
    )
    cmp_.add_argument(
        "--threshold",
        type=float,
        default=0.1,
        metavar="FRACTION",
        help="relative change that counts as a regression (default: 0.1)",
    )
    cmp_.add_argument(
        "--output",
        metavar="DIR",
        help="where to write compare.csv/.md (default: NEW's folder, else .)",
    )
    cmp_.add_argument(
        "--loss-tolerance",
        type=float,
        metavar="FRACTION",
        help="loss gap (mean over the common steps, relative to the reference's mean loss) "
        "past which a matched cell's loss changed; results folders only (default: 0.05)",
    )
    cmp_.add_argument("--history", metavar="FILE", help="history.sqlite to look run:<id> up in")
    cmp_.add_argument("--no-plots", action="store_true", help="tables only")
    cmp_.set_defaults(func=cmd_compare)
