"""``tunematrix history``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from orchestrator.cli.common import Formatter

_HISTORY_EPILOG = """\
Examples:
  tunematrix history
  tunematrix history results/a100
"""


def cmd_history(args: argparse.Namespace) -> int:
    from orchestrator.results import history

    db = history.path_for(Path(args.results))
    runs = history.runs(db)
    if not runs:
        print(f"no runs recorded in {db}")
        return 0
    print(
        f"{'run':>4}  {'started':<26} {'experiments':>11}  {'statuses':<30} {'git':<11} host / GPUs"
    )
    for r in runs:
        counts = ", ".join(f"{k} {v}" for k, v in json.loads(r["counts"] or "{}").items())
        gpus = ", ".join(sorted(set(json.loads(r["gpus"] or "[]")))) or "CPU"
        git = (r["git_sha"] or "-")[:10]
        flag = " (interrupted)" if r["interrupted"] else ""
        print(
            f"{r['run_id']:>4}  {r['started_at'] or '-':<26} {r['experiments']:>11}  "
            f"{counts + flag:<30} {git:<11} {r['host']} / {gpus}"
        )
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
