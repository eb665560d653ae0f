"""``tunematrix doctor``."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from orchestrator import api
from orchestrator.cli.common import Formatter

_DOCTOR_EPILOG = """\
Examples:
  tunematrix doctor
  tunematrix doctor --results /scratch/results --json

One line per check: ok; miss (not installed, and what to install); bad (the
wrong version, or a results folder that cannot be written); warn; info. The
last line says what this machine is ready for. Exit code 0 when the tiny CPU
matrix can run here, 1 when something it needs is missing. Nothing is
installed, written or changed, and the training stack is not imported.
"""


def cmd_doctor(args: argparse.Namespace) -> int:
    text, exit_code = api.diagnose(args.results, as_json=args.json)
    sys.stdout.write(text)
    return exit_code


def add_parser(sub: Any) -> None:
    doc = sub.add_parser(
        "doctor",
        help="check what this machine has for running matrices (changes nothing)",
        description="List the GPUs and driver, NVML, the training stack and its versions, "
        "accelerate's default config, SLURM and the results folder's free space, each with "
        "ok or what to install.",
        epilog=_DOCTOR_EPILOG,
        formatter_class=Formatter,
    )
    doc.add_argument(
        "--results",
        metavar="DIR",
        default="results",
        help="results folder whose free space to check (default: results)",
    )
    doc.add_argument("--json", action="store_true", help="print the checks as JSON")
    doc.set_defaults(func=cmd_doctor)
