"""The flags that select and plan a matrix, which ``plan``, ``run`` and ``fit`` share."""

from __future__ import annotations

import argparse

from orchestrator.api import PlanOptions
from orchestrator.cli.common import parse_int_list
from orchestrator.cli.steadyflags import add_measure_args, measure_from_args
from orchestrator.contract.choices import positive_int


def add_selection_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("what to plan")
    g.add_argument(
        "--scenarios",
        metavar="FILE",
        help="scenarios file (default: ./scenarios.yaml, else the shipped one)",
    )
    g.add_argument(
        "--defaults",
        metavar="FILE",
        help="trainer arguments shared by all scenarios "
        "(default: defaults.yaml beside the scenarios file, else the shipped one)",
    )
    g.add_argument(
        "--frameworks",
        metavar="FILE",
        action="append",
        default=[],
        help="extra framework definitions: a YAML file with a frameworks: mapping, or "
        "fms-acceleration's sample-configurations/CONTENTS.yaml as it is; repeatable",
    )
    g.add_argument(
        "--accelerate-config",
        metavar="FILE",
        help="accelerate config for frameworks that name none "
        "(default: the file's accelerate_config:, else accelerate.yaml beside it)",
    )
    g.add_argument(
        "--num-gpus",
        metavar='"N ..."',
        help='GPU counts to run each cell on, e.g. "1 2 4" (on a CPU: process counts; '
        "default: 1 2 capped at the GPUs found, or 1 without a GPU)",
    )
    g.add_argument(
        "--effective-batch-size",
        metavar='"B ..."',
        help='effective (global) batch sizes, e.g. "4 8" (default: the file\'s matrix, else 4 8)',
    )
    g.add_argument(
        "--filter",
        metavar="NAME[,NAME]",
        action="append",
        default=[],
        help="scenarios to run, by name or pattern (peft-*); slow scenarios run only when "
        "named; default: every non-slow scenario for the device",
    )
    g.add_argument(
        "--device",
        choices=("auto", "gpu", "cpu"),
        default="auto",
        help="plan for GPUs or for the CPU (default: auto, GPU when one is found)",
    )
    g.add_argument(
        "--repeats",
        type=positive_int,
        metavar="N",
        help="run each cell N times, each in a fresh process (default: the file's, else 1)",
    )
    g.add_argument(
        "--profile",
        action="store_true",
        help="profile every cell: a few steps after the warm-up recorded with torch.profiler "
        "(a trace per rank in runs/<id>/profile/, communication columns), left out of the "
        "measured window; a scenario's profile: true does it for its own cells",
    )
    g.add_argument(
        "--profile-steps",
        type=positive_int,
        metavar="N",
        help="steps a profile records (default: the scenario's profile_steps, else 3); "
        "implies --profile",
    )
    add_measure_args(g)
    g.add_argument(
        "--results",
        metavar="DIR",
        default="results",
        help="results folder (default: results)",
    )
    g.add_argument(
        "--note",
        metavar="TEXT",
        action="append",
        default=[],
        help="a line for the plan's header (run_benchmarks.sh says how it read its arguments)",
    )


def plan_options(args: argparse.Namespace) -> PlanOptions:
    """The selection flags, as :func:`orchestrator.api.plan` takes them."""
    return PlanOptions(
        defaults=args.defaults,
        frameworks=args.frameworks,
        accelerate_config=args.accelerate_config,
        num_gpus=parse_int_list(args.num_gpus, "--num-gpus") if args.num_gpus else None,
        effective_batch_size=(
            parse_int_list(args.effective_batch_size, "--effective-batch-size")
            if args.effective_batch_size
            else None
        ),
        filters=args.filter,
        device=args.device,
        repeats=args.repeats,
        profile=args.profile,
        profile_steps=args.profile_steps,
        measure=measure_from_args(args),
    )
