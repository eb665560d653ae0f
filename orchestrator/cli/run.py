"""``tunematrix run``: the flags of every executor, the one chosen, then the run."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from orchestrator.api import settle_earlier_jobs
from orchestrator.cli.common import (
    PROG,
    Formatter,
    add_energy_prices,
    add_recheck_arg,
    positive_float,
)
from orchestrator.cli.selection import add_selection_args, plan_from_args
from orchestrator.config.scenarios import BenchConfig
from orchestrator.config.values import LAUNCH_MODES, MEMORY_LOGGING
from orchestrator.contract.errors import UserError
from orchestrator.contract.outcome import (
    NOT_LAUNCHED_PREFIX,
    PRUNED_PREFIX,
    is_not_launched,
    is_pruned,
)
from orchestrator.executors import registry
from orchestrator.executors.base import Executor, ExecutorSection, positive_int

_RUN_EXAMPLES = (
    "tunematrix run",
    'tunematrix run --results results/a100 --num-gpus "1 2" --filter standard-peft',
    "tunematrix run --resume --timeout 3600",
    "tunematrix run --usd-per-gpu-hour 2.5 --tokens 1e9",
    "tunematrix run --cool-down 300 --usd-per-kwh 0.15   (GPUs back near their start temperature)",
    "tunematrix run --launch family     (a family's experiments in one launch)",
)


def _epilog() -> str:
    """The examples: the command's own, then each executor's."""
    lines = [*_RUN_EXAMPLES, *(e for cls in registry.EXECUTORS.values() for e in cls.examples)]
    return "Examples:\n" + "".join(f"  {line}\n" for line in lines)


def choose_executor(args: argparse.Namespace) -> type[Executor]:
    """The executor ``--executor`` names (or its own flags choose); every executor's
    flags are checked against the choice."""
    chosen = registry.get(args.executor)
    if args.executor == registry.DEFAULT:
        picked = [cls for cls in registry.EXECUTORS.values() if cls.chosen_by(args)]
        chosen = picked[0] if picked else chosen
    flags: Mapping[str, Sequence[argparse.Action]] = args.executor_flags
    for name, actions in flags.items():
        given = [a.option_strings[0] for a in actions if getattr(args, a.dest) != a.default]
        registry.get(name).check_flags(args, chosen, given)
    return chosen


class _Once:
    """The chosen executor, made from the flags and the file's section when the file is loaded."""

    def __init__(self, chosen: type[Executor], args: argparse.Namespace) -> None:
        self.chosen = chosen
        self.args = args
        self.made: Executor | None = None

    def __call__(self, config: BenchConfig) -> Executor:
        if self.made is None:
            section = config.section(self.chosen.name)
            assert section is None or isinstance(section, ExecutorSection)
            self.made = self.chosen.from_args(self.args, section)
        return self.made


def cmd_run(args: argparse.Namespace) -> int:
    from orchestrator.matrix.table import format_header, format_table
    from orchestrator.running.fitrun import check_searches, search_after_run
    from orchestrator.running.memoryfit import (
        device_capacity,
        flagged_lines,
        predicted,
        with_memory,
    )
    from orchestrator.running.needs import require
    from orchestrator.running.runner import RunOptions, preflight, run_plan
    from orchestrator.running.stackcheck import check_stack

    if args.gpu_memory_gib is not None and args.gpu_memory_gib <= 0:
        raise UserError(f"--gpu-memory-gib must be positive, got {args.gpu_memory_gib:g}")
    executor_for = _Once(choose_executor(args), args)
    planned = plan_from_args(args, gpu_counter=lambda config: executor_for(config).gpu_counter())
    plan = planned.plan
    executor = executor_for(planned.config)
    # a missing package, named once here rather than by every experiment's failure
    require(plan.experiments, executor.name)
    # a search: that cannot apply, refused now rather than after the matrix
    check_searches(planned.config, plan)
    options = RunOptions(
        timeout_s=args.timeout,
        resume=args.resume,
        fail_fast=args.fail_fast,
        memory_logging=args.memory_logging,
        no_data_processing=args.no_data_processing,
        usd_per_gpu_hour=args.usd_per_gpu_hour or planned.config.usd_per_gpu_hour,
        tokens=args.tokens,
        cool_down_s=args.cool_down or 0.0,
        usd_per_kwh=args.usd_per_kwh or planned.config.usd_per_kwh,
        grams_co2_per_kwh=args.grams_co2_per_kwh or planned.config.grams_co2_per_kwh,
        report=not args.no_report,
        prune=not args.no_prune,
        stop_early=not args.no_stop_early,
        launch=args.launch or planned.config.launch or "cell",
    )
    # everything the executor would refuse later, refused here, before a folder is touched
    preflight(executor, plan, planned.layout, options)
    settle_earlier_jobs(planned.layout)
    # every cell's settings against the installed stack, each model found, once
    checked = check_stack(
        plan, skip=args.no_check, keep=True, recheck=args.recheck, memory=predicted
    )
    capacity, source = device_capacity(args.gpu_memory_gib, here=executor.gpu_counter() is None)
    plan = with_memory(checked.plan, checked.memory, capacity, source)
    print(
        format_header(
            plan, planned.config.scenarios_file, planned.config.defaults_file, notes=args.note
        )
    )
    for line in [*checked.lines(), *flagged_lines(plan)]:
        print(f"  {line}")
    print()
    print(format_table(plan), flush=True)
    print()
    started = time.monotonic()
    report = run_plan(
        plan, Path(args.results), options, argv=[PROG, *sys.argv[1:]], executor=executor
    )
    # scenarios with search: the largest batch or length that fits, into RESULTS/fit/
    search_after_run(
        planned.config, plan, report, options, executor=executor, argv=[PROG, *sys.argv[1:]]
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
        print(f"  recorded as run {report.history_run_id} in {report.layout.history}")
    if report.moved_to is not None:
        print(f"  the earlier run is in {report.moved_to}")
    for eid, outcome in report.outcomes.items():
        if is_pruned(outcome.status, outcome.error):
            print(f"  pruned: {eid} ({(outcome.error or '').removeprefix(PRUNED_PREFIX)})")
        elif is_not_launched(outcome.status, outcome.error):
            print(
                f"  not launched: {eid} ({(outcome.error or '').removeprefix(NOT_LAUNCHED_PREFIX)})"
            )
        elif outcome.status not in ("ok", "skipped", "planned"):
            print(f"  {outcome.status}: {eid}: {outcome.error}")
            if outcome.log:
                print(f"      log: {outcome.log}")
    if any(o.status == "planned" for o in report.outcomes.values()):
        print(f"  submitted; when the jobs are done: tunematrix report {args.results}")
    if report.interrupted:
        print(f"{PROG}: interrupted; finished experiments are kept", file=sys.stderr)
    return report.exit_code


class _Recorder:
    """An argument group that remembers the flags added to it (one executor's)."""

    def __init__(self, group: Any) -> None:
        self.group = group
        self.actions: list[argparse.Action] = []

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        action: argparse.Action = self.group.add_argument(*args, **kwargs)
        self.actions.append(action)
        return action


def add_parser(sub: Any) -> None:
    r = sub.add_parser(
        "run",
        help="run the experiment matrix",
        description="Run every planned experiment and merge the results.",
        epilog=_epilog(),
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
        "--no-prune",
        action="store_true",
        help="launch every experiment; by default a GPU cell predicted before launch to need "
        "more memory than its GPU has (by a clear margin) is recorded as pruned, not "
        "launched, and so, once one runs out of memory, are those of its family that need at "
        "least as much (PRUNE=false)",
    )
    g.add_argument(
        "--gpu-memory-gib",
        type=float,
        metavar="G",
        help="one GPU's memory to set each GPU cell's predicted memory against (default: "
        "the smallest GPU NVML lists here, for the executors that run jobs here; without "
        "either, nothing is pruned before launch; --no-check predicts nothing)",
    )
    g.add_argument(
        "--launch",
        choices=LAUNCH_MODES,
        default=None,
        help="cell: a launch per experiment (the default); family: the experiments that "
        "share model, task, trainer, framework, GPU count, dtype and interpreter run one "
        "after another in one launch, paying its start-up once (the file's launch:; "
        "LAUNCH=family)",
    )
    g.add_argument(
        "--no-check",
        action="store_true",
        help="launch without checking every cell against the installed libraries first "
        "(each cell then finds a refused setting or a missing model on its own, after its "
        "imports; CHECK=false)",
    )
    add_recheck_arg(g)
    g.add_argument(
        "--no-stop-early",
        action="store_true",
        help="launch every experiment; by default, once two cells of one model, trainer and "
        "framework fail with the same error (not out of memory, not a time limit), the others "
        "like them are recorded as spared, not launched (STOP_EARLY=false)",
    )
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
        "--executor",
        choices=tuple(registry.EXECUTORS),
        default=registry.DEFAULT,
        help="where the experiments run: "
        + "; ".join(f"{name}: {cls.summary}" for name, cls in registry.EXECUTORS.items())
        + " (EXECUTOR=)",
    )
    flags: dict[str, list[argparse.Action]] = {}
    for name, cls in registry.EXECUTORS.items():
        # each executor's flags: its own group, or the general one
        recorder = _Recorder(r.add_argument_group(cls.flags_title) if cls.flags_title else g)
        cls.add_flags(recorder)
        flags[name] = recorder.actions
    g.add_argument(
        "--usd-per-gpu-hour",
        type=float,
        metavar="USD",
        help="price of a GPU-hour for the report's cost columns (default: the file's cost:)",
    )
    g.add_argument(
        "--tokens",
        type=float,
        metavar="N",
        help="a token budget: the report estimates the time and cost to train it",
    )
    add_energy_prices(g)
    g.add_argument(
        "--cool-down",
        type=positive_float,
        metavar="SECONDS",
        help="before each launch, wait at most SECONDS for each of its GPUs to be back "
        "within 3 °C of its temperature before the first launch that used it (back-to-back "
        "cells heat the GPUs and slow the later ones); the wait is recorded per cell "
        "(cooldown_wait_s); local and packed runs only",
    )
    r.set_defaults(func=cmd_run, executor_flags=flags)
