"""``tunematrix run``: the flags of every executor, the one chosen, then the run."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from orchestrator import api
from orchestrator.api import ReportOptions, RunOptions, RunResult
from orchestrator.cli.common import (
    PROG,
    Formatter,
    add_energy_prices,
    add_recheck_arg,
    positive_float,
)
from orchestrator.cli.selection import add_selection_args, plan_options
from orchestrator.contract.choices import LAUNCH_MODES, MEMORY_LOGGING, positive_int
from orchestrator.contract.layout import ResultsLayout
from orchestrator.contract.outcome import PRUNED, tally

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
    lines = [*_RUN_EXAMPLES, *(e for cls in api.executors().values() for e in cls.examples)]
    return "Examples:\n" + "".join(f"  {line}\n" for line in lines)


def cmd_run(args: argparse.Namespace) -> int:
    started = time.monotonic()
    done = api.run(
        args.scenarios or None,
        args.results,
        plan_options(args),
        RunOptions(
            timeout_s=args.timeout,
            resume=args.resume,
            fail_fast=args.fail_fast,
            memory_logging=args.memory_logging,
            no_data_processing=args.no_data_processing,
            cool_down_s=args.cool_down or 0.0,
            report=not args.no_report,
            prune=not args.no_prune,
            stop_early=not args.no_stop_early,
            launch=args.launch,
            check=not args.no_check,
            recheck=args.recheck,
            gpu_memory_gib=args.gpu_memory_gib,
        ),
        ReportOptions(
            usd_per_gpu_hour=args.usd_per_gpu_hour,
            tokens=args.tokens,
            usd_per_kwh=args.usd_per_kwh,
            grams_co2_per_kwh=args.grams_co2_per_kwh,
        ),
        executor=api.executor_from_flags(args),
        announce=api.stdout_announce(args.note),
        argv=[PROG, *sys.argv[1:]],
    )
    _say_done(args, done, time.monotonic() - started)
    return done.exit_code


def _say_done(args: argparse.Namespace, done: RunResult, seconds: float) -> None:
    """The run's last lines: the counts, the files, and each cell that did not run ok."""
    layout = ResultsLayout(done.results)
    counts = tally(done.outcomes.values())
    minutes, secs = divmod(int(seconds), 60)
    print(
        f"\ntunematrix run: {len(done.outcomes)} experiments in {args.results} — "
        f"{', '.join(f'{status} {n}' for status, n in sorted(counts.items()))} "
        f"({minutes}:{secs:02d})"
    )
    if done.summary is not None:
        print(f"  summary: {layout.summary_md}")
        print(f"  tables:  {layout.raw_summary}, {layout.benchmarks}")
    else:
        print(f"  table:   {layout.raw_summary}")
        print(f"  report:  not written; `{PROG} report {args.results}` writes it")
    if done.history_run_id is not None:
        print(f"  recorded as run {done.history_run_id} in {layout.history}")
    if done.moved_to is not None:
        print(f"  the earlier run is in {done.moved_to}")
    for eid, outcome in done.outcomes.items():
        if outcome.skip is not None:
            said = "pruned" if outcome.skip.kind == PRUNED else "not launched"
            print(f"  {said}: {eid} ({outcome.skip.because})")
        elif outcome.status not in ("ok", "skipped", "planned"):
            print(f"  {outcome.status}: {eid}: {outcome.error}")
            if outcome.log:
                print(f"      log: {outcome.log}")
    if any(o.status == "planned" for o in done.outcomes.values()):
        print(f"  submitted; when the jobs are done: tunematrix report {args.results}")
    if done.interrupted:
        print(f"{PROG}: interrupted; finished experiments are kept", file=sys.stderr)


def add_executor_args(p: argparse.ArgumentParser, g: Any, what: str, suffix: str = "") -> None:
    """``--executor`` (``what`` runs there) and every executor's own flags: each
    executor's in its own group, or in ``g`` (``api.choose_executor`` checks them)."""
    g.add_argument(
        "--executor",
        choices=tuple(api.executors()),
        default=api.default_executor(),
        help=f"where the {what} run: "
        + "; ".join(f"{name}: {cls.summary}" for name, cls in api.executors().items())
        + suffix,
    )
    flags: dict[str, list[argparse.Action]] = {}
    for name, cls in api.executors().items():
        # each executor's flags: its own group, or the general one
        recorder = _Recorder(p.add_argument_group(cls.flags_title) if cls.flags_title else g)
        cls.add_flags(recorder)
        flags[name] = recorder.actions
    p.set_defaults(executor_flags=flags)


class _Recorder:
    """An argument group that keeps the flags added to it (one executor's)."""

    def __init__(self, group: Any) -> None:
        self.group = group
        self.actions: list[argparse.Action] = []

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        action: argparse.Action = self.group.add_argument(*args, **kwargs)
        self.actions.append(action)
        return action


def _add_how_to_run(g: Any) -> None:
    """The flags of how each experiment runs, before the executor's."""
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
        type=positive_float,
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
    _add_how_to_run(g)
    add_executor_args(r, g, "experiments", " (EXECUTOR=)")
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
    r.set_defaults(func=cmd_run)
