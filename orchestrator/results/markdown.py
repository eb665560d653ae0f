"""``summary.md``: the tables to decide from, scaling, cost and time to train.

Two figures are kept apart on purpose. Our tokens/s are measured (real tokens
over the measured steps); HF Trainer's ``train_tokens_per_second`` is an
estimate (per device, padding included, from the first batch's length × the
steps), and where it is all a table has (the predecessor's), it is shown in a
column and a plot of its own, never as a measured figure.

Headers come from the columns' labels (``Column.label`` in
``orchestrator.contract.columns``), and how a figure is shown from its unit.

The document is ``SECTIONS``: each a function of the ``Context`` the report gives
every section, most of them in a module of their own. Where the prose lives: a
column's meaning is its ``Column.meaning`` in the registry, once, beside the
figure it explains (the reading guide and the table headers read it there); the
prose of a section stays in the section's own code, beside the conditions that
decide which of its sentences a run gets (CPU or GPU words, which columns have
figures, which tasks ran) and the values it states. A template file would repeat
those conditions in a second language, and a reworded sentence would no longer be
reviewed beside the test that reads it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from orchestrator.contract import columns as registry
from orchestrator.contract.columns import (
    COST_PER_1M_TOKENS,
    COST_PER_EPOCH,
    COST_PER_RUN,
    COST_TO_TRAIN,
    CPU_UTIL,
    GPU_UTIL,
    HF_TOKENS_PER_SECOND,
    LAUNCH_OVERHEAD,
    PEAK_MEMORY,
    PEAK_MEMORY_SOURCE,
    SAMPLES_PER_SECOND,
    TIME_PER_EPOCH,
    TIME_TO_TRAIN,
    TOKENS_PER_SECOND,
)
from orchestrator.contract.outcome import NOT_LAUNCHED, skip_from_error
from orchestrator.contract.trainers import DEFAULT_TASK, TaskLine, count_column, task_line
from orchestrator.contract.wording import worker, workers
from orchestrator.results import energyreport, equivalence, fitreport, quality, recommend
from orchestrator.results.aggregate import (
    PEAK_MEMORY_SOURCES,
    CostSettings,
    ReportTables,
    has_figures,
    scaling_keys,
    shows_hf_estimate,
)
from orchestrator.results.capacity import GIB, LIKELY_OOM_FRACTION, Capacity, gib
from orchestrator.results.communication import communication_markdown
from orchestrator.results.drift import drift_markdown
from orchestrator.results.envtables import side_by_side_markdown
from orchestrator.results.mdtable import md_table
from orchestrator.results.memoryreport import memory_shape_markdown
from orchestrator.results.numbers import number, whole
from orchestrator.results.phasesreport import phases_markdown
from orchestrator.results.predictedmemory import predicted_memory_markdown
from orchestrator.results.records import Records, records
from orchestrator.results.steadyreport import steady_markdown
from orchestrator.results.tablecolumns import CELL_ORDER, config_columns, ran_on_cpu, status_labels

#: the header of HF Trainer's throughput estimate, and what it is
HF_ESTIMATE_HEADER = registry.get(HF_TOKENS_PER_SECOND).header
HF_ESTIMATE_NOTE = (
    f"**{HF_ESTIMATE_HEADER}** is HF Trainer's `train_tokens_per_second`: per device, "
    "padding included, estimated by HF Trainer from the first batch's length × the number "
    "of steps. It is not a measurement and is not comparable with measured tokens/s, so it "
    "is kept apart from them."
)
#: the figure columns of a scenario's table in summary.md, in order
SUMMARY_FIGURES = registry.with_role("summary")
#: how a figure of each unit is shown (``_fmt``'s kinds); other units as they are
_UNIT_FORMATS = {
    "tokens/s": "int",
    "bytes": "gib",
    "fraction": "pct",
    "USD": "usd",
    "%": "percent",
    "% of allowed CPUs": "percent",
}


def _sort_key(value: Any) -> Any:
    """Numbers before text, missing values last, so mixed columns sort."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return (2, "")
    if isinstance(value, (int, float)):
        return (0, value)
    return (1, str(value))


def _fmt(value: Any, kind: str = "") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if kind == "int":
        return f"{value:,.0f}"
    if kind == "gib":
        return f"{value / GIB:.2f}"
    if kind == "pct":
        return f"{100 * value:.1f}"
    if kind == "percent":
        return f"{value:.1f}"
    if kind == "usd":
        return f"{value:,.4f}" if value < 1 else f"{value:,.2f}"
    if kind == "time":
        seconds = float(value)
        if seconds >= 3600:
            return f"{seconds / 3600:.1f} h"
        if seconds >= 60:
            return f"{seconds / 60:.1f} min"
        return f"{seconds:.1f} s"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _spread(cell: Mapping[Any, Any], metric: str) -> str:
    text = _fmt(cell.get(metric), "int")
    cv = number(cell.get(f"{metric}_cv"))
    if cell.get("repeats_ok", 0) > 1 and cv is not None:
        text += f" ±{100 * cv:.1f}%"
    return text


def status_text(cell: Mapping[Any, Any], capacity: Capacity | None) -> str:
    """A cell's status for reading: a failed cell without metrics says what its memory shows."""
    status = str(cell.get("status"))
    memory = cell.get("failed_peak_memory_bytes")
    if memory is None or (isinstance(memory, float) and math.isnan(memory)):
        return status
    if cell.get("likely_oom") and capacity is not None:
        return f"no metrics (likely OOM: {gib(memory)} of {gib(capacity.bytes)} GiB)"
    on_gpu = str(cell.get("device")) != "cpu"
    if status == "failed" and on_gpu and (capacity is None or not capacity.gpu):
        return f"no metrics (memory reached {gib(memory)} GiB; device capacity unknown)"
    return status


def warnings_note(report: ReportTables) -> list[str]:
    """A line per run file the read could not read (``Report.warnings``), in recommend's
    style of warning: ``- **warning**: runs/<id>/result.json unreadable (...); ...``."""
    if not report.warnings:
        return []
    return [*[f"- **warning**: {line}" for line in report.warnings], ""]


def packed_note(rows: pd.DataFrame) -> list[str]:
    """A paragraph when runs shared their machine or node with other jobs (``--pack``, or a
    Ray node running several tasks): their figures are not an exclusive machine's."""
    if "run_mode" not in rows.columns:
        return []
    packed = int((rows["run_mode"].astype(str) == "packed").sum())
    if not packed:
        return []
    return [
        f"**Packed**: {packed} of {len(rows)} experiment(s) ran beside other jobs on the same "
        "machine or node (`run_mode` packed, with whom in `packed_with`, raw_summary.csv): "
        "they shared its CPUs, memory bandwidth and PCIe, so their tokens/s and times are "
        "not an exclusive machine's.",
        "",
    ]


def shared_note(rows: pd.DataFrame) -> list[str]:
    """A paragraph when experiments shared launches (``--launch family``): which, and what
    each launch cost before training, paid once for all of its experiments."""
    if "run_mode" not in rows.columns or "launch_id" not in rows.columns:
        return []
    shared = rows[rows["run_mode"].astype(str) == "shared"]
    if shared.empty:
        return []
    lines = [
        f"**Shared launches**: {len(shared)} of {len(rows)} experiment(s) ran one after "
        f"another in {shared['launch_id'].nunique()} launch(es) of their family "
        "(`--launch family`: same model, task, trainer, framework, processes, dtype and "
        "interpreter; `launch_id` and `launch_position` in raw_summary.csv). Each launch paid "
        "its start-up once (launcher, interpreter, imports, data, trainer: `launch_overhead_s`, "
        "launch to first step less the model load and the first step); each experiment "
        "loaded its own model and built its own optimizer and trainer, with the memory peaks "
        "reset between them.",
        "",
        "| launch | experiments, in order | paid once, s |",
        "|---|---|---|",
    ]
    for launch_id, group in shared.groupby("launch_id", sort=False):
        group = group.sort_values("launch_position", kind="stable")
        names = ", ".join(f"`{eid}`" for eid in group["experiment_id"].astype(str))
        overhead = pd.to_numeric(group.get(LAUNCH_OVERHEAD), errors="coerce").dropna()
        paid = f"{overhead.iloc[0]:.1f}" if len(overhead) else "–"
        lines.append(f"| `{str(launch_id)[:8]}` | {names} | {paid} |")
    return [*lines, ""]


def not_launched_note(rows: pd.DataFrame) -> list[str]:
    """A paragraph when experiments were spared: how many, and the error that spared them."""
    labels = status_labels(rows)
    spared = rows[labels == NOT_LAUNCHED]
    if spared.empty:
        return []
    errors = (
        dict(zip(rows["experiment_id"].astype(str), rows["error"], strict=True))
        if "experiment_id" in rows.columns
        else {}
    )
    causes: dict[bool, list[str]] = {True: [], False: []}  # by: was it a full disk
    for reason in dict.fromkeys(str(e) for e in spared["error"]):
        skip = skip_from_error(reason)
        assert skip is not None  # a spared row's error is its skip's
        error = errors.get(str(skip.follows))
        text = f"`{skip.follows}`" + (f" ({error})" if isinstance(error, str) else "")
        causes[skip.cause == "disk_full"].append(text)
    why = []
    if causes[True]:
        why.append(
            "the disk was full when an earlier experiment ran, so every later one would "
            f"have failed alike (first: {'; '.join(causes[True])})"
        )
    if causes[False]:
        why.append(
            "two cells of their model, trainer and framework had failed with the same "
            "error, which was not about memory or time, so they would have failed alike "
            f"(first failure: {'; '.join(causes[False])})"
        )
    return [
        f"**Spared**: {len(spared)} experiment(s) were not launched: {'; and '.join(why)}. "
        "`tunematrix run --no-stop-early` (STOP_EARLY=false) launches them.",
        "",
    ]


def status_counts(rows: pd.DataFrame) -> str:
    """``failed 39 (36 likely OOM), ok 85``: the rows' statuses, likely OOMs among the failed."""
    counts = status_labels(rows).value_counts().to_dict()
    likely = (
        int(rows.loc[rows["status"] == "failed", "likely_oom"].fillna(False).astype(bool).sum())
        if "likely_oom" in rows.columns
        else 0
    )
    parts = []
    for status, n in sorted(counts.items()):
        text = f"{status} {n}"
        if status == "failed" and likely:
            text += f" ({likely} likely OOM)"
        parts.append(text)
    return ", ".join(parts)


def figure_text(cell: Mapping[Any, Any], name: str) -> str:
    """A cell's figure as a table shows it: by its unit, with the spread of a main figure."""
    column = registry.get(name)
    if column.aggregate == "spread":
        return _spread(cell, name)
    text = _fmt(cell.get(name), _UNIT_FORMATS.get(column.unit, ""))
    mark = _WINDOW_MARK.get(str(cell.get("util_window")))
    if name in (GPU_UTIL, CPU_UTIL) and mark and text != "–":
        text += f" ({mark})"
    return text


#: key columns a scenario's table shows when they vary within it (the trainer first:
#: sft and hf cells of one scenario side by side)
_VARYING_KEYS = registry.with_role("varying")
#: the figure shown next to tokens/s for the tasks whose headline unit is a sample
#: (``TaskLine.samples_first``: classification, speech)
SAMPLES_FIGURE = SAMPLES_PER_SECOND


def _lines(frame: pd.DataFrame) -> list[TaskLine]:
    """The declarations of the tasks ``frame``'s rows trained (a row without one: causal-lm)."""
    names = (
        frame["task"].dropna().astype(str).unique().tolist()
        if "task" in frame.columns
        else [DEFAULT_TASK]
    )
    return [line for name in sorted(names) if (line := task_line(name)) is not None]


def _figures_of(group: pd.DataFrame, figures: list[str]) -> list[tuple[str, str]]:
    """A scenario table's figures and their headers: ``figures``, with samples/s next to
    tokens/s where a task of the table counts samples first (``<sample>/s`` when every
    task of the table has one sample word, ``images/s``), and each count the table's
    tasks report beside tokens (source tokens/s, audio s/s, …)."""
    out = [(name, registry.get(name).header) for name in figures]
    lines = _lines(group)
    extra: list[tuple[str, str]] = []
    if any(line.samples_first for line in lines) and has_figures(group, SAMPLES_FIGURE):
        samples = {line.sample for line in lines}
        header = (
            f"{samples.pop()}/s"
            if len(samples) == 1 and len(lines) == 1
            else registry.get(SAMPLES_FIGURE).header
        )
        extra.append((SAMPLES_FIGURE, header))
    for count in dict.fromkeys(c for line in lines for c in line.counts):
        name = count_column(count)
        if has_figures(group, name):
            extra.append((name, registry.get(name).header))
    if not extra:
        return out
    after = max(
        (i for i, (name, _) in enumerate(out) if name.startswith("tokens_per_second")),
        default=-1,
    )
    return [*out[: after + 1], *extra, *out[after + 1 :]]


#: a utilisation figure over a wider window than the measured steps, as a table shows it
_WINDOW_MARK = {"training": "training", "job": "whole job"}


def reading_guide(
    report: ReportTables, figures: list[str], missing: list[str], cpu: bool
) -> list[str]:
    """The words and columns the tables use, each once, before the first table."""
    cells = report.cells
    one, many = worker(cpu), workers(cpu)
    words = [
        "- **scenario**: one entry of the scenarios file, asking one question (which batch "
        "size, which trainer, LoRA or full fine-tuning); each has a section below.",
        "- **cell**: one setup of the matrix (model, framework, number of "
        f"{many}, batch, and the scenario's swept values), named by its `cell_id`. A "
        "**repeat** is one run of a cell (`--repeats N`); a cell's figures are the medians "
        "over its ok repeats (± the coefficient of variation where there are two or more).",
    ]
    if equivalence.has_variants(cells):
        words.append(
            "- **baseline**: the cell a variant's loss is compared with: the same setup "
            "with `framework_config: null` and the scenario's default trainer (Loss against "
            "the baseline)."
        )
    if not report.scaling.empty:
        words.append(
            f"- **family**: the cells of one setup and effective batch at different numbers "
            f"of {many} (Scaling)."
        )
    columns = [
        "- **model**, **framework** (the accelerate overlay, `framework_config`), "
        f"**{many}** (how many trained: `num_gpus`), **batch/dev × accum** (the batch per "
        f"{one} × gradient accumulation steps; × {many} it is the effective batch). "
        "Other keys (task, trainer, PEFT method, sequence length, …) appear in a "
        "scenario's table where they vary in it.",
    ]
    for name in figures:
        header = _header(name, registry.get(name).header, cpu)
        if name == HF_TOKENS_PER_SECOND:
            columns.append(f"- {HF_ESTIMATE_NOTE}")
        elif name == PEAK_MEMORY:
            found = (
                cells[PEAK_MEMORY_SOURCE].dropna().astype(str).value_counts()
                if PEAK_MEMORY_SOURCE in cells.columns
                else pd.Series(dtype=int)
            )
            if cpu and len(found) == 1:
                # one source on the CPU: say it alone, not the GPUs' sources it was not
                text = f"- **{header}**: {found.index[0]}"
            else:
                text = f"- **{header}**: the first there is of: " + "; ".join(
                    label for _, _, label in PEAK_MEMORY_SOURCES
                )
                if len(found):
                    text += "; here: " + ", ".join(
                        f"{source} ({n} cell{'s' if n > 1 else ''})" for source, n in found.items()
                    )
            columns.append(text + ".")
        elif registry.get(name).meaning:
            text = registry.get(name).meaning.format(worker=one, workers=many)
            if name in (GPU_UTIL, CPU_UTIL):
                text += (
                    ". A figure marked (training) or (whole job) covers a wider window: the "
                    "measured steps were too short for the sidecar to sample (under "
                    "3 samples or 0.5 s), so start-up and data loading count, and it reads lower"
                )
            columns.append(f"- **{header}**: {text}.")
    lines = _lines(cells)
    if any(line.samples_first for line in lines) and has_figures(cells, SAMPLES_FIGURE):
        columns.append(
            f"- **{registry.get(SAMPLES_FIGURE).header}**: "
            + registry.get(SAMPLES_FIGURE).meaning.format(worker=one, workers=many)
            + "."
        )
    for count in dict.fromkeys(c for line in lines for c in line.counts):
        name = count_column(count)
        if has_figures(cells, name):
            meaning = registry.get(name).meaning.format(worker=one, workers=many)
            columns.append(f"- **{registry.get(name).header}**: {meaning}.")
    if [line.name for line in lines] not in ([], [DEFAULT_TASK]):
        # what a token and a sample are differs between tasks: each task's, once
        columns.extend(
            f"- For {line.name}, samples/s counts {line.sample}, and a token is {line.token}."
            for line in lines
        )
    if quality.shows_quality(cells):
        columns.append(f"- {quality.NOTE}")
    columns.append(
        "- **status**: ok, oom (out of memory), failed, timeout, interrupted, or skipped "
        "(pruned: a smaller cell of its family ran out of memory; spared: an identical "
        "failure stopped its launch); a cell whose repeats ended apart shows each status "
        "with its count (`oom×1 pruned×1`); the cells that are not ok are listed under "
        "their table with the error and log."
    )
    # a CPU run has no GPU figure to miss
    missing = [m for m in missing if not (cpu and "GPU" in m)]
    if missing:
        columns.append(f"- Columns with no figure in any cell are left out: {', '.join(missing)}.")
    return ["## Reading this summary", "", *words, "", "Columns:", "", *columns, ""]


def _header(name: str, header: str, cpu: bool) -> str:
    """A column's header, per process rather than per GPU on the CPU."""
    return header.replace("/GPU", "/process") if cpu else header


@dataclass(frozen=True)
class Context:
    """What the report gives every section of summary.md."""

    report: ReportTables
    source: Path
    cost: CostSettings
    loss_tolerance: float
    rank_by: str
    #: the summary figures some cell has, and the headers of those none has
    figures: list[str]
    missing: list[str]
    cpu: bool
    #: the scenario arguments that are columns of the cells
    args: list[str]

    @property
    def rows(self) -> pd.DataFrame:
        return self.report.rows

    @property
    def cells(self) -> pd.DataFrame:
        return self.report.cells


#: One section of summary.md: its lines, from what the report gives every section.
Section = Callable[[Context], list[str]]


def summary_markdown(
    report: ReportTables,
    source: Path,
    cost: CostSettings,
    *,
    loss_tolerance: float = equivalence.DEFAULT_TOLERANCE,
    rank_by: str = "speed",
) -> str:
    """summary.md: each of ``SECTIONS`` in turn."""
    cells = report.cells
    hf = shows_hf_estimate(cells)
    figures = [
        name
        for name in SUMMARY_FIGURES
        if (name == HF_TOKENS_PER_SECOND and hf)
        or (name != HF_TOKENS_PER_SECOND and has_figures(cells, name))
    ]
    missing = [
        registry.get(name).header
        for name in SUMMARY_FIGURES
        if name != HF_TOKENS_PER_SECOND and not has_figures(cells, name)
    ]
    context = Context(
        report,
        source,
        cost,
        loss_tolerance,
        rank_by,
        figures,
        missing,
        ran_on_cpu(cells),
        config_columns(cells),
    )
    lines = [line for section in SECTIONS for line in section(context)]
    # one blank line between blocks, wherever the sections' own blank lines meet
    text = "\n".join(line for i, line in enumerate(lines) if line or (i and lines[i - 1]))
    return text + "\n"


def _title(c: Context) -> list[str]:
    counts = status_counts(c.rows)
    return [
        "# Benchmark summary",
        "",
        f"Source: `{c.source}` — {len(c.rows)} experiment(s) in {len(c.cells)} cell(s); " + counts,
        "",
    ]


def _scenario_tables(context: Context) -> list[str]:
    """A table per scenario, and its cells that are not ok."""
    cells, cpu, lines = context.cells, context.cpu, []
    order = [k for k in CELL_ORDER if k in cells.columns]
    table = Records(cells)  # each column read once, for every scenario's rows
    for scenario, group in cells.groupby("scenario", sort=False):
        group = group.sort_values(order, kind="stable", key=lambda c: c.map(_sort_key))
        varying = [
            a
            for a in dict.fromkeys((*_VARYING_KEYS, *context.args))
            if a in group.columns and group[a].astype(str).nunique() > 1
        ]
        shown = _figures_of(group, context.figures)
        # whether the cells learnt, beside how fast they ran (orchestrator/results/quality.py)
        learnt = quality.shows_quality(group)
        headers = [
            "model",
            "framework",
            workers(cpu),
            "batch/dev × accum",
            *varying,
            *[_header(name, header, cpu) for name, header in shown],
            *([quality.HEADER] if learnt else []),
            "status",
        ]
        body = []
        for c in table.rows(group):
            model = str(c.get("model_name_or_path"))
            body.append(
                [
                    model,
                    str(c.get("framework_config")),
                    _fmt(c.get("num_gpus"), "int"),
                    f"{_fmt(c.get('per_device_train_batch_size'), 'int')} × {_fmt(c.get('gradient_accumulation_steps'), 'int')}",
                    *[_fmt(c.get(a)) for a in varying],
                    *[figure_text(c, name) for name, _ in shown],
                    *([quality.quality_text(c)] if learnt else []),
                    status_text(c, context.report.capacity),
                ]
            )
        lines += ["", f"## {str(scenario) or '(no scenario)'}", "", *md_table(headers, body)]
        problems = group[~group["status"].isin(["ok"])]
        if len(problems):
            lines += ["", "Not ok:"]
            for c in table.rows(problems):
                where = f" (log: `{c['log']}`)" if c.get("log") else ""
                # a pruned (or spared) cell's status says so: its reason alone follows
                skip = skip_from_error(c.get("error"))
                error = skip.because if skip else str(c.get("error") or "no error recorded")
                lines.append(
                    f"- {c['status']}: {c.get('model_name_or_path')}, {c.get('framework_config')}, "
                    f"{workers(str(c.get('device')) == 'cpu', whole(c.get('num_gpus')))}: "
                    f"{error}{where}"
                )
    return lines


def _notes(c: Context) -> list[str]:
    """The report's notes on its plots and on the rest."""
    lines = []
    if c.report.plot_notes:
        lines += ["", "## Plots", "", *[f"- {n}" for n in c.report.plot_notes]]
    if c.report.notes:
        lines += ["", "## Notes", "", *[f"- {n}" for n in c.report.notes]]
    return lines


def _capacity_lines(report: ReportTables) -> list[str]:
    """Where the device memory came from, and what likely OOM means; or why it is unknown."""
    capacity = report.capacity
    cells = report.cells
    failed_with_memory = "failed_peak_memory_bytes" in cells.columns and bool(
        (
            cells["failed_peak_memory_bytes"].notna()
            & (cells["status"] == "failed")
            & (cells["device"].astype(str) != "cpu")
        ).any()
    )
    if capacity is not None and capacity.gpu:
        text = f"Device memory: {gib(capacity.bytes)} GiB, {capacity.source}."
        if failed_with_memory:
            text += (
                f" A failed run without metrics whose memory reached ≥ "
                f"{100 * LIKELY_OOM_FRACTION:.0f}% of it "
                f"({gib(LIKELY_OOM_FRACTION * capacity.bytes)} GiB) is shown as likely OOM: "
                "likely, not confirmed, as the row records no cause."
            )
        return ["", text]
    if failed_with_memory:
        return [
            "",
            "Device memory unknown (not in the table or its file name): pass "
            "`--gpu-memory-gib` to tell which failed runs likely ran out of memory.",
        ]
    return []


def _series_title(row: Mapping[Any, Any], keys: list[str], varying: list[str]) -> str:
    unit = workers(ran_on_cpu(row), short=True)
    parts = []
    for k in keys:
        value = row.get(k)
        if str(value) in ("", "none", "nan", "None"):
            continue
        declared = registry.find(k)
        if declared is not None and declared.short:
            parts.append(declared.short.format(v=_fmt(value, "int"), unit=unit, per=unit))
        elif k in ("scenario", "model_name_or_path", "peft_method"):
            parts.append(str(value))
        elif k in varying:
            parts.append(f"{k}={_fmt(value)}")
    return " · ".join(parts)


def scaling_markdown(table: pd.DataFrame) -> list[str]:
    if table.empty:
        return []
    count = workers(ran_on_cpu(table))
    lines = [
        "",
        "## Scaling",
        "",
        f"Throughput relative to the smallest number of {count} of each family (the same "
        f"effective batch split over more {count}); in brackets, the scaling efficiency "
        "(speedup over the ideal). One column per framework.",
    ]
    keys = [k for k in scaling_keys(table) if k != "framework_config"]
    varying = [k for k in keys if table[k].map(str).nunique() > 1]
    titles: dict[tuple[str, ...], str] = {}
    frameworks: dict[tuple[str, ...], list[str]] = {}
    cells: dict[tuple[str, ...], dict[int, dict[str, str]]] = {}
    for row in records(table):
        key = tuple(str(row[k]) for k in keys)
        titles.setdefault(key, _series_title(row, keys, varying))
        fw = str(row.get("framework_config"))
        if fw not in frameworks.setdefault(key, []):
            frameworks[key].append(fw)
        text = f"{row['speedup']:.2f} ({100 * row['scaling_efficiency']:.0f}%)"
        cells.setdefault(key, {}).setdefault(int(row["num_gpus"]), {}).setdefault(fw, text)
    for key, by_gpus in cells.items():
        fws = frameworks[key]
        body = [[str(g), *[by_gpus[g].get(fw, "–") for fw in fws]] for g in sorted(by_gpus)]
        lines += ["", f"### {titles[key]}", "", *md_table([count, *fws], body)]
    return lines


#: the figures of the cost table whose headers are their labels
_COST_FIGURES = (
    TOKENS_PER_SECOND,
    COST_PER_1M_TOKENS,
    COST_PER_RUN,
    TIME_PER_EPOCH,
    COST_PER_EPOCH,
)


def cost_markdown(cells: pd.DataFrame, cost: CostSettings) -> list[str]:
    if cost.usd_per_gpu_hour is None and not cost.tokens:
        return []
    ok = cells[cells[TOKENS_PER_SECOND].notna()]
    if ok.empty:
        return []
    header = {name: registry.get(name).header for name in _COST_FIGURES}
    cpu = ran_on_cpu(ok)
    priced = cost.usd_per_gpu_hour is not None
    budget = f"{cost.tokens:,.0f} tokens" if cost.tokens else ""
    # the figures after tokens/s that this table shows: (header, column, format)
    figures = [
        (title, name, kind)
        for title, name, kind, shown in (
            (header[COST_PER_1M_TOKENS], COST_PER_1M_TOKENS, "usd", priced),
            (header[COST_PER_RUN], COST_PER_RUN, "usd", priced),
            (header[TIME_PER_EPOCH], TIME_PER_EPOCH, "time", True),
            (header[COST_PER_EPOCH], COST_PER_EPOCH, "usd", priced),
            (f"time for {budget}", TIME_TO_TRAIN, "time", bool(cost.tokens)),
            (f"$ for {budget}", COST_TO_TRAIN, "usd", bool(cost.tokens) and priced),
        )
        if shown
    ]
    headers = ["scenario", "model", "framework", workers(cpu), header[TOKENS_PER_SECOND]]
    headers += [title for title, _, _ in figures]
    body = [
        [
            str(c["scenario"]),
            str(c["model_name_or_path"]),
            str(c["framework_config"]),
            _fmt(c["num_gpus"], "int"),
            _fmt(c[TOKENS_PER_SECOND], "int"),
            *(_fmt(c.get(name), kind) for _, name, kind in figures),
        ]
        for c in records(ok)
    ]
    price = (
        f"${cost.usd_per_gpu_hour:g} per GPU-hour" + (" (applied to process-hours)" if cpu else "")
        if priced
        else "no price set"
    )
    return [
        "",
        "## Cost and time to train",
        "",
        f"At {price}; an epoch is one pass over the prepared dataset of the run. Estimates "
        "extrapolate the measured steady-state throughput.",
        "",
        *md_table(headers, body),
    ]


#: summary.md's sections, in order; each module's part, from what the report gives all
SECTIONS: tuple[Section, ...] = (
    _title,
    # the run files the read could not read, whose rows read failed (results/collect.py)
    lambda c: warnings_note(c.report),
    # every word and column the tables use, once, before the first table
    lambda c: reading_guide(c.report, c.figures, c.missing, c.cpu),
    # first: what to run, per scenario, then across scenarios (results/recommend.py)
    lambda c: recommend.markdown(c.cells, c.rank_by),
    lambda c: packed_note(c.rows),
    lambda c: shared_note(c.rows),
    lambda c: not_launched_note(c.rows),
    lambda c: _capacity_lines(c.report),
    # steady-state measuring: which runs stopped early, which never settled (results/steadyreport.py)
    lambda c: steady_markdown(c.rows),
    _scenario_tables,
    # where cells differ in what shapes their memory besides their keys (results/memoryreport.py)
    lambda c: memory_shape_markdown(c.cells),
    # each GPU cell's memory predicted before launch against its measurement (plan.csv)
    lambda c: predicted_memory_markdown(c.rows, c.source),
    lambda c: side_by_side_markdown(
        c.cells, c.args, lambda name: registry.get(name).header, figure_text
    ),
    lambda c: scaling_markdown(c.report.scaling),
    # each variant's loss against its scenario's baseline (results/equivalence.py)
    lambda c: equivalence.markdown(c.cells, c.loss_tolerance),
    lambda c: cost_markdown(c.cells, c.cost),
    # energy per token, the conditions of the measurement, throttling (results/energyreport.py)
    lambda c: energyreport.markdown(c.cells, c.cost),
    # each cell's wall time in phases, and the matrix's share of training (results/phasesreport.py)
    lambda c: phases_markdown(c.rows),
    # profiled cells only (profile: true): communication time per step, from the traces
    lambda c: communication_markdown(c.cells),
    # only when throughput trended with run order (orchestrator/results/drift.py)
    lambda c: drift_markdown(c.rows, c.cells),
    # scenarios with search: the largest batch or length that fits (results/fitreport.py)
    lambda c: fitreport.summary_section(c.source) if c.source.is_dir() else [],
    _notes,
)
