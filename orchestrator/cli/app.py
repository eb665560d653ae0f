"""``tunematrix`` / ``python -m orchestrator``: the command line over the library.

Errors the user can fix become one line on stderr and exit code 2; an
interrupted command exits 130.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

from orchestrator import __version__
from orchestrator.cli import compare, doctor, fit, history, plan, report, run
from orchestrator.cli.common import PROG, Formatter, Parser
from orchestrator.contract.errors import UserError

_MAIN_EPILOG = """\
Examples:
  tunematrix plan                          preview the default matrix for this machine
  tunematrix plan --device gpu --num-gpus "1 2 4" --filter standard-peft --commands
  tunematrix run --results results         run the matrix (resumable with --resume)
  DRY_RUN=true bash run_benchmarks.sh      the same preview through the shell script
  tunematrix doctor                        what this machine has, and what to install
"""


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog=PROG,
        description="Plan, run and compare LLM fine-tuning benchmark matrices.",
        epilog=_MAIN_EPILOG,
        formatter_class=Formatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    sub.required = True
    for command in (plan, run, fit, report, compare, history, doctor):
        command.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        result: Any = args.func(args)
        return int(result)
    except UserError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # `tunematrix plan | head`: the reader left; not an error of ours. Point
        # stdout at /dev/null so the interpreter's final flush does not fail too.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
