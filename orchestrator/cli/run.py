"""``tunematrix run``."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from orchestrator.api import settle_earlier_jobs
from orchestrator.cli.common import (
    PROG,
    Formatter,
    add_selection_args,
    plan_from_args,
    positive_int,
)
from orchestrator.config.values import MEMORY_LOGGING
from orchestrator.contract.errors import UserError

_RUN_EPILOG = """\
Examples:
  tunematrix run
  tunematrix run --results results/a100 --num-gpus "1 2" --filter standard-peft
  tunematrix run --resume --timeout 3600
  tunematrix run --usd-per-gpu-hour 2.5 --tokens 1e9
  tunematrix run --pack --num-gpus "1 2 4"          # side by side on this node's GPUs
  tunematrix run --executor slurm --slurm-partition gpu --slurm-time 2:00:00
  tunematrix run --executor slurm --array --array-parallelism 8 --no-wait
"""


def cmd_run(args: argparse.Namespace) -> int:
    from orchestrator.matrix.table import format_header, format_table
    from orchestrator.running.needs import require
    from orchestrator.running.runner import RunOptions, run_plan

    if args.slots > 1 and not args.pack:
        raise UserError("--slots only has a meaning with --pack")
    if args.executor == "slurm" and args.pack:
        raise UserError("--pack is for one machine; SLURM schedules the jobs itself")
    planned = plan_from_args(args)
    plan = planned.plan
    # a missing package, named once here rather than by every experiment's failure
    require(plan.experiments, args.executor)
    options = RunOptions(
        timeout_s=args.timeout,
        resume=args.resume,
        fail_fast=args.fail_fast,
        memory_logging=args.memory_logging,
        no_data_processing=args.no_data_processing,
        usd_per_gpu_hour=args.usd_per_gpu_hour or planned.config.usd_per_gpu_hour,
        tokens=args.tokens,
        pack=args.pack,
        slots=args.slots,
        report=not args.no_report,
    )
    executor = None
    if args.executor == "slurm":
        from orchestrator.executors.slurm import check_cluster, make_executor
        from orchestrator.job.execute import timeout_for

        settings = _slurm_settings(args, planned.config.slurm or {})
        # everything SLURM would refuse, refused here, before a folder is touched
        cluster = check_cluster(
            plan.experiments, settings, planned.layout, lambda e: timeout_for(e, options)
        )
        executor = make_executor(settings, cluster)
    else:
        given = [
            "--" + name.replace("_", "-")
            for name in SLURM_FLAGS
            if getattr(args, name) not in (None, False, [])
        ]
        if given:
            raise UserError(f"{', '.join(given)}: only with --executor slurm")
    settle_earlier_jobs(planned.layout)
    print(
        format_header(
            plan, planned.config.scenarios_file, planned.config.defaults_file, notes=args.note
        )
    )
    print()
    print(format_table(plan), flush=True)
    print()
    started = time.monotonic()
    report = run_plan(
        plan, Path(args.results), options, argv=[PROG, *sys.argv[1:]], executor=executor
    )
    counts = ", ".join(f"{status} {n}" for status, n in sorted(report.counts().items()))
    minutes, seconds = divmod(int(time.monotonic() - started), 60)
    print(
        f"\ntunematrix run: {len(plan.experiments)} experiments in {args.results} — {counts} "
        f"({minutes}:{seconds:02d})"
    )
    if report.reported:
        print(f"  summary: {report.layout.summary_md}")
        print(f"  tables:  {report.layout.raw_summary}, {report.layout.benchmarks}")
    else:
        print(f"  table:   {report.layout.raw_summary}")
        print(f"  report:  not written; `{PROG} report {args.results}` writes it")
    if report.history_run_id is not None:
        print(
            f"  recorded as run {report.history_run_id} in {report.layout.root / 'history.sqlite'}"
        )
    if report.moved_to is not None:
        print(f"  the earlier run is in {report.moved_to}")
    for eid, outcome in report.outcomes.items():
        if outcome.status not in ("ok", "skipped", "planned"):
            print(f"  {outcome.status}: {eid}: {outcome.error}")
            if outcome.log:
                print(f"      log: {outcome.log}")
    if args.no_wait:
        print(f"  submitted; when the jobs are done: tunematrix report {args.results}")
    if report.interrupted:
        print(f"{PROG}: interrupted; finished experiments are kept", file=sys.stderr)
    return report.exit_code


SLURM_FLAGS = (
    "slurm_partition",
    "slurm_account",
    "slurm_time",
    "slurm_gpus_per_node",
    "slurm_cpus_per_task",
    "slurm_mem",
    "slurm_option",
    "array",
    "array_parallelism",
    "no_wait",
)


def _slurm_settings(args: argparse.Namespace, file: Mapping[str, Any]) -> Any:
    """The file's slurm: section with the command line on top."""
    from orchestrator.executors.slurm import SlurmSettings, parse_time

    options = dict(file.get("options") or {})
    for item in args.slurm_option:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise UserError(f"--slurm-option {item!r}: write it as NAME=VALUE (qos=high)")
        options[name.strip().lstrip("-")] = value
    time_value = args.slurm_time if args.slurm_time is not None else file.get("time")
    return SlurmSettings(
        partition=args.slurm_partition or file.get("partition"),
        account=args.slurm_account or file.get("account"),
        time_min=parse_time(str(time_value)) if time_value is not None else None,
        gpus_per_node=args.slurm_gpus_per_node or file.get("gpus_per_node"),
        cpus_per_task=args.slurm_cpus_per_task or file.get("cpus_per_task"),
        mem=args.slurm_mem or file.get("mem"),
        options=options,
        array=args.array or bool(file.get("array")),
        array_parallelism=args.array_parallelism or file.get("array_parallelism") or 256,
        wait=not args.no_wait,
    )


def add_parser(sub: Any) -> None:
    r = sub.add_parser(
        "run",
        help="run the experiment matrix",
        description="Run every planned experiment and merge the results.",
        epilog=_RUN_EPILOG,
        formatter_class=Formatter,
    )
    add_selection_args(r)
    g = r.add_argument_group("how to run")
    g.add_argument(
        "--timeout",
        type=positive_int,
        metavar="SECONDS",
        help="time limit of each experiment (default: the file's timeout_s, else 3600)",
    )
    g.add_argument(
        "--resume",
        action="store_true",
        help="keep the results folder and skip experiments whose result is already ok "
        "(NO_OVERWRITE=true); without it an earlier run is moved to RESULTS.<timestamp>",
    )
    g.add_argument("--fail-fast", action="store_true", help="stop at the first failed experiment")
    g.add_argument(
        "--no-report",
        action="store_true",
        help="skip the tables and plots at the end (`tunematrix report RESULT_DIR` makes them)",
    )
    g.add_argument(
        "--no-data-processing",
        action="store_true",
        help="train on the dataset file as it is (NO_DATA_PROCESSING=true)",
    )
    g.add_argument(
        "--memory-logging",
        choices=tuple(MEMORY_LOGGING),
        default="all",
        help="memory measurement: all (sidecar and GPU stage figures from torch.cuda "
        "counters), nvidia (sidecar only), huggingface (stage figures only), hf-tracker "
        "(stage figures from HF's TrainerMemoryTracker, whose polling thread slows "
        "training) (default: all)",
    )
    g.add_argument(
        "--pack",
        action="store_true",
        help="run experiments side by side while GPUs are free (largest first). Off by "
        "default: jobs side by side share CPU, PCIe and NVLink, which changes their numbers",
    )
    g.add_argument(
        "--slots",
        type=positive_int,
        default=1,
        metavar="K",
        help="with --pack, how many CPU processes may run at once (default: 1)",
    )
    g.add_argument(
        "--usd-per-gpu-hour",
        type=float,
        metavar="USD",
        help="price of a GPU-hour for the report's cost columns (default: the file's cost:)",
    )
    sl = r.add_argument_group("SLURM (--executor slurm; defaults from the file's slurm: section)")
    sl.add_argument(
        "--executor",
        choices=("local", "slurm"),
        default="local",
        help="run here (default) or submit every experiment as a SLURM job (EXECUTOR=)",
    )
    sl.add_argument("--slurm-partition", metavar="NAME", help="partition (default: the cluster's)")
    sl.add_argument("--slurm-account", metavar="NAME", help="account to charge")
    sl.add_argument(
        "--slurm-time",
        metavar="TIME",
        help="time limit per job: minutes or [D-]HH:MM:SS (default: --timeout + 5 min)",
    )
    sl.add_argument(
        "--slurm-gpus-per-node",
        type=positive_int,
        metavar="N",
        help="GPUs per node; a job needing more spans nodes (default: a node's GPUs)",
    )
    sl.add_argument(
        "--slurm-cpus-per-task",
        type=positive_int,
        metavar="N",
        help="CPUs per node of a job (default: 4 per GPU; a CPU job: its processes)",
    )
    sl.add_argument("--slurm-mem", metavar="SIZE", help="memory per node, e.g. 200G")
    sl.add_argument(
        "--slurm-option",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="any further sbatch option (--slurm-option qos=high); repeatable",
    )
    sl.add_argument("--array", action="store_true", help="submit the matrix as job arrays")
    sl.add_argument(
        "--array-parallelism", type=positive_int, metavar="N", help="at most N array tasks at once"
    )
    sl.add_argument(
        "--no-wait",
        action="store_true",
        help="return after submitting; `tunematrix report RESULT_DIR` collects the results",
    )
    g.add_argument(
        "--tokens",
        type=float,
        metavar="N",
        help="a token budget: the report estimates the time and cost to train it",
    )
    r.set_defaults(func=cmd_run)
