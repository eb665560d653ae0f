"""``tunematrix plan``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from orchestrator import api
from orchestrator.cli.common import Formatter, add_recheck_arg
from orchestrator.cli.selection import add_selection_args, plan_options
from orchestrator.config.values import LAUNCH_MODES
from orchestrator.contract.errors import UserError
from orchestrator.contract.layout import ResultsLayout

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
    from orchestrator.job.command import format_commands
    from orchestrator.matrix.table import (
        format_header,
        format_table,
        plan_csv,
        write_plan_csv,
    )

    options = plan_options(args)
    config = options.load(args.scenarios or None)
    plan = api.plan(config, options)
    layout = ResultsLayout(Path(args.results))
    if args.memory:
        plan = _with_memory(plan, args)
    elif args.gpu_memory_gib is not None:
        print("tunematrix plan: --gpu-memory-gib has a meaning with --memory only", file=sys.stderr)
        return 2
    if args.output == "-":
        sys.stdout.write(plan_csv(plan))
        return 0
    print(format_header(plan, config.scenarios_file, config.defaults_file, notes=args.note))
    print()
    print(format_table(plan))
    # what it will cost, from the results folder's history (results/estimate.py)
    from orchestrator.results.estimate import estimate_plan

    price = args.usd_per_gpu_hour or config.usd_per_gpu_hour
    print()
    print(*estimate_plan(plan.experiments, layout.history).lines(price), sep="\n")
    if args.memory:
        from orchestrator.running.memoryfit import memory_table

        print()
        print(*memory_table(plan), sep="\n")
    if args.commands:
        print()
        launch = args.launch or config.launch or "cell"
        print(format_commands(plan.experiments, layout, launch))
    if args.output:
        write_plan_csv(plan, Path(args.output))
        print(f"\nwrote {args.output}", file=sys.stderr)
    return 0


def _with_memory(plan: Any, args: argparse.Namespace) -> Any:
    """``plan`` with each GPU cell's predicted memory (the check before launch, asked for
    it), against ``--gpu-memory-gib`` or this machine's GPUs."""
    from orchestrator.contract.gpumemory import MemoryPrediction
    from orchestrator.running.memoryfit import device_capacity, predicted, with_memory
    from orchestrator.running.stackcheck import check_stack

    if args.gpu_memory_gib is not None and args.gpu_memory_gib <= 0:
        raise UserError(f"--gpu-memory-gib must be positive, got {args.gpu_memory_gib:g}")
    checked = check_stack(plan, keep=True, recheck=args.recheck, memory=predicted, stop=False)
    for line in checked.lines():
        print(line, file=sys.stderr)
    if checked.refused:
        print(
            f"{len(checked.refused)} cell(s) refused before launch (run would stop at the "
            "first; the table says why for each)",
            file=sys.stderr,
        )
    capacity, source = device_capacity(args.gpu_memory_gib)
    memory = dict(checked.memory)
    memory.update((cell, MemoryPrediction(refused=why)) for cell, why in checked.refused.items())
    return with_memory(checked.plan, memory, capacity, source)


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
        type=float,
        metavar="G",
        help="with --memory: one GPU's memory to plan against (default: this machine's "
        "smallest GPU, where it has one)",
    )
    add_recheck_arg(p)
    p.set_defaults(func=cmd_plan)
