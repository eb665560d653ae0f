"""``tunematrix`` / ``python -m orchestrator``: the command line over the library.

Errors the user can fix become one line on stderr and exit code 2; an
interrupted command exits 130.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from typing import Any

from orchestrator import __version__
from orchestrator.cli.common import PROG, Formatter, Parser
from orchestrator.contract.errors import UserError

#: the commands, in the order --help lists them: each its own module of orchestrator.cli
COMMANDS = ("plan", "run", "fit", "report", "compare", "history", "doctor")

_MAIN_EPILOG = """\
Examples:
  tunematrix plan                          preview the default matrix for this machine
  tunematrix plan --device gpu --num-gpus "1 2 4" --filter standard-peft --commands
  tunematrix run --results results         run the matrix (resumable with --resume)
  DRY_RUN=true bash run_benchmarks.sh      the same preview through the shell script
  tunematrix doctor                        what this machine has, and what to install
"""


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The command line's parser; with ``command`` (one of ``COMMANDS``), only that
    command's module is imported and its parser built (``report``, ``compare`` and
    ``history`` then start without the planner and the executors)."""
    parser = Parser(
        prog=PROG,
        description="Plan, run and compare LLM fine-tuning benchmark matrices.",
        epilog=_MAIN_EPILOG,
        formatter_class=Formatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    sub.required = True
    for name in (command,) if command in COMMANDS else COMMANDS:
        importlib.import_module(f"orchestrator.cli.{name}").add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    # the command's own parser alone where the command line names one (its errors and
    # help are the same); all of them for the overview, a typo, or --version
    parser = build_parser(argv[0] if argv else None)
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
