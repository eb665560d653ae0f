"""``tunematrix fit``: the largest per-device batch (or sequence length) that fits, by probes.

For each search of the selected scenarios (a planned cell without its
batch, or its sequence length), the search (``orchestrator.matrix.fitsearch``)
asks for values to probe; each probe is an ordinary short experiment with its
own id and run folder, run by the chosen executor through ``run_plan`` into
the fit's results folder, so it works wherever the matrix does (one at a
time, packed, on SLURM, under FSDP or DeepSpeed). A probe that ran out of
memory, or whose peak memory came above ``1 - margin`` of the device's, does
not fit; one that failed for another reason stops its search with
that reason. Resumed, a fit reuses every probe already ``ok`` or ``oom``.

The matrix is never changed: the answer goes to ``fit.json`` and ``fit.md``
(and the probes' rows to ``raw_summary.csv``) beside the probes' ``runs/``.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.config.scenarios import BenchConfig, Scenario
from orchestrator.config.search import DEFAULT_MIN, FitOptions, Search
from orchestrator.contract.choices import DEFAULT_MARGIN
from orchestrator.contract.columns import (
    NVML_PEAK,
    PROCESS_RSS_PEAK,
    TOKENS_PER_SECOND,
    TORCH_RESERVED_PEAK,
    TREE_PSS_PEAK,
    TREE_RSS_PEAK,
)
from orchestrator.contract.errors import ConfigError, UserError
from orchestrator.contract.gpumemory import MemoryPrediction, gb
from orchestrator.contract.layout import ResultsLayout
from orchestrator.contract.outcome import Outcome, is_pruned, read_outcome
from orchestrator.contract.result import read_result
from orchestrator.executors.base import Executor
from orchestrator.job.execute import RunOptions
from orchestrator.matrix.experiment import Experiment
from orchestrator.matrix.fitsearch import (
    Verdict,
    decide,
    probe_experiment,
    search_key,
    search_label,
    search_problem,
)
from orchestrator.matrix.plan import Plan
from orchestrator.results.fitreport import FitRecord, ProbeRecord, SearchFit, write_fit
from orchestrator.results.numbers import number
from orchestrator.results.rows import build_row, write_raw_summary
from orchestrator.running.runner import RunReport, preflight, run_plan

#: a probe's peak memory, in order of preference: on a GPU, one device's; on the CPU, the
#: job's whole process tree (what a memory cgroup counts), else one process
PEAK_COLUMNS = {
    "gpu": (
        (NVML_PEAK, "NVML peak over the job's GPUs"),
        (TORCH_RESERVED_PEAK, "torch reserved, largest rank"),
    ),
    "cpu": (
        (TREE_PSS_PEAK, "PSS of the job's processes"),
        (TREE_RSS_PEAK, "RSS of the job's processes"),
        (PROCESS_RSS_PEAK, "RSS of a training process"),
    ),
}
#: how far the memory prediction looks for a search's first probe: the lower bound times
#: up to 2**this
PREDICTED_DOUBLINGS = 10
#: a cgroup v1 limit at or above this is "no limit"
_NO_LIMIT = 2**62


@dataclass(frozen=True)
class Capacity:
    bytes: float | None
    source: str


@dataclass
class FitReport:
    record: FitRecord
    layout: ResultsLayout
    moved_to: Path | None

    @property
    def exit_code(self) -> int:
        """0 when every search ended on memory (an answer); 1 when one stopped; 130."""
        if self.record.interrupted:
            return 130
        return 0 if all(f.ending not in (None, "stopped") for f in self.record.families) else 1


# ---------------------------------------------------------------------------
# Searches
# ---------------------------------------------------------------------------


@dataclass
class _Search:
    settings: Search
    margin: float
    first: Experiment
    cells: list[str]


def searches(config: BenchConfig, plan: Plan, options: FitOptions) -> list[_Search]:
    """The searches to run, in plan order; one that cannot apply to its cells
    is refused naming the scenario's line."""
    by_name = {s.name: s for s in config.scenarios}
    found: dict[str, _Search] = {}
    for e in plan.experiments:
        scenario = by_name.get(e.scenario)
        settings = _settings(scenario, options)
        if scenario is None or settings is None:
            continue
        problem = search_problem(e, settings.key)
        if problem:
            where = config.where(scenario)
            raise ConfigError(
                f"cannot search {settings.key} in scenario '{scenario.name}': {problem}", **where
            )
        key = search_key(e, settings.key)
        if key not in found:
            margin = settings.margin if settings.margin is not None else DEFAULT_MARGIN
            found[key] = _Search(settings, margin, e, [])
        if e.cell_id not in found[key].cells:
            found[key].cells.append(e.cell_id)
    return list(found.values())


def _settings(scenario: Scenario | None, options: FitOptions) -> Search | None:
    own = scenario.search if scenario is not None else None
    key = options.search or (own.key if own is not None else None)
    if key is None:
        return None
    same = own is not None and own.key == key
    low = options.low if options.low is not None else (own.low if same and own else None)
    limit = options.limit if options.limit is not None else (own.limit if same and own else None)
    margin = options.margin if options.margin is not None else (own.margin if own else None)
    low = low if low is not None else DEFAULT_MIN[key]
    if limit is not None and low > limit:
        raise UserError(f"the search's lower bound {low} is above its limit {limit}")
    return Search(key=key, low=low, limit=limit, margin=margin)


# ---------------------------------------------------------------------------
# Capacity and verdicts
# ---------------------------------------------------------------------------


def cgroup_memory_limit(
    proc_cgroup: str | None = None, root: Path | None = None
) -> tuple[int, str] | None:
    """The tightest memory limit of this process's cgroups (a job started here inherits
    them): v1 ``memory.limit_in_bytes``, v2 ``memory.max``; None where none is set."""
    from orchestrator.job.oomkill import CGROUP_ROOT, memory_cgroups

    try:
        text = proc_cgroup if proc_cgroup is not None else Path("/proc/self/cgroup").read_text()
    except OSError:
        return None
    best: tuple[int, str] | None = None
    for folder in memory_cgroups(text, root or CGROUP_ROOT):
        for name in ("memory.limit_in_bytes", "memory.max"):
            try:
                raw = (folder / name).read_text().strip()
            except OSError:
                continue
            if raw.isdigit() and int(raw) < _NO_LIMIT and (best is None or int(raw) < best[0]):
                best = (int(raw), f"the memory cgroup limit of {folder}")
    return best


def machine_memory() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return None


def local_capacity(device: str) -> Capacity:
    """One device's memory where the jobs run on this machine: a GPU's (NVML), or on the
    CPU the job's limit (its memory cgroup, else the machine's memory)."""
    if device == "gpu":
        from orchestrator.running.envinfo import nvml_gpus

        sizes = [d["memory_bytes"] for d in nvml_gpus().get("devices", [])]
        if not sizes:
            return Capacity(None, "no GPU memory figure from NVML here")
        name = "the smallest GPU's memory" if len(set(sizes)) > 1 else "the GPU's memory"
        return Capacity(float(min(sizes)), f"{name}, from NVML")
    ram = machine_memory()
    limit = cgroup_memory_limit()
    if limit is not None and (ram is None or limit[0] < ram):
        return Capacity(float(limit[0]), limit[1])
    if ram is None:
        return Capacity(None, "the machine's memory could not be read")
    return Capacity(float(ram), "the machine's memory")


def peak_memory(row: Mapping[str, Any], device: str) -> tuple[float | None, str | None]:
    """A probe's peak memory from its row, and which figure it is."""
    for column, label in PEAK_COLUMNS.get(device, ()):
        value = number(row.get(column))
        if value is not None and value > 0:
            return value, label
    return None, None


def judge(
    row: Mapping[str, Any], device: str, capacity: float | None, margin: float
) -> tuple[Verdict, str | None]:
    """Whether a probe fits, from its row: out of memory or above the margin does not;
    a failure of another kind (or a probe that never ran) is no verdict on memory."""
    status, error = row.get("status"), row.get("error")
    if status == "oom" or is_pruned(status, error):
        return "too_big", str(error or "out of memory")
    if status not in ("ok", "skipped"):
        return "stop", f"{status}: {error or 'no error recorded'}"
    peak, _ = peak_memory(row, device)
    if capacity is not None and peak is not None and peak > (1 - margin) * capacity:
        return "too_big", (
            f"peak {peak / 2**30:.2f} GiB is above {1 - margin:.0%} of {capacity / 2**30:.2f} "
            f"GiB (margin {margin:g})"
        )
    return "fits", None


# ---------------------------------------------------------------------------
# The fit
# ---------------------------------------------------------------------------


def _reusable(layout: ResultsLayout, eid: str) -> Outcome | None:
    """An earlier probe's outcome that is a verdict on memory: ok (with its result) or oom."""
    run = layout.run(eid)
    outcome = read_outcome(run)
    if outcome is None or outcome.status not in ("ok", "oom"):
        return None
    result = read_result(run.result)
    if outcome.status == "ok" and not (result and result.get("status") == "ok"):
        return None
    return outcome


def run_fit(
    config: BenchConfig,
    plan: Plan,
    results: Path,
    run_options: RunOptions,
    options: FitOptions,
    *,
    executor: Executor,
    argv: list[str],
    log: Callable[[str], None] = print,
) -> FitReport:
    """Run every search of ``plan`` into ``results``; write fit.json, fit.md and the probes'
    raw_summary.csv; return what was found.

    ``run_options.resume``: keep the folder and reuse its probes that ended ok or
    oom; without it an earlier fit there is moved aside first.
    """
    found = _searches_to_run(config, plan, options)
    _check_with_executor(executor, plan, found, results, run_options)
    layout, moved_to = _open_folder(results, run_options, log)
    fit_run = _FitRun(plan, results, layout, run_options, options, executor, argv, log)
    for search in found:
        fit_run.search(search)
        if fit_run.record.interrupted:
            break
    fit_run.save()
    return FitReport(record=fit_run.record, layout=layout, moved_to=moved_to)


def _searches_to_run(config: BenchConfig, plan: Plan, options: FitOptions) -> list[_Search]:
    """The searches of ``plan``; none is one line that says how to ask for one."""
    found = searches(config, plan, options)
    if not found:
        raise UserError(
            "no selected scenario has search: and no --max was given; "
            "add search: {max: per_device_train_batch_size} to a scenario or pass --max"
        )
    return found


def _check_with_executor(
    executor: Executor,
    plan: Plan,
    found: list[_Search],
    results: Path,
    run_options: RunOptions,
) -> None:
    """The executor's checks (a SLURM cluster's partition, say), on each search's planned cell."""
    firsts = tuple(search.first for search in found)
    preflight(
        executor, dataclasses.replace(plan, experiments=firsts), ResultsLayout(results), run_options
    )


def _open_folder(
    results: Path, run_options: RunOptions, log: Callable[[str], None]
) -> tuple[ResultsLayout, Path | None]:
    """The fit's results folder, an earlier run there moved aside unless resumed."""
    from orchestrator.running.resultsdir import open_results

    with open_results(results, resume=run_options.resume) as opened:
        layout = opened.layout
    if opened.moved_to is not None:
        log(f"the earlier run in {results} was moved to {opened.moved_to}")
    return layout, opened.moved_to


class _FitRun:
    """One fit under way: its searches, the probes they ran, the files they leave."""

    def __init__(
        self,
        plan: Plan,
        results: Path,
        layout: ResultsLayout,
        run_options: RunOptions,
        options: FitOptions,
        executor: Executor,
        argv: list[str],
        log: Callable[[str], None],
    ) -> None:
        self.plan, self.results, self.layout = plan, results, layout
        self.run_options, self.options = run_options, options
        self.executor, self.argv, self.log = executor, argv, log
        # each probe runs alone, kept on resume, its report left to the fit
        self.probe_options = dataclasses.replace(
            run_options, resume=True, report=False, fail_fast=False
        )
        self.remote = executor.gpu_counter() is not None
        self.capacities: dict[str, Capacity] = {}
        self.record = FitRecord(probe_steps=options.probe_steps, families=[])
        self.rows: dict[str, dict[str, Any]] = {}
        self.probes: dict[str, Experiment] = {}

    def save(self) -> None:
        """raw_summary.csv, plan.csv and fit.json/fit.md as they stand."""
        from orchestrator.matrix.table import write_plan_csv

        write_raw_summary(list(self.rows.values()), self.layout.raw_summary)
        write_plan_csv(
            dataclasses.replace(self.plan, experiments=tuple(self.probes.values())),
            self.layout.plan_csv,
        )
        write_fit(self.layout, self.record)

    def search(self, search: _Search) -> None:
        """One search: probe after probe until it decides, then its answer."""
        fit = self._start(search)
        start = self._predicted_start(search, fit)
        verdicts: dict[int, Verdict] = {}
        while True:
            decision = decide(verdicts, search.settings.start, search.settings.limit, start)
            fit.largest_fit, fit.first_too_big = decision.largest_fit, decision.first_too_big
            if decision.next is None:
                fit.ending = decision.ending
                break
            verdicts[decision.next] = self._probe(search, fit, decision.next)
            self.save()
            if self.record.interrupted:
                break
        _settle_answer(fit)
        self.save()

    def _capacity(self, device: str) -> Capacity:
        """One device's memory, looked up once per kind of device."""
        if device not in self.capacities:
            self.capacities[device] = (
                Capacity(self.options.memory_gib * 2**30, "given with --memory-gib")
                if self.options.memory_gib is not None
                else Capacity(None, f"the {self.executor.name} executor's jobs run elsewhere")
                if self.remote
                else local_capacity(device)
            )
        return self.capacities[device]

    def _start(self, search: _Search) -> SearchFit:
        """The search's entry in fit.json, before its first probe."""
        first, key = search.first, search.settings.key
        capacity = self._capacity(first.device)
        fit = SearchFit(
            family=search_label(first, key),
            family_id=search_key(first, key)[:12],
            searched=key,
            scenario=first.scenario,
            model=first.model_name_or_path,
            framework=first.framework,
            device=first.device,
            num_gpus=first.num_gpus,
            cells=search.cells,
            low=search.settings.start,
            limit=search.settings.limit,
            margin=search.margin,
            capacity_bytes=capacity.bytes,
            capacity_source=capacity.source,
        )
        if capacity.bytes is None:
            fit.notes.append(
                f"no margin applied: the device's memory is unknown ({capacity.source})"
            )
        self.record.families.append(fit)
        self.log(f"fit: {fit.family}: searching {key} from {search.settings.start}")
        return fit

    def _predicted_start(self, search: _Search, fit: SearchFit) -> int | None:
        """The value a GPU cell's search probes first: the largest of the lower bound's
        doublings (to the limit, at most ``PREDICTED_DOUBLINGS``) predicted, with each one
        below it, to stay within the margin (``orchestrator.running.memoryfit``); None:
        the lower bound (a CPU cell, an unknown capacity, no prediction)."""
        first, key, settings = search.first, search.settings.key, search.settings
        if first.device != "gpu" or not fit.capacity_bytes:
            return None
        from orchestrator.running.stackcheck import check_stack

        values = [settings.start * 2**i for i in range(PREDICTED_DOUBLINGS + 1)]
        values = [v for v in values if settings.limit is None or v <= settings.limit]
        probes = [probe_experiment(first, key, v, self.options.probe_steps) for v in values]
        try:
            checked = check_stack(
                dataclasses.replace(self.plan, experiments=tuple(probes)),
                keep=True,
                memory=lambda e: True,
            )
        except UserError as exc:
            fit.notes.append(f"no memory prediction to start from: {exc}")
            return None
        within = (1 - search.margin) * fit.capacity_bytes
        start: tuple[int, MemoryPrediction] | None = None
        for value, probe in zip(values, probes, strict=True):
            predicted = checked.memory.get(probe.cell_id)
            if predicted is None or predicted.nvml_bytes is None:
                if predicted is not None and predicted.error:
                    fit.notes.append(f"no memory prediction to start from: {predicted.error}")
                break
            if predicted.nvml_bytes > within:
                break
            start = (value, predicted)
        if start is None or start[0] == settings.start:
            return None
        value, predicted = start
        fit.notes.append(
            f"started from {key} {value}: predicted {gb(predicted.nvml_bytes or 0)} on NVML "
            f"({gb(predicted.peak_bytes or 0)} torch), within {1 - search.margin:.0%} of "
            f"{fit.capacity_bytes / 2**30:.0f} GiB"
        )
        self.log(f"fit: {fit.family}: the prediction puts {key} {value} within the margin")
        return value

    def _probe(self, search: _Search, fit: SearchFit, value: int) -> Verdict:
        """Run (or reuse) the probe of ``value``, record it in ``fit``; its verdict."""
        first, key = search.first, search.settings.key
        probe = probe_experiment(first, key, value, self.options.probe_steps)
        eid = probe.experiment_id
        self.probes[eid] = probe
        outcome, reused = self._outcome_of(probe)
        row = build_row(probe.spec(), outcome.as_dict(), read_result(self.layout.run(eid).result))
        self.rows[eid] = row
        verdict, reason = _verdict(row, outcome, first.device, fit.capacity_bytes, search.margin)
        peak, source = peak_memory(row, first.device)
        fit.probes.append(
            ProbeRecord(
                value=value,
                experiment_id=eid,
                status=outcome.status,
                verdict=verdict,
                reason=reason,
                peak_memory_bytes=peak,
                peak_memory_source=source,
                tokens_per_second=number(row.get(TOKENS_PER_SECOND)),
                wall_s=outcome.wall_s,
                reused=reused,
            )
        )
        if verdict == "stop":
            fit.stopped_by = f"{key} {value}: {reason}"
        self.log(
            f"fit: {key}={value}: {outcome.status}"
            + (f" ({reason})" if reason else "")
            + (" [reused]" if reused else "")
        )
        return verdict

    def _outcome_of(self, probe: Experiment) -> tuple[Outcome, bool]:
        """The probe's outcome, and whether it is an earlier one reused (on resume)."""
        eid = probe.experiment_id
        outcome = _reusable(self.layout, eid) if self.run_options.resume else None
        if outcome is not None:
            return outcome, True
        done = run_plan(
            dataclasses.replace(self.plan, experiments=(probe,)),
            self.results,
            self.probe_options,
            argv=self.argv,
            executor=self.executor,
        )
        if done.interrupted:
            self.record.interrupted = True
        return done.outcomes.get(eid) or Outcome(status="interrupted", error="not run"), False


def _verdict(
    row: Mapping[str, Any],
    outcome: Outcome,
    device: str,
    capacity: float | None,
    margin: float,
) -> tuple[Verdict, str | None]:
    """Whether a probe fits (``judge``); one the executor left queued is no verdict."""
    if outcome.status == "planned":
        return (
            "stop",
            (
                "the executor returned before the probe ended; a fit waits for each "
                "probe (SLURM: leave out --no-wait)"
            ),
        )
    return judge(row, device, capacity, margin)


def _settle_answer(fit: SearchFit) -> None:
    """The figures of the largest probe that fitted, and why the next value did not."""
    by_value = {p.value: p for p in fit.probes}
    best = by_value.get(fit.largest_fit) if fit.largest_fit is not None else None
    if best is not None:
        fit.tokens_per_second = best.tokens_per_second
        fit.peak_memory_bytes = best.peak_memory_bytes
    miss = by_value.get(fit.first_too_big) if fit.first_too_big is not None else None
    if miss is not None:
        fit.why_too_big = f"{miss.status}: {miss.reason}" if miss.reason else miss.status


def check_searches(config: BenchConfig, plan: Plan) -> None:
    """Refuse, before the matrix runs, a ``search:`` that cannot apply to its cells."""
    searches(config, plan, FitOptions())


def search_after_run(
    config: BenchConfig,
    plan: Plan,
    done: RunReport,
    options: RunOptions,
    *,
    executor: Executor,
    argv: list[str],
    log: Callable[[str], None] = print,
) -> FitReport | None:
    """After a matrix whose scenarios have ``search:``, their fit into ``<results>/fit/``,
    then summary.md again with its "Largest that fits" section; None when no scenario
    of the plan has one (or the run was interrupted).

    The matrix ran as configured; the probes are other experiments, in their own
    folder, so no table of the matrix counts them.
    """
    searched = {s.name for s in config.scenarios if s.search is not None}
    if done.interrupted or not any(e.scenario in searched for e in plan.experiments):
        return None
    log(f"searching the largest value that fits into {done.layout.fit}")
    fitted = run_fit(
        config,
        plan,
        done.layout.fit,
        dataclasses.replace(options, report=False),
        FitOptions(),
        executor=executor,
        argv=argv,
        log=log,
    )
    for fit in fitted.record.families:
        answer = fit.largest_fit if fit.largest_fit is not None else "none"
        log(f"fit: {fit.family}: largest {fit.searched} that fits: {answer}")
    log(f"fit: {fitted.layout.fit_md}")
    if done.reported:
        root = done.layout.root
        try:
            done.reporting.write(root, root)
        except Exception as exc:  # the fit's own files are written; the report can be redone
            log(f"summary.md was not rewritten ({type(exc).__name__}: {exc})")
    return fitted
