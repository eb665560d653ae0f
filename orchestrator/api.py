"""The Python API: plan, run, report and compare a matrix from code.

``from orchestrator import plan, run, report, compare`` gives these four
functions; they stay put when the modules behind them move. Each takes paths
(``str`` or ``Path``) or what is already loaded (a :class:`BenchConfig`, a
scenarios mapping, a :class:`Plan`, a ``DataFrame``) and returns a typed value:

- :func:`plan` -> :class:`Plan` (``.experiments``: one :class:`Experiment` each);
- :func:`run` -> :class:`RunResult` (``.rows``: one row per experiment, a DataFrame);
- :func:`report` -> :class:`Report` (``.rows``, ``.cells``, ``.written``);
- :func:`compare` -> :class:`Comparison` (``.table``: one verdict per cell and
  metric; ``.regressions``: the rows that regressed).

Mistakes the user can fix raise :class:`UserError` (or its subclass
``ConfigError``) with the one line the command line would print.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.contract.choices import LAUNCH_MODES, MEMORY_LOGGING
from orchestrator.contract.clock import now
from orchestrator.contract.errors import UserError
from orchestrator.contract.layout import ResultsLayout, write_atomic

if TYPE_CHECKING:
    import argparse

    import pandas as pd

    from orchestrator.config.scenarios import BenchConfig
    from orchestrator.config.search import FitOptions
    from orchestrator.contract.outcome import Outcome
    from orchestrator.executors.base import Executor, Settled
    from orchestrator.job.execute import RunOptions
    from orchestrator.matrix.experiment import Experiment
    from orchestrator.matrix.plan import Plan
    from orchestrator.results.compare import Comparison
    from orchestrator.results.options import ReportOptions
    from orchestrator.results.report import Report
    from orchestrator.running.fitrun import FitReport

__all__ = [
    "BenchConfig",
    "CompareOptions",
    "Comparison",
    "Experiment",
    "FitOptions",
    "Plan",
    "PlanOptions",
    "Report",
    "ReportOptions",
    "RunOptions",
    "RunResult",
    "UserError",
    "compare",
    "fit",
    "load",
    "plan",
    "report",
    "run",
]

PathLike = str | os.PathLike[str]
if TYPE_CHECKING:
    #: a scenarios file, a loaded config, or the scenarios file's content as a mapping
    ConfigSource = PathLike | BenchConfig | Mapping[str, Any]
    #: what :func:`run` says of the plan before it runs, given the plan, the loaded file
    #: (None for a built plan) and the checks' lines (default: the lines, on stderr)
    Announce = Callable[[Plan, BenchConfig | None, list[str]], None]

#: the API's types, each imported from its module when first asked for (the command
#: line's reading commands start without the planner, the job runner or pandas)
_TYPES = {
    "BenchConfig": "orchestrator.config.scenarios",
    "Comparison": "orchestrator.results.compare",
    "Experiment": "orchestrator.matrix.experiment",
    "FitOptions": "orchestrator.config.search",
    "Plan": "orchestrator.matrix.plan",
    "Report": "orchestrator.results.report",
    "ReportOptions": "orchestrator.results.options",
    "RunOptions": "orchestrator.job.execute",
}


def __getattr__(name: str) -> Any:
    if name not in _TYPES:
        raise AttributeError(f"module 'orchestrator.api' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_TYPES[name]), name)


def _ints(values: int | Sequence[int] | None, name: str) -> tuple[int, ...] | None:
    if values is None:
        return None
    if isinstance(values, int):
        values = (values,)
    out = tuple(values)
    if not out or any(isinstance(v, bool) or not isinstance(v, int) or v <= 0 for v in out):
        raise UserError(f"{name}: give positive integers, got {values!r}")
    if len(set(out)) != len(out):
        raise UserError(f"{name}: a value is listed twice in {values!r}")
    return out


def load(
    scenarios: ConfigSource | None = None,
    *,
    defaults: PathLike | None = None,
    frameworks: Sequence[PathLike] = (),
    accelerate_config: PathLike | None = None,
) -> BenchConfig:
    """Load and check a scenarios file (default: ./scenarios.yaml, else the shipped one).

    ``scenarios`` may also be the file's content as a mapping; its relative paths
    are then taken from the current folder. ``defaults`` is, when not given,
    ``defaults.yaml`` beside the scenarios file, else the shipped one.
    ``frameworks`` are extra framework files: ``frameworks:`` mappings or a
    ``CONTENTS.yaml`` with ``framework_configs:``.
    """
    from orchestrator.config.files import load_found
    from orchestrator.config.scenarios import BenchConfig

    if isinstance(scenarios, BenchConfig):
        return scenarios
    document = None
    path = None
    if isinstance(scenarios, Mapping):
        import yaml

        from orchestrator.config.yamlio import parse_yaml

        path = Path("<scenarios mapping>")
        try:
            text = yaml.safe_dump(dict(scenarios), sort_keys=False)
        except yaml.YAMLError as exc:
            raise UserError(f"the scenarios mapping cannot be written as YAML: {exc}") from None
        document = parse_yaml(text, str(path))
    elif scenarios is not None:
        path = Path(scenarios)
    return load_found(
        path,
        defaults=Path(defaults) if defaults else None,
        frameworks=[Path(f) for f in frameworks],
        accelerate_config=Path(accelerate_config) if accelerate_config else None,
        document=document,
    )


@dataclass(frozen=True)
class PlanOptions:
    """What :func:`plan` takes beyond the scenarios: the files beside them and the selection.

    ``num_gpus`` and ``effective_batch_size`` override the file's matrix;
    ``filters`` picks scenarios by name or pattern (slow ones only when named);
    ``device`` is ``auto``, ``gpu`` or ``cpu``. ``profile`` (or ``profile_steps``,
    how many steps) profiles every cell, as a scenario's ``profile: true`` does its
    own. ``measure`` (``{"until": "steady", "precision": 0.02, "min_steps": 10,
    "max_steps": 200}``, or ``{"until": "steps"}``) sets every cell's measuring over
    the scenarios' ``measure:``. ``notes``: lines for the plan's header.
    """

    defaults: PathLike | None = None
    frameworks: Sequence[PathLike] = ()
    accelerate_config: PathLike | None = None
    num_gpus: int | Sequence[int] | None = None
    effective_batch_size: int | Sequence[int] | None = None
    filters: str | Sequence[str] = ()
    device: str = "auto"
    repeats: int | None = None
    notes: Sequence[str] = ()
    profile: bool = False
    profile_steps: int | None = None
    measure: Mapping[str, Any] | None = None

    def load(self, scenarios: ConfigSource | None) -> BenchConfig:
        """:func:`load` of ``scenarios`` with these options' files."""
        return load(
            scenarios,
            defaults=self.defaults,
            frameworks=self.frameworks,
            accelerate_config=self.accelerate_config,
        )


def _options(kinds: Mapping[str, Any], keywords: dict[str, Any], caller: str) -> list[Any]:
    """The option objects of ``kinds`` (a name: the given object, or its class), each with
    the ``keywords`` that name one of its fields; a keyword no kind has is refused."""
    known: set[str] = set()
    out = []
    for given in kinds.values():
        names = _field_names(given if isinstance(given, type) else type(given))
        known |= names
        mine = {k: v for k, v in keywords.items() if k in names}
        out.append(dataclasses.replace(given() if isinstance(given, type) else given, **mine))
    unknown = sorted(set(keywords) - known)
    if unknown:
        raise TypeError(f"{caller}() got unexpected keyword argument(s): {', '.join(unknown)}")
    return out


def plan(
    scenarios: ConfigSource | None = None,
    options: PlanOptions | None = None,
    *,
    preview: bool = True,
    gpus: int | Callable[[], int] | None = None,
    **keywords: Any,
) -> Plan:
    """Expand the scenarios into the experiments to run; nothing is written.

    ``options`` (:class:`PlanOptions`), or its fields as keywords, say which files
    and cells. ``preview=True`` (as ``plan`` and DRY_RUN do) plans a file with no
    scenario for this machine for its scenarios' own device; :func:`run` plans with
    ``preview=False``. ``gpus`` is the GPU count to plan for, or a function that
    counts them, called only when the plan needs a count (``device="auto"``, or no
    GPU-count axis given); default: the GPUs found here.
    """
    from orchestrator.config.measure import measure_override
    from orchestrator.matrix.expand import Selection, build_plan, parse_filters

    (options,) = _options({"plan": options or PlanOptions}, keywords, "plan")
    if options.device not in ("auto", "gpu", "cpu"):
        raise UserError(f"device must be auto, gpu or cpu, got {options.device!r}")
    for name in ("repeats", "profile_steps"):
        value = getattr(options, name)
        if value is not None and (isinstance(value, bool) or value <= 0):
            raise UserError(f"{name} must be a positive integer, got {value!r}")
    config = options.load(scenarios)
    filters = options.filters
    selection = Selection(
        num_gpus=_ints(options.num_gpus, "num_gpus"),
        effective_batch_size=_ints(options.effective_batch_size, "effective_batch_size"),
        filters=parse_filters([filters] if isinstance(filters, str) else list(filters)),
        device=options.device,
        repeats=options.repeats,
        preview=preview,
        profile=options.profile,
        profile_steps=options.profile_steps,
        measure=measure_override(options.measure),
    )
    if gpus is None:
        from orchestrator.job.hardware import gpu_count

        gpus = gpu_count
    environments = None
    if config.environments:
        from orchestrator.config.environments import resolve_all

        environments = resolve_all(config.environments)
    built = build_plan(config, selection, gpus, environments)
    if options.notes:
        built = dataclasses.replace(built, notes=(*built.notes, *options.notes))
    return built


def plan_csv(the_plan: Plan, path: PathLike | None = None) -> str:
    """The plan as CSV, a row per experiment; with ``path``, written there too."""
    from orchestrator.matrix.table import plan_csv as csv_text

    text = csv_text(the_plan)
    if path is not None:
        write_atomic(Path(path), text)
    return text


def predict_memory(
    the_plan: Plan, gpu_memory_gib: float | None = None, *, recheck: bool = False
) -> Plan:
    """``the_plan`` with each GPU cell's predicted memory (the check before launch, asked
    for it; its lines on stderr), against ``gpu_memory_gib`` or this machine's GPUs."""
    from orchestrator.contract.gpumemory import MemoryPrediction
    from orchestrator.running.memoryfit import device_capacity, predicted, with_memory
    from orchestrator.running.stackcheck import check_stack

    _check_gpu_memory_gib(gpu_memory_gib)
    checked = check_stack(the_plan, keep=True, recheck=recheck, memory=predicted, stop=False)
    for line in checked.lines():
        print(line, file=sys.stderr)
    if checked.refused:
        print(
            f"{len(checked.refused)} cell(s) refused before launch (run would stop at the "
            "first; the table says why for each)",
            file=sys.stderr,
        )
    capacity, source = device_capacity(gpu_memory_gib)
    memory = dict(checked.memory)
    memory.update((cell, MemoryPrediction(refused=why)) for cell, why in checked.refused.items())
    return with_memory(checked.plan, memory, capacity, source)


def plan_preview(
    the_plan: Plan,
    config: BenchConfig,
    results: PathLike = "results",
    *,
    notes: Sequence[str] = (),
    usd_per_gpu_hour: float | None = None,
    memory: bool = False,
    commands: bool = False,
    launch: str | None = None,
) -> str:
    """What ``tunematrix plan`` prints: the plan's header (with ``notes``) and table, its
    cost from the history of ``results`` (a GPU-hour at ``usd_per_gpu_hour``, default the
    file's ``cost:``); with ``memory``, each GPU cell's predicted memory (see
    :func:`predict_memory`); with ``commands``, the launch commands, a launch per cell or
    per family (``launch``; default the file's ``launch:``, else ``cell``)."""
    from orchestrator.job.command import format_commands
    from orchestrator.matrix.table import format_header, format_table
    from orchestrator.results.estimate import estimate_plan

    layout = ResultsLayout(Path(results))
    price = usd_per_gpu_hour or config.usd_per_gpu_hour
    parts = [
        format_header(the_plan, config.scenarios_file, config.defaults_file, notes=notes),
        format_table(the_plan),
        "\n".join(estimate_plan(the_plan.experiments, layout.history).lines(price)),
    ]
    if memory:
        from orchestrator.running.memoryfit import memory_table

        parts.append("\n".join(memory_table(the_plan)))
    if commands:
        launched = launch or config.launch or "cell"
        parts.append(format_commands(the_plan.experiments, layout, launched))
    return "\n\n".join(parts)


@dataclass
class RunResult:
    """What :func:`run` did: a row per experiment and where everything is."""

    #: one row per planned experiment (``status``, the figures, the configuration)
    rows: pd.DataFrame
    #: per experiment id: the status, error, log path and timing of its job
    outcomes: dict[str, Outcome]
    results: Path
    #: summary.md of the report written after the run (None with ``report=False``)
    summary: Path | None
    interrupted: bool
    #: where an earlier, different run of the folder was moved aside, if one was
    moved_to: Path | None
    history_run_id: int | None
    #: what ``tunematrix run`` would exit with: 0 when every experiment is ok (or an
    #: honest oom, or skipped on resume), 1 otherwise, 130 when interrupted
    exit_code: int


def _stderr_lines(plan: Plan, config: BenchConfig | None, lines: list[str]) -> None:
    for line in lines:
        print(line, file=sys.stderr)


def stdout_announce(notes: Sequence[str] = ()) -> Announce:
    """What ``tunematrix run`` prints before the first launch, on stdout: the plan's
    header (with ``notes``), the checks' lines, the table."""
    from orchestrator.matrix.table import format_header, format_table

    def announce(the_plan: Plan, config: BenchConfig | None, lines: list[str]) -> None:
        assert config is not None
        print(format_header(the_plan, config.scenarios_file, config.defaults_file, notes=notes))
        for line in lines:
            print(f"  {line}")
        print()
        print(format_table(the_plan), flush=True)
        print()

    return announce


def executors() -> Mapping[str, type[Executor]]:
    """The registered executors by name, in the order ``--executor`` lists them."""
    from orchestrator.executors import registry

    return registry.EXECUTORS


def default_executor() -> str:
    """The name of the executor that runs when none is named."""
    from orchestrator.executors import registry

    return registry.DEFAULT


def choose_executor(args: argparse.Namespace) -> type[Executor]:
    """The executor ``--executor`` names (or its own flags choose); every executor's
    flags (``args.executor_flags``: its name -> its actions) are checked against it."""
    from orchestrator.executors import registry

    chosen = registry.get(args.executor)
    if args.executor == registry.DEFAULT:
        picked = [cls for cls in registry.EXECUTORS.values() if cls.chosen_by(args)]
        chosen = picked[0] if picked else chosen
    flags: Mapping[str, Sequence[argparse.Action]] = args.executor_flags
    for name, actions in flags.items():
        given = [a.option_strings[0] for a in actions if getattr(args, a.dest) != a.default]
        registry.get(name).check_flags(args, chosen, given)
    return chosen


def executor_from_flags(args: argparse.Namespace) -> Callable[[BenchConfig], Executor]:
    """The executor :func:`choose_executor` chooses, made once from the flags and the
    loaded file's section (what ``tunematrix run`` and ``fit`` pass as ``executor``)."""
    from orchestrator.executors.base import ExecutorSection

    chosen = choose_executor(args)
    made: list[Executor] = []

    def make(config: BenchConfig) -> Executor:
        if not made:
            section = config.section(chosen.name)
            assert section is None or isinstance(section, ExecutorSection)
            made.append(chosen.from_args(args, section))
        return made[0]

    return make


def _field_names(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


@dataclass
class _Planned:
    """A matrix planned for running: the file (None for a built plan), the plan, the
    executor that runs it and the command recorded for it."""

    config: BenchConfig | None
    plan: Plan
    executor: Executor
    argv: list[str]


def _planned(
    scenarios: ConfigSource | Plan | None,
    planning: PlanOptions,
    executor: str | Executor | Callable[[BenchConfig], Executor],
    argv: Sequence[str] | None,
    caller: str,
) -> _Planned:
    """The scenarios loaded and planned for the chosen executor's machines (its GPU
    count), a cell whose package is missing there refused.

    ``executor``: a registered executor's name, an executor, or a function that makes
    one from the loaded file (the command line's: its flags and the file's section).
    """
    from orchestrator.executors import registry
    from orchestrator.executors.base import Executor
    from orchestrator.matrix.plan import Plan
    from orchestrator.running.needs import require

    config = None
    if isinstance(scenarios, Plan):
        the_plan = scenarios
    else:
        config = planning.load(scenarios)
    if isinstance(executor, str):
        chosen = registry.get(executor).default()
    elif isinstance(executor, Executor):
        chosen = executor
    elif config is None:
        raise UserError("an executor made from the scenarios file needs the file, not a plan")
    else:
        chosen = executor(config)
    if config is not None:
        the_plan = plan(config, planning, preview=False, gpus=chosen.gpu_counter())
    # a missing package, named once here rather than by every experiment's failure
    require(the_plan.experiments, chosen.name)
    shown = (
        list(argv) if argv is not None else [sys.executable, "-c", f"orchestrator.{caller}(...)"]
    )
    return _Planned(config, the_plan, chosen, shown)


def run(
    scenarios: ConfigSource | Plan | None = None,
    results: PathLike = "results",
    plan_options: PlanOptions | None = None,
    run_options: RunOptions | None = None,
    report_options: ReportOptions | None = None,
    *,
    executor: str | Executor | Callable[[BenchConfig], Executor] = "local",
    announce: Announce | None = None,
    argv: Sequence[str] | None = None,
    **keywords: Any,
) -> RunResult:
    """Run a plan (or plan ``scenarios`` first) into ``results``: what ``tunematrix run`` does.

    Each experiment is a real ``accelerate launch`` of the training child, one at a
    time (or packed side by side: ``pack=True``, ``slots=N``). Progress goes to stderr.
    The options are :class:`PlanOptions` (which cells), the run's
    ``orchestrator.job.execute.RunOptions`` and the report's
    ``orchestrator.results.report.ReportOptions``: objects, or their fields as keywords.

    ``resume=True`` keeps the experiments already ok (NO_OVERWRITE); otherwise an
    earlier run of a different plan in ``results`` is moved aside, never deleted.
    ``prune=False``: launch every experiment, even one certain to run out of memory
    (``--no-prune``): one predicted before launch to need more than its GPU's memory
    (``gpu_memory_gib``, default this machine's smallest GPU), or larger than one that
    ran out. ``stop_early=False``: launch every experiment like two cells that already
    failed with the same error (``--no-stop-early``). ``check=False``: launch without
    checking every cell against the installed libraries first (``--no-check``);
    ``recheck=True``: check every cell again, even one whose verdict was kept from an
    earlier check. ``launch="family"``: the experiments of one family share a launch
    (default: the file's ``launch:``, else ``cell``). The prices default to the file's
    ``cost:``. ``cool_down_s``: before each launch, wait at most this long for each of
    its GPUs to cool back to near its first temperature (``--cool-down``).

    ``executor``: where the jobs run (a registered executor's name, its flags and file
    section being the command line's: ``tunematrix run --executor NAME``; an executor;
    or a function making one from the loaded file). ``announce`` is told the plan and
    the checks' lines before the first launch; ``argv`` is the command env.json records.
    A scenario with ``search:`` then has its fit, the largest value that fits, written
    into ``results/fit/`` after the matrix (a built :class:`Plan` carries no ``search:``).
    """
    from orchestrator.executors.packed import PackedExecutor
    from orchestrator.job.execute import RunOptions
    from orchestrator.matrix.plan import Plan
    from orchestrator.results.options import ReportOptions

    pack, slots = keywords.pop("pack", False), keywords.pop("slots", 1)
    if slots > 1 and not pack:
        raise UserError("slots only has a meaning with pack=True")
    if isinstance(scenarios, Plan):
        given = sorted(set(keywords) & _field_names(PlanOptions))
        if plan_options is not None or given:
            raise UserError(
                f"{', '.join(given) or 'plan_options'}: options of plan(), not of an "
                "already built plan"
            )
    planning, running, reporting = _options(
        {
            "plan": plan_options or PlanOptions,
            "run": run_options or RunOptions,
            "report": report_options or ReportOptions,
        },
        keywords,
        "run",
    )
    _check_run_options(running)
    planned = _planned(
        scenarios, planning, PackedExecutor(slots=slots) if pack else executor, argv, "run"
    )
    return _run_planned(planned, Path(results), running, reporting, announce or _stderr_lines)


def _check_gpu_memory_gib(gib: float | None) -> None:
    if gib is not None and not 0 < gib < float("inf"):
        raise UserError(f"gpu_memory_gib must be a positive number, got {gib:g}")


def _check_run_options(running: RunOptions) -> None:
    _check_gpu_memory_gib(running.gpu_memory_gib)
    if running.memory_logging not in MEMORY_LOGGING:
        raise UserError(
            f"memory_logging must be one of {', '.join(MEMORY_LOGGING)}, "
            f"got {running.memory_logging!r}"
        )
    if running.launch is not None and running.launch not in LAUNCH_MODES:
        raise UserError(f"launch must be one of {', '.join(LAUNCH_MODES)}, got {running.launch!r}")


def _run_planned(
    planned: _Planned,
    root: Path,
    running: RunOptions,
    reporting: ReportOptions,
    announce: Announce,
) -> RunResult:
    """The matrix run: checked, announced, run, its searches fitted, its rows read back."""
    from orchestrator.results import collect
    from orchestrator.results.report import add_derived
    from orchestrator.running.fitrun import check_searches, search_after_run
    from orchestrator.running.memoryfit import (
        device_capacity,
        flagged_lines,
        predicted,
        with_memory,
    )
    from orchestrator.running.runner import preflight, run_plan
    from orchestrator.running.stackcheck import check_stack

    config, chosen = planned.config, planned.executor
    if config is not None:
        # the file's launch and prices, where none is given
        running = dataclasses.replace(running, launch=running.launch or config.launch)
        reporting = dataclasses.replace(
            reporting,
            usd_per_gpu_hour=reporting.usd_per_gpu_hour or config.usd_per_gpu_hour,
            usd_per_kwh=reporting.usd_per_kwh or config.usd_per_kwh,
            grams_co2_per_kwh=reporting.grams_co2_per_kwh or config.grams_co2_per_kwh,
        )
        # a search: that cannot apply, refused now rather than after the matrix
        check_searches(config, planned.plan)
    running = dataclasses.replace(running, launch=running.launch or "cell")
    # everything the executor would refuse later, refused here, before a folder is touched
    preflight(chosen, planned.plan, ResultsLayout(root), running)
    settle_earlier_jobs(ResultsLayout(root))
    # every cell's settings against the installed stack, each model found, once
    checked = check_stack(
        planned.plan,
        skip=not running.check,
        keep=True,
        recheck=running.recheck,
        memory=predicted,
    )
    capacity, source = device_capacity(running.gpu_memory_gib, here=chosen.gpu_counter() is None)
    the_plan = with_memory(checked.plan, checked.memory, capacity, source)
    announce(the_plan, config, [*checked.lines(), *flagged_lines(the_plan)])
    done = run_plan(
        the_plan, root, running, argv=planned.argv, executor=chosen, reporting=reporting
    )
    if config is not None:
        # scenarios with search: the largest batch or length that fits, into RESULTS/fit/
        search_after_run(
            config,
            the_plan,
            done,
            running,
            executor=chosen,
            argv=planned.argv,
            log=lambda line: print(line, file=sys.stderr),
        )
    return RunResult(
        rows=add_derived(collect.load(done.layout.root), reporting.cost),
        outcomes=done.outcomes,
        results=done.layout.root,
        summary=done.layout.summary_md if done.reported else None,
        interrupted=done.interrupted,
        moved_to=done.moved_to,
        history_run_id=done.history_run_id,
        exit_code=done.exit_code,
    )


def fit(
    scenarios: ConfigSource | None = None,
    results: PathLike = "results/fit",
    plan_options: PlanOptions | None = None,
    run_options: RunOptions | None = None,
    fit_options: FitOptions | None = None,
    *,
    executor: str | Executor | Callable[[BenchConfig], Executor] = "local",
    argv: Sequence[str] | None = None,
    **keywords: Any,
) -> FitReport:
    """The largest per-device batch (or ``max_seq_len``) that fits, per search (one setup,
    the value it raises).

    What ``tunematrix fit`` does (``orchestrator.running.fitrun``): probes of
    ``probe_steps`` steps, fresh launches into ``results``, for the scenarios with
    ``search:`` (``search`` names what to search in every selected scenario
    instead; ``low``, ``limit``, ``margin``, ``memory_gib``: ``FitOptions``). Returns
    each search's answer and probes (``.record``) and where they were written
    (fit.json, fit.md). The matrix itself is never changed. ``recheck=True``: check
    every cell against the installed libraries again, kept verdicts or not.
    """
    from orchestrator.config.search import FitOptions
    from orchestrator.job.execute import RunOptions
    from orchestrator.running.fitrun import run_fit
    from orchestrator.running.stackcheck import check_stack

    planning, running, searching = _options(
        {
            "plan": plan_options or PlanOptions,
            "run": run_options or RunOptions,
            "fit": fit_options or FitOptions,
        },
        keywords,
        "fit",
    )
    low, limit = searching.low, searching.limit
    if low is not None and limit is not None and low > limit:
        raise UserError(f"the search's lower bound {low} is above its limit {limit}")
    planned = _planned(scenarios, planning, executor, argv, "fit")
    assert planned.config is not None
    checked = check_stack(planned.plan, keep=True, recheck=running.recheck)
    for line in checked.lines():
        print(line, file=sys.stderr)
    return run_fit(
        planned.config,
        checked.plan,
        Path(results),
        dataclasses.replace(running, report=False),
        searching,
        executor=planned.executor,
        argv=planned.argv,
        log=lambda text: print(text, file=sys.stderr, flush=True),
    )


def fit_lines(report: FitReport) -> list[str]:
    """What ``tunematrix fit`` prints at its end: each search's answer, the files, and
    each search that stopped."""
    from orchestrator.results.fitreport import answer_rows
    from orchestrator.results.mdtable import md_table

    layout, record = report.layout, report.record
    lines = ["", *md_table(*answer_rows(record)), ""]
    lines += [f"  fit:    {layout.fit_md}, {layout.fit_json}", f"  probes: {layout.raw_summary}"]
    if report.moved_to is not None:
        lines.append(f"  the earlier fit is in {report.moved_to}")
    lines += [
        f"  stopped: {f.family}: {f.stopped_by}" for f in record.families if f.ending == "stopped"
    ]
    if record.interrupted:
        lines.append("tunematrix: interrupted; finished probes are kept (--resume reuses them)")
    return lines


def ids_text(jobs: Sequence[str], most: int = 5) -> str:
    return ", ".join(jobs[:most]) + (f" and {len(jobs) - most} more" if len(jobs) > most else "")


def settle_earlier_jobs(layout: ResultsLayout) -> None:
    """Collect the earlier jobs of this folder that executors submitted and that have
    ended since; refuse while some still run.

    Without this, a resumed run would run again what finished on a cluster
    after ``--no-wait``, and a fresh run would move aside a folder that
    running jobs still write into.
    """
    from orchestrator.executors.registry import settle_all

    for settled in settle_all(layout):
        if settled.collected:
            print(f"collected {settled.collected} finished {settled.noun}(s) of the earlier run")
        if settled.running:
            raise UserError(
                f"{len(settled.running)} {settled.noun}(s) of an earlier run still write into "
                f"{layout.root} ({ids_text(settled.running)}); wait for them "
                f"(`tunematrix report {layout.root}`) or {settled.cancel}"
            )


def report_folder(source: Path, output: PathLike | None) -> Path:
    """Where a report of ``source`` goes: the results folder itself, else beside the table."""
    if output:
        return Path(output)
    if source.is_dir() and ((source / "runs").is_dir() or (source / "plan.csv").is_file()):
        return source
    return (source if source.is_dir() else source.parent) / "tunematrix-report"


@dataclass
class Reported:
    """What :func:`settle_and_report` did: the report, and what it settled first."""

    report: Report
    #: per executor with jobs in the folder: how many had ended (and have their
    #: outcome now), and the ids of those still queued or running (the report
    #: shows them as not run yet)
    settled: list[Settled] = field(default_factory=list)
    #: the run's id in the history, when its last job had ended and it was recorded now
    history_run_id: int | None = None
    #: the history file it was recorded in
    history: Path | None = None

    @property
    def running(self) -> list[str]:
        """The ids of the jobs still queued or running, of every executor."""
        return [job for settled in self.settled for job in settled.running]

    @property
    def statuses(self) -> str:
        """The report's experiments counted by status, as ``tunematrix report`` says them."""
        from orchestrator.results.report import status_counts

        return status_counts(self.report.rows)


def report(
    source: PathLike,
    out: PathLike | None = None,
    options: ReportOptions | None = None,
    **keywords: Any,
) -> Report:
    """Write ``raw_summary.csv``, ``benchmarks.csv``, ``summary.md`` and plots.

    ``source`` is a results folder or a summary CSV (ours or the predecessor's
    result table); ``out`` defaults to the results folder itself, else a
    ``tunematrix-report`` folder beside the table. ``options``
    (``orchestrator.results.report.ReportOptions``), or its fields as keywords: the
    price of a GPU-hour (default: the run's own, its ``env.json``) and a token budget;
    ``gpu_memory_gib``, one device's memory where the source does not say it (a
    predecessor's table), so rows without figures near it read as likely out of
    memory; ``plots``; ``loss_tolerance``, the loss gap past which a variant differs
    from its baseline (summary.md's 'Loss against the baseline'); ``usd_per_kwh``,
    ``grams_co2_per_kwh``: the energy's cost and emissions per 1M tokens (default: the
    run's own); ``rank_by``: what the recommendation ranks cells by, ``speed``
    (tokens/s) or ``energy`` (joules per token). A results folder of jobs submitted
    without waiting is settled first, as :func:`settle_and_report` says. Returns the
    rows and cells.
    """
    return settle_and_report(source, out, options, **keywords).report


def settle_and_report(
    source: PathLike,
    out: PathLike | None = None,
    options: ReportOptions | None = None,
    *,
    flags: bool = False,
    **keywords: Any,
) -> Reported:
    """:func:`report`, and what ``tunematrix report`` does around it.

    In a results folder whose jobs were submitted without waiting (``tunematrix
    run --executor slurm --no-wait``), the jobs that have ended get their
    outcome before the report is written; once
    none is left running, the run enters the folder's history, once (as a run
    that waited for its jobs does at its end; later runs check time limits
    against it). ``flags``: name the options in errors as the command line
    spells them.
    """
    from orchestrator.results.envfile import cost_from_env
    from orchestrator.results.options import ReportOptions
    from orchestrator.results.recommend import RANK_BY

    (options,) = _options({"report": options or ReportOptions}, keywords, "report")
    for name in (
        "usd_per_gpu_hour",
        "tokens",
        "gpu_memory_gib",
        "usd_per_kwh",
        "grams_co2_per_kwh",
    ):
        value = getattr(options, name)
        if value is not None and not value > 0:
            shown = "--" + name.replace("_", "-") if flags else name
            raise UserError(f"{shown} must be a positive number, got {value:g}")
    if options.rank_by not in RANK_BY:
        shown = "--rank-by" if flags else "rank_by"
        raise UserError(f"{shown} must be one of {', '.join(RANK_BY)}, got {options.rank_by!r}")
    _check_loss_tolerance(options.loss_tolerance, flags)
    path = Path(source)
    settled = _settle_jobs(path)
    if path.is_dir():  # the run's own prices, where none is given
        options = dataclasses.replace(
            options,
            usd_per_gpu_hour=options.usd_per_gpu_hour or cost_from_env(path),
            usd_per_kwh=options.usd_per_kwh or cost_from_env(path, "usd_per_kwh"),
            grams_co2_per_kwh=options.grams_co2_per_kwh or cost_from_env(path, "grams_co2_per_kwh"),
        )
    done = Reported(options.write(path, report_folder(path, out)), settled=settled)
    if path.is_dir() and not done.running:
        done.history, done.history_run_id = _record_awaited_run(path, done.report.rows)
    return done


def _settle_jobs(source: Path) -> list[Settled]:
    """Every executor's jobs of a results folder: outcomes for those that have ended."""
    if not (source.is_dir() and (source / "runs").is_dir()):
        return []
    from orchestrator.executors.registry import settle_all

    return settle_all(ResultsLayout(source))


def _record_awaited_run(source: Path, rows: pd.DataFrame) -> tuple[Path | None, int | None]:
    """Enter a run submitted without waiting into the history, once its jobs have ended.

    ``env.json`` says whether it is still awaited; it says no once recorded.
    """
    from orchestrator.results import history
    from orchestrator.results.envfile import read_env
    from orchestrator.running import envinfo

    env = read_env(source)
    if env is None or env.get("awaiting_jobs") is not True:
        return None, None
    env["finished_at"] = now()
    env["awaiting_jobs"] = False
    db = history.path_for(source)
    run_id = history.record(db, rows, env, source)
    envinfo.write(ResultsLayout(source).env, env)
    return db, run_id


def load_rows(value: PathLike | pd.DataFrame, history_db: Path | None = None) -> pd.DataFrame:
    """The rows of one side of a comparison, with the derived columns.

    A DataFrame, a results folder, a summary CSV, or ``run:N`` (run N of ``history_db``).
    """
    import pandas as pd

    from orchestrator.results import collect
    from orchestrator.results.report import CostSettings, add_derived

    if isinstance(value, pd.DataFrame):
        return add_derived(collect.normalise(value), CostSettings())
    text = os.fspath(value)
    if text.startswith("run:"):
        from orchestrator.results import history

        if history_db is None:
            raise UserError(f"{text}: no history to look it up in; give the history file")
        try:
            run_id = int(text.removeprefix("run:"))
        except ValueError:
            raise UserError(f"{text}: a run id is a number (see tunematrix history)") from None
        try:
            frame = collect.normalise(history.load_run(history_db, run_id))
        except LookupError as exc:
            raise UserError(str(exc)) from None
        return add_derived(frame, CostSettings())
    return add_derived(collect.load(Path(text)), CostSettings())


@dataclass(frozen=True)
class CompareOptions:
    """What :func:`compare` compares, and how: ``metrics`` (default: every metric both
    sides have), ``threshold`` (a fraction), ``plots``, the ``history`` that ``run:N``
    is looked up in, ``across`` and ``baseline`` (within one side), ``loss_tolerance``."""

    metrics: Sequence[str] | None = None
    threshold: float = 0.1
    plots: bool = True
    history: PathLike | None = None
    across: str | None = None
    baseline: str | None = None
    loss_tolerance: float | None = None


def compare(
    new: PathLike | pd.DataFrame,
    ref: PathLike | pd.DataFrame | None = None,
    options: CompareOptions | None = None,
    *,
    out: PathLike | None = None,
    flags: bool = False,
    **keywords: Any,
) -> Comparison:
    """Compare ``new`` against the reference ``ref``, cell by cell.

    Where both sides are results folders, the loss curves of the matched cells
    are compared too (``.loss``, ``.loss_changes``): a gap past ``loss_tolerance``
    (default ``results.equivalence.DEFAULT_TOLERANCE``) is a loss change.

    Each side is a results folder, a summary CSV (the predecessor's reference
    tables too), a DataFrame of rows, or ``run:N`` from ``history`` (default: the
    history of ``new``'s results folder, when it is one). A metric
    regresses when it is worse by more than ``threshold`` (a fraction) and by
    more than the noise of the repeats. With ``out``, ``compare.csv``,
    ``compare.md`` and plots are written there (``.written`` lists them).
    ``flags``: name the options in errors as the command line spells them.
    ``options`` (:class:`CompareOptions`) or its fields as keywords.

    ``across`` (``environment``, or another key column) compares within ``new``
    alone: its rows of ``baseline`` (default: the first value) are the reference,
    the rows of each other value the new runs, matched on every other key.
    """
    (options,) = _options({"compare": options or CompareOptions}, keywords, "compare")
    metrics, threshold, history = options.metrics, options.threshold, options.history
    across, baseline, loss_tolerance = options.across, options.baseline, options.loss_tolerance
    from orchestrator.results import compare as comparing

    dash = "--" if flags else ""
    if ref is not None and across is not None:
        raise UserError(f"give a reference to compare against or {dash}across, not both")
    if ref is None and across is None:
        raise UserError(
            f"give a reference to compare against (or {dash}across COLUMN to compare within one)"
        )
    if baseline is not None and across is None:
        raise UserError(f"{dash}baseline needs {dash}across")
    if not 0 < threshold < 10:
        raise UserError(f"{dash}threshold must be a fraction such as 0.1, got {threshold:g}")
    _check_loss_tolerance(loss_tolerance, flags)
    for metric in metrics or ():
        try:
            comparing.direction(metric)
        except ValueError:
            known = comparing.known_metrics()
            raise UserError(
                f"{dash}metric {metric!r} is not a metric compare knows; known: {', '.join(known)}"
            ) from None
    db = Path(history) if history else _history_of(new)
    wanted = list(metrics or []) or None
    try:
        if across is not None:
            from orchestrator.results.across import compare_across

            result, base, others = compare_across(
                load_rows(new, db),
                across=across,
                baseline=baseline,
                metrics=wanted,
                threshold=threshold,
            )
            where = _label(new, db)
            new_label, ref_label = (
                f"{where}, {across} {', '.join(others)}",
                f"{where}, {across} {base}",
            )
        else:
            assert ref is not None
            new_rows, ref_rows = load_rows(new, db), load_rows(ref, db)
            result = comparing.compare(new_rows, ref_rows, metrics=wanted, threshold=threshold)
            new_label, ref_label = _label(new, db), _label(ref, db)
            _compare_losses(result, new, ref, new_rows, ref_rows, loss_tolerance)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    if out is not None:
        result.written = comparing.write(
            result, Path(out), new_label, ref_label, threshold, with_plots=options.plots
        )
    return result


def _check_loss_tolerance(value: float | None, flags: bool) -> None:
    if value is not None and not 0 < value < 10:
        shown = "--loss-tolerance" if flags else "loss_tolerance"
        raise UserError(f"{shown} must be a fraction such as 0.05, got {value:g}")


def _compare_losses(
    result: Comparison,
    new: PathLike | pd.DataFrame,
    ref: PathLike | pd.DataFrame,
    new_rows: pd.DataFrame,
    ref_rows: pd.DataFrame,
    tolerance: float | None,
) -> None:
    """The loss curves of the matched cells, where both sides are results folders
    (their ``runs/*/result.json``); a table or ``run:N`` has none to read."""
    from orchestrator.results import compare as comparing
    from orchestrator.results import equivalence

    if tolerance is None:
        tolerance = equivalence.DEFAULT_TOLERANCE
    folders = [Path(side) if isinstance(side, str | os.PathLike) else None for side in (new, ref)]
    if not all(f is not None and (f / "runs").is_dir() for f in folders):
        return
    assert folders[0] is not None and folders[1] is not None
    matched = comparing.matched_experiments(new_rows, ref_rows, result.keys)
    result.loss = equivalence.compare_losses(matched, folders[0], folders[1], tolerance)
    result.loss_tolerance = tolerance


def comparison_lines(result: Comparison, across: str | None = None) -> list[str]:
    """What ``tunematrix compare`` prints of ``result``: the counts, the notes (with
    ``across``, the column compared within one side: each candidate against the
    baseline), each regression and loss change, the files written."""
    from orchestrator.contract.wording import signed_change
    from orchestrator.results import compare as comparing

    regressions = result.regressions
    matched = result.table[result.keys].drop_duplicates().shape[0] if len(result.table) else 0
    lines = [
        f"tunematrix compare: {matched} matched cells, {len(regressions)} regression(s); "
        f"{len(result.only_new)} only in new, {len(result.only_ref)} only in the reference",
        *(f"  note: {note}" for note in result.notes),
    ]
    if across:
        from orchestrator.results.across import across_lines

        lines += across_lines(result, across) or [""]
    for _, row in regressions.iterrows():
        cell = comparing.cell_label(row, result.keys)
        change = row["change"]
        shown = "" if change is None or change != change else f" {signed_change(change)}"
        lines.append(f"  regression: {cell}: {row['metric']}{shown} {row['why']}".rstrip())
    if result.loss is not None:
        lines.append(
            f"  loss curves: {len(result.loss)} matched cell(s) compared, "
            f"{len(result.loss_changes)} loss change(s)"
        )
    for _, row in result.loss_changes.iterrows():
        cell = comparing.cell_label(row, result.keys)
        lines.append(
            f"  loss change: {cell}: loss {row['loss_gap_pct']:.1f}% from the reference's "
            f"over {row['steps_compared']} steps"
        )
    return lines + [f"  {path}" for path in result.written]


def compare_folder(new: PathLike, output: PathLike | None) -> Path:
    """Where ``tunematrix compare`` writes: ``output``, else NEW's results folder, else here."""
    if output:
        return Path(output)
    return Path(new) if Path(new).is_dir() else Path(".")


def _history_of(side: PathLike | pd.DataFrame) -> Path | None:
    """The history of a results folder (where ``run:N`` is looked up); None for anything else."""
    if not isinstance(side, str | os.PathLike) or not Path(side).is_dir():
        return None
    from orchestrator.results import history

    return history.path_for(Path(side))


def _label(side: PathLike | pd.DataFrame, db: Path | None) -> str:
    if not isinstance(side, str | os.PathLike):
        return "a DataFrame"
    text = os.fspath(side)
    if text.startswith("run:") and db is not None:
        return f"{db}#{text.removeprefix('run:')}"
    return text


def history_lines(results: PathLike = "results") -> list[str]:
    """What ``tunematrix history`` prints: a line per run recorded in ``results``."""
    from orchestrator.results import history

    db = history.path_for(Path(results))
    runs = history.runs(db)
    if not runs:
        return [f"no runs recorded in {db}"]
    lines = [
        f"{'run':>4}  {'started':<26} {'experiments':>11}  {'statuses':<30} {'git':<11} host / GPUs"
    ]
    for r in runs:
        counts = ", ".join(f"{k} {v}" for k, v in json.loads(r["counts"] or "{}").items())
        gpus = ", ".join(sorted(set(json.loads(r["gpus"] or "[]")))) or "CPU"
        git = (r["git_sha"] or "-")[:10]
        flag = " (interrupted)" if r["interrupted"] else ""
        lines.append(
            f"{r['run_id']:>4}  {r['started_at'] or '-':<26} {r['experiments']:>11}  "
            f"{counts + flag:<30} {git:<11} {r['host']} / {gpus}"
        )
    return lines


def diagnose(results: PathLike = "results", *, as_json: bool = False) -> tuple[str, int]:
    """What ``tunematrix doctor`` prints of this machine (text, or JSON), and its exit
    code: 0 when the tiny CPU matrix can run here, 1 when something it needs is missing;
    ``results``: the folder whose free space is checked."""
    from orchestrator import doctor
    from orchestrator.config.files import default_accelerate

    diagnosis = doctor.diagnose(doctor.gather(Path(results), *default_accelerate()))
    text = doctor.format_json(diagnosis) if as_json else doctor.format_text(diagnosis)
    return text, diagnosis.exit_code
