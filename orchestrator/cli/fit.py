"""``tunematrix fit``: the largest per-device batch (or sequence length) that fits, per
search (one setup, the value it raises)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from orchestrator import api
from orchestrator.api import FitOptions, RunOptions
from orchestrator.cli.common import PROG, Formatter, add_recheck_arg, positive_float
from orchestrator.cli.selection import add_selection_args, plan_options
from orchestrator.contract.choices import DEFAULT_MARGIN, MEMORY_LOGGING, SEARCH_KEYS, positive_int
from orchestrator.contract.errors import UserError

_FIT_EPILOG = """\
Examples:
  tunematrix fit --filter tiny-lora --max per_device_train_batch_size --limit 64
  tunematrix fit --max max_seq_len --min 128 --limit 8192 --margin 0.05
  tunematrix fit --resume --results results/fit
  tunematrix fit --executor slurm --max per_device_train_batch_size

Each cell family of the selected scenarios (the planned cells without their
batch, or their sequence length: the same model, framework, PEFT setup and GPU
count) is searched by fresh probes, each an ordinary short experiment with its
own id and run folder: the lower bound first (if it does not fit, nothing
does), then doubling until the first out-of-memory, then bisection between the
last fit and the first miss. A probe whose peak memory is above (1 - margin) of
the device's does not fit either; one that fails for another reason stops its
family's search. A scenario's search: key chooses what to search; --max does
it for every selected scenario. The matrix is never changed: the answer goes to
fit.md and fit.json in the results folder, with raw_summary.csv of the probes.
"""


def _margin(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"{value:g} is not a fraction in [0, 1)")
    return value


def cmd_fit(args: argparse.Namespace) -> int:
    if args.min is not None and args.limit is not None and args.min > args.limit:
        raise UserError(f"--min {args.min} is above --limit {args.limit}")
    report = api.fit(
        args.scenarios or None,
        args.results,
        plan_options(args),
        RunOptions(
            timeout_s=args.timeout,
            resume=args.resume,
            memory_logging=args.memory_logging,
            no_data_processing=args.no_data_processing,
            recheck=args.recheck,
        ),
        FitOptions(
            probe_steps=args.probe_steps,
            search=args.max,
            low=args.min,
            limit=args.limit,
            margin=args.margin,
            memory_gib=args.memory_gib,
        ),
        executor=api.executor_from_flags(args),
        argv=[PROG, *sys.argv[1:]],
    )
    print(*api.fit_lines(report), sep="\n")
    return report.exit_code


def add_parser(sub: Any) -> None:
    from orchestrator.cli.run import add_executor_args

    p = sub.add_parser(
        "fit",
        help="find the largest batch (or sequence length) that fits, by probes",
        description="Search, per cell family, the largest per-device batch or max_seq_len "
        "that fits, by short fresh launches; report it without changing the matrix.",
        epilog=_FIT_EPILOG,
        formatter_class=Formatter,
    )
    add_selection_args(p)
    p.set_defaults(results="results/fit")
    s = p.add_argument_group("what to search")
    s.add_argument(
        "--max",
        choices=SEARCH_KEYS,
        help="search this in every selected scenario (default: each scenario's search: key; "
        "scenarios without one are left out)",
    )
    s.add_argument(
        "--min",
        type=positive_int,
        metavar="N",
        help="a value that fits, probed first (default: search:'s min, else 1, or 64 tokens)",
    )
    s.add_argument(
        "--limit", type=positive_int, metavar="N", help="no probe above this (default: none)"
    )
    s.add_argument(
        "--margin",
        type=_margin,
        metavar="F",
        help="a probe whose peak memory is above (1 - F) of the device's does not fit "
        f"(default: search:'s margin, else {DEFAULT_MARGIN:g}; 0: only a real OOM counts)",
    )
    s.add_argument(
        "--probe-steps",
        type=positive_int,
        metavar="N",
        default=3,
        help="optimizer steps of each probe (default: 3)",
    )
    s.add_argument(
        "--memory-gib",
        type=positive_float,
        metavar="G",
        help="one device's memory for the margin where this machine cannot tell it "
        "(jobs on another machine; default: NVML, or on the CPU the memory cgroup limit)",
    )
    g = p.add_argument_group("how to run")
    g.add_argument(
        "--timeout",
        type=positive_int,
        metavar="SECONDS",
        help="time limit of each probe (default: the file's timeout_s, else 3600)",
    )
    g.add_argument(
        "--resume",
        action="store_true",
        help="keep the folder and reuse its probes that ended ok or oom; without it an "
        "earlier fit is moved to RESULTS.<timestamp>",
    )
    add_recheck_arg(g)
    g.add_argument(
        "--no-data-processing",
        action="store_true",
        help="train on the dataset file as it is",
    )
    g.add_argument(
        "--memory-logging",
        choices=tuple(MEMORY_LOGGING),
        default="all",
        help="memory measurement, as for run (default: all)",
    )
    add_executor_args(p, g, "probes")
    p.set_defaults(func=cmd_fit)
