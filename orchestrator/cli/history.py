"""``tunematrix history``."""

from __future__ import annotations

import argparse
from typing import Any

from orchestrator import api
from orchestrator.cli.common import Formatter

_HISTORY_EPILOG = """\
Examples:
  tunematrix history
  tunematrix history results/a100
"""


def cmd_history(args: argparse.Namespace) -> int:
    print(*api.history_lines(args.results), sep="\n")
    return 0


def add_parser(sub: Any) -> None:
    his = sub.add_parser(
        "history",
        help="list the runs recorded in a results folder",
        description="List the runs recorded in RESULT_DIR/history.sqlite.",
        epilog=_HISTORY_EPILOG,
        formatter_class=Formatter,
    )
    his.add_argument("results", metavar="RESULT_DIR", nargs="?", default="results")
    his.set_defaults(func=cmd_history)
