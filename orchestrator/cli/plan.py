"""``tunematrix plan``."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from orchestrator import api
from orchestrator.cli.common import Formatter, add_recheck_arg, positive_float
from orchestrator.cli.selection import add_selection_args, plan_options
from orchestrator.contract.choices import LAUNCH_MODES

_PLAN_EPILOG = """\
Examples:
  tunematrix plan
  tunematrix plan --scenarios scenarios.yaml --filter 'cpu-*' --output plan.csv
  tunematrix plan --device gpu --num-gpus "1 2 4" --effective-batch-size "8 16" --commands
  tunematrix plan --device cpu --commands --launch family   (a command per launch)
  tunematrix plan --output - | column -s, -t
  tunematrix plan --results results/a100 --usd-per-gpu-hour 2.5   (cost from that history)
  tunematrix plan --memory --device gpu --gpu-memory-gib 80   (each GPU cell's memory)
  tunematrix plan --memory --gpu-memory-gib 40 --output plan.csv   (predicted_peak_bytes, ...)

Nothing is created or deleted (except the --output file), no GPU is needed, and
the training stack is not imported, except with --memory: then each GPU cell's
training step runs on fake tensors, on the CPU, in the interpreter its jobs run
under (seconds per distinct cell; kept for the next plan or run).
"""


def cmd_plan(args: argparse.Namespace) -> int:
    options = plan_options(args)
    config = options.load(args.scenarios or None)
    plan = api.plan(config, options)
    if args.memory:
        plan = api.predict_memory(plan, args.gpu_memory_gib, recheck=args.recheck)
    elif args.gpu_memory_gib is not None:
        print("tunematrix plan: --gpu-memory-gib has a meaning with --memory only", file=sys.stderr)
        return 2
    if args.output == "-":
        sys.stdout.write(api.plan_csv(plan))
        return 0
    preview = api.plan_preview(
        plan,
        config,
        args.results,
        notes=args.note,
        usd_per_gpu_hour=args.usd_per_gpu_hour,
        memory=args.memory,
        commands=args.commands,
        launch=args.launch,
    )
    print(preview)
    if args.output:
        api.plan_csv(plan, args.output)
        print(f"\nwrote {args.output}", file=sys.stderr)
    return 0


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "plan",
        help="print the experiment matrix (the dry run)",
        description="Expand the scenarios into the experiment matrix and print it.",
        epilog=_PLAN_EPILOG,
        formatter_class=Formatter,
    )
    add_selection_args(p)
    p.add_argument("--output", metavar="CSV", help="also write the plan as CSV ('-': stdout only)")
    p.add_argument(
        "--commands",
        action="store_true",
        help="print the exact accelerate launch command of each experiment",
    )
    p.add_argument(
        "--launch",
        choices=LAUNCH_MODES,
        default=None,
        help="with --commands: a launch per experiment (cell) or per family (family); "
        "default: the file's launch:, else cell",
    )
    p.add_argument(
        "--usd-per-gpu-hour",
        type=float,
        metavar="USD",
        help="price of a GPU-hour for the cost estimate (default: the file's cost:); the "
        "estimate reads the history of --results",
    )
    p.add_argument(
        "--memory",
        action="store_true",
        help="predict each GPU cell's peak memory (its training step on fake tensors, on the "
        "CPU) and set it against the device's; --output gets the predicted_* columns",
    )
    p.add_argument(
        "--gpu-memory-gib",
        type=positive_float,
        metavar="G",
        help="with --memory: one GPU's memory to plan against (default: this machine's "
        "smallest GPU, where it has one)",
    )
    add_recheck_arg(p)
    p.set_defaults(func=cmd_plan)
