"""``tunematrix`` / ``python -m orchestrator``: the command line over the library.

Errors the user can fix become one line on stderr and exit code 2; an
interrupted command exits 130.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from orchestrator import __version__
from orchestrator.api import ids_text, settle_earlier_jobs
from orchestrator.config import BenchConfig
from orchestrator.errors import UserError
from orchestrator.matrix import Plan
from orchestrator.paths import ResultsLayout
from orchestrator.values import MEMORY_LOGGING

PROG = "tunematrix"


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (and exit code 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


class _Formatter(argparse.RawDescriptionHelpFormatter):
    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=32)


def parse_int_list(text: str, flag: str) -> tuple[int, ...]:
    """``"1 2"`` or ``"1,2"`` -> ``(1, 2)``; every value a distinct positive integer."""
    values: list[int] = []
    for word in text.replace(",", " ").split():
        try:
            value = int(word)
        except ValueError:
            raise UserError(f"{flag}: {word!r} is not an integer (got {text!r})") from None
        if value <= 0:
            raise UserError(f"{flag}: {value} is not a positive integer (got {text!r})")
        if value in values:
            raise UserError(f"{flag}: {value} is listed twice (got {text!r})")
        values.append(value)
    if not values:
        raise UserError(f'{flag}: no values given; write them like "1 2"')
    return tuple(values)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value} is not a positive integer")
    return value


# ---------------------------------------------------------------------------
# Shared selection flags (plan and run)
# ---------------------------------------------------------------------------


def _add_selection_args(p: argparse.ArgumentParser) -> None:
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
        type=_positive_int,
        metavar="N",
        help="run each cell N times, each in a fresh process (default: the file's, else 1)",
    )
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


@dataclass(frozen=True)
class _Planned:
    config: BenchConfig
    plan: Plan
    layout: ResultsLayout


def _plan_from_args(args: argparse.Namespace) -> _Planned:
    from orchestrator import api

    config = api.load(
        args.scenarios or None,
        defaults=args.defaults,
        frameworks=args.frameworks,
        accelerate_config=args.accelerate_config,
    )
    num_gpus = parse_int_list(args.num_gpus, "--num-gpus") if args.num_gpus else None
    gpus = None
    needs_count = args.device == "auto" or (args.device == "gpu" and num_gpus is None)
    if needs_count and getattr(args, "executor", "local") == "slurm":
        # the jobs run on the cluster's nodes, not here: count a node's GPUs there
        from orchestrator.slurm import cluster_gpus

        partition = args.slurm_partition or (config.slurm or {}).get("partition")
        gpus = cluster_gpus(partition)
    plan = api.plan(
        config,
        num_gpus=num_gpus,
        effective_batch_size=(
            parse_int_list(args.effective_batch_size, "--effective-batch-size")
            if args.effective_batch_size
            else None
        ),
        filters=args.filter,
        device=args.device,
        repeats=args.repeats,
        preview=args.command == "plan",
        gpus=gpus,
    )
    return _Planned(config=config, plan=plan, layout=ResultsLayout(Path(args.results)))


# ---------------------------------------------------------------------------
# Commands
# ---------------------------------------------------------------------------


def cmd_plan(args: argparse.Namespace) -> int:
    from orchestrator.plantable import (
        format_commands,
        format_header,
        format_table,
        plan_csv,
        write_plan_csv,
    )

    planned = _plan_from_args(args)
    plan = planned.plan
    if args.output == "-":
        sys.stdout.write(plan_csv(plan))
        return 0
    print(
        format_header(
            plan, planned.config.scenarios_file, planned.config.defaults_file, notes=args.note
        )
    )
    print()
    print(format_table(plan))
    if args.commands:
        print()
        print(format_commands(plan.experiments, planned.layout))
    if args.output:
        write_plan_csv(plan, Path(args.output))
        print(f"\nwrote {args.output}", file=sys.stderr)
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from orchestrator.needs import require
    from orchestrator.plantable import format_header, format_table
    from orchestrator.runner import RunOptions, run_plan

    if args.slots > 1 and not args.pack:
        raise UserError("--slots only has a meaning with --pack")
    if args.executor == "slurm" and args.pack:
        raise UserError("--pack is for one machine; SLURM schedules the jobs itself")
    planned = _plan_from_args(args)
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
        from orchestrator.jobs import timeout_for
        from orchestrator.slurm import check_cluster, make_executor

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
    from orchestrator.slurm import SlurmSettings, parse_time

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


def _positive(value: float | None, flag: str) -> float | None:
    if value is not None and not value > 0:
        raise UserError(f"{flag} must be a positive number, got {value:g}")
    return value


def cmd_report(args: argparse.Namespace) -> int:
    from orchestrator import api
    from orchestrator.reporting import status_counts

    source = Path(args.source)
    gpu_memory = _positive(args.gpu_memory_gib, "--gpu-memory-gib")
    price = _positive(args.usd_per_gpu_hour, "--usd-per-gpu-hour")
    tokens = _positive(args.tokens, "--tokens")
    running: list[str] = []
    if source.is_dir() and (source / "runs").is_dir():
        from orchestrator.paths import ResultsLayout
        from orchestrator.slurm import settle

        collected, running = settle(ResultsLayout(source))
        if collected:
            print(f"collected {collected} finished SLURM job(s)")
        if running:
            print(
                f"{len(running)} SLURM job(s) still queued or running ({ids_text(running)}); "
                "the report shows them as not run yet"
            )
    report = api.report(
        source,
        args.output,
        usd_per_gpu_hour=price,
        tokens=tokens,
        gpu_memory_gib=gpu_memory,
        plots=not args.no_plots,
    )
    print(
        f"tunematrix report: {len(report.rows)} experiments, {len(report.cells)} cells — "
        + status_counts(report.rows)
    )
    for path in report.written:
        print(f"  {path}")
    if source.is_dir() and not running:
        run_id = _record_awaited_run(source, report.rows)
        if run_id is not None:
            print(f"  recorded as run {run_id} in {source / 'history.sqlite'}")
    return 0


def _record_awaited_run(source: Path, rows: Any) -> int | None:
    """A run submitted with --no-wait ends when its last job has: it enters the
    history then, as a waited-for run does (later runs check time limits against
    it). Once: env.json says whether it is still awaited."""
    from orchestrator import envinfo, history

    env = envinfo.read(source)
    if env is None or env.get("awaiting_jobs") is not True:
        return None
    env["finished_at"] = envinfo.now()
    env["awaiting_jobs"] = False
    run_id = history.record(history.path_for(source), rows, env, source)
    envinfo.write(source / "env.json", env)
    return run_id


def cmd_compare(args: argparse.Namespace) -> int:
    from orchestrator import api, comparing, history

    new_path = Path(args.new)
    if args.history:
        db: Path | None = Path(args.history)
    else:
        db = history.path_for(new_path) if new_path.is_dir() else None
    output = Path(args.output) if args.output else (new_path if new_path.is_dir() else Path("."))
    result = api.compare(
        args.new,
        args.ref,
        metrics=args.metric,
        threshold=args.threshold,
        out=output,
        plots=not args.no_plots,
        history=db,
        flags=True,
    )
    written = result.written
    regressions = result.regressions
    matched = result.table[result.keys].drop_duplicates().shape[0] if len(result.table) else 0
    print(
        f"tunematrix compare: {matched} matched cells, {len(regressions)} regression(s); "
        f"{len(result.only_new)} only in new, {len(result.only_ref)} only in the reference"
    )
    for note in result.notes:
        print(f"  note: {note}")
    for _, row in regressions.iterrows():
        cell = comparing.cell_label(row, result.keys)
        change = row["change"]
        shown = "" if change is None or change != change else f" {100 * change:+.1f}%"
        print(f"  regression: {cell}: {row['metric']}{shown} {row['why']}".rstrip())
    for path in written:
        print(f"  {path}")
    return 1 if len(regressions) else 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from orchestrator import api, doctor

    # the config a job gets when its framework names none, found as `plan` finds it
    project, why = None, None
    try:
        default = api.load().default_accelerate
        project = default.path if default is not None else None
    except UserError as exc:
        why = str(exc)
    diagnosis = doctor.diagnose(doctor.gather(Path(args.results), project, why))
    sys.stdout.write(doctor.format_json(diagnosis) if args.json else doctor.format_text(diagnosis))
    return diagnosis.exit_code


def cmd_history(args: argparse.Namespace) -> int:
    from orchestrator import history

    db = history.path_for(Path(args.results))
    runs = history.runs(db)
    if not runs:
        print(f"no runs recorded in {db}")
        return 0
    print(
        f"{'run':>4}  {'started':<26} {'experiments':>11}  {'statuses':<30} {'git':<11} host / GPUs"
    )
    for r in runs:
        counts = ", ".join(f"{k} {v}" for k, v in json.loads(r["counts"] or "{}").items())
        gpus = ", ".join(sorted(set(json.loads(r["gpus"] or "[]")))) or "CPU"
        git = (r["git_sha"] or "-")[:10]
        flag = " (interrupted)" if r["interrupted"] else ""
        print(
            f"{r['run_id']:>4}  {r['started_at'] or '-':<26} {r['experiments']:>11}  "
            f"{counts + flag:<30} {git:<11} {r['host']} / {gpus}"
        )
    return 0


# ---------------------------------------------------------------------------
# Parser
# ---------------------------------------------------------------------------

_MAIN_EPILOG = """\
Examples:
  tunematrix plan                          preview the default matrix for this machine
  tunematrix plan --device gpu --num-gpus "1 2 4" --filter standard-peft --commands
  tunematrix run --results results         run the matrix (resumable with --resume)
  DRY_RUN=true bash run_benchmarks.sh      the same preview through the shell script
  tunematrix doctor                        what this machine has, and what to install
"""

_PLAN_EPILOG = """\
Examples:
  tunematrix plan
  tunematrix plan --scenarios scenarios.yaml --filter 'cpu-*' --output plan.csv
  tunematrix plan --device gpu --num-gpus "1 2 4" --effective-batch-size "8 16" --commands
  tunematrix plan --output - | column -s, -t

Nothing is created or deleted (except the --output file), no GPU is needed, and
the training stack is not imported.
"""

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

_REPORT_EPILOG = """\
Examples:
  tunematrix report results
  tunematrix report results --usd-per-gpu-hour 2.5 --tokens 2e9
  tunematrix report old_benchmarks/raw_summary.csv --output report/
  tunematrix report refs/a100_80gb.csv --gpu-memory-gib 80
"""

_COMPARE_EPILOG = """\
Examples:
  tunematrix compare results results.20261120-101500
  tunematrix compare results refs/a100_80gb.csv --metric train_tokens_per_second
  tunematrix compare results run:3 --threshold 0.05
  tunematrix history results              (the run ids)
"""

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

_HISTORY_EPILOG = """\
Examples:
  tunematrix history
  tunematrix history results/a100
"""


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        description="Plan, run and compare LLM fine-tuning benchmark matrices.",
        epilog=_MAIN_EPILOG,
        formatter_class=_Formatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    p = sub.add_parser(
        "plan",
        help="print the experiment matrix (the dry run)",
        description="Expand the scenarios into the experiment matrix and print it.",
        epilog=_PLAN_EPILOG,
        formatter_class=_Formatter,
    )
    _add_selection_args(p)
    p.add_argument("--output", metavar="CSV", help="also write the plan as CSV ('-': stdout only)")
    p.add_argument(
        "--commands",
        action="store_true",
        help="print the exact accelerate launch command of each experiment",
    )
    p.set_defaults(func=cmd_plan)

    r = sub.add_parser(
        "run",
        help="run the experiment matrix",
        description="Run every planned experiment and merge the results.",
        epilog=_RUN_EPILOG,
        formatter_class=_Formatter,
    )
    _add_selection_args(r)
    g = r.add_argument_group("how to run")
    g.add_argument(
        "--timeout",
        type=_positive_int,
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
        type=_positive_int,
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
        type=_positive_int,
        metavar="N",
        help="GPUs per node; a job needing more spans nodes (default: a node's GPUs)",
    )
    sl.add_argument(
        "--slurm-cpus-per-task",
        type=_positive_int,
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
        "--array-parallelism", type=_positive_int, metavar="N", help="at most N array tasks at once"
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

    rep = sub.add_parser(
        "report",
        help="write the tables and plots of a results folder",
        description="Write raw_summary.csv, benchmarks.csv, summary.md and plots/ for a results "
        "folder (or a summary CSV, ours or fms-acceleration's). Runs after every run; "
        "needs no training stack.",
        epilog=_REPORT_EPILOG,
        formatter_class=_Formatter,
    )
    rep.add_argument(
        "source", metavar="RESULT_DIR", help="results folder, or a raw_summary.csv/benchmarks.csv"
    )
    rep.add_argument(
        "--output",
        metavar="DIR",
        help="where to write (default: the results folder itself; for a CSV or a "
        "predecessor's folder, a tunematrix-report/ folder beside it)",
    )
    rep.add_argument(
        "--usd-per-gpu-hour",
        type=float,
        metavar="USD",
        help="price of a GPU-hour (default: the run's)",
    )
    rep.add_argument(
        "--tokens", type=float, metavar="N", help="estimate time and cost to train N tokens"
    )
    rep.add_argument(
        "--gpu-memory-gib",
        type=float,
        metavar="GIB",
        help="memory of one GPU, for a table that does not record it (default: the run's "
        "env.json, else a GPU named in the rows or the file name: a100_80gb, h100, h200…); "
        "failed runs without metrics that came near it are shown as likely OOM",
    )
    rep.add_argument("--no-plots", action="store_true", help="tables only")
    rep.set_defaults(func=cmd_report)

    cmp_ = sub.add_parser(
        "compare",
        help="compare a run against a reference; exit 1 on a regression",
        description="Match the cells of NEW and REF and flag regressions. NEW and REF are "
        "results folders, summary CSVs (ours or fms-acceleration's), or run:<id> from the "
        "history of NEW's results folder.",
        epilog=_COMPARE_EPILOG,
        formatter_class=_Formatter,
    )
    cmp_.add_argument("new", metavar="NEW")
    cmp_.add_argument("ref", metavar="REF")
    cmp_.add_argument(
        "--metric",
        action="append",
        default=[],
        metavar="NAME",
        help="metric to compare; repeatable (default: throughput, step time, peak memory, MFU)",
    )
    cmp_.add_argument(
        "--threshold",
        type=float,
        default=0.1,
        metavar="FRACTION",
        help="relative change that counts as a regression (default: 0.1)",
    )
    cmp_.add_argument(
        "--output",
        metavar="DIR",
        help="where to write compare.csv/.md (default: NEW's folder, else .)",
    )
    cmp_.add_argument("--history", metavar="FILE", help="history.sqlite to look run:<id> up in")
    cmp_.add_argument("--no-plots", action="store_true", help="tables only")
    cmp_.set_defaults(func=cmd_compare)

    his = sub.add_parser(
        "history",
        help="list the runs recorded in a results folder",
        description="List the runs recorded in RESULT_DIR/history.sqlite.",
        epilog=_HISTORY_EPILOG,
        formatter_class=_Formatter,
    )
    his.add_argument("results", metavar="RESULT_DIR", nargs="?", default="results")
    his.set_defaults(func=cmd_history)

    doc = sub.add_parser(
        "doctor",
        help="check what this machine has for running matrices (changes nothing)",
        description="List the GPUs and driver, NVML, the training stack and its versions, "
        "accelerate's default config, SLURM and the results folder's free space, each with "
        "ok or what to install.",
        epilog=_DOCTOR_EPILOG,
        formatter_class=_Formatter,
    )
    doc.add_argument(
        "--results",
        metavar="DIR",
        default="results",
        help="results folder whose free space to check (default: results)",
    )
    doc.add_argument("--json", action="store_true", help="print the checks as JSON")
    doc.set_defaults(func=cmd_doctor)
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
