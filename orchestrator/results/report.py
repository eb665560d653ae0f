"""The report: the tables to decide from, scaling, cost and time to train.

Pure over files: it reads a results folder (or a summary CSV) and writes
``raw_summary.csv`` (rebuilt from the run folders), ``benchmarks.csv`` (one
row per cell, repeats aggregated, constant columns dropped), ``summary.md``
and ``plots/``. It needs pandas and matplotlib, never the training stack.

Repeats of a cell aggregate to the median, with the coefficient of variation
and the min/max of the main figures. A cell's status is its repeats' status,
or the mix (``ok×2 oom×1``). Failed cells stay in every table.

Two figures are kept apart on purpose. Our tokens/s are measured (real tokens
over the measured steps); HF Trainer's ``train_tokens_per_second`` is an
estimate (per device, padding included, from the first batch's length × the
steps), and where it is all a table has (the predecessor's), it is shown in a
column and a plot of its own, never as a measured figure.

A failed run without metrics whose memory reached ``LIKELY_OOM_FRACTION`` of the
device's is shown as *likely* out of memory: likely, as the row records no cause
(the predecessor wrote OOMs as rows without metrics).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from orchestrator.results import collect

from orchestrator.running import envinfo
from orchestrator.results.compare import is_output
from orchestrator.contract.layout import write_atomic
from orchestrator.matrix.table import KEY_COLUMNS
from orchestrator.results.rows import EXTRA_METRICS, METRIC_COLUMNS, OUTCOME_COLUMNS, to_csv

GIB = 2**30
MIB = 2**20

#: what a cell is, besides its id: the key columns its repeats share
CELL_KEYS = tuple(
    k for k in KEY_COLUMNS if k not in ("experiment_id", "repeat", "cell_id", "status")
)
#: aggregated to median, CV, min and max over repeats
SPREAD_METRICS = ("tokens_per_second_global", "tokens_per_second_per_device", "step_time_median_s")
#: aggregated to the median over repeats
MEDIAN_METRICS = (
    "train_tokens_per_second",
    "train_samples_per_second",
    "train_runtime",
    "step_time_cv",
    "train_loss",
    "loss_last",
    "mfu",
    "achieved_tflops_per_device",
    "flops_per_token",
    "peak_memory_bytes",
    "mem_nvidia_mem_reserved",
    "mem_peak_torch_mem_alloc_in_bytes",
    "mem_torch_mem_alloc_in_bytes",
    "mem_peak_rss_bytes",
    "torch_max_memory_reserved_bytes",
    "mem_tree_peak_pss_bytes",
    "mem_tree_peak_rss_bytes",
    "time_to_first_step_s",
    "job_s",
    "padding_fraction",
    "data_tokens",
    "cost_per_1m_tokens_usd",
    "cost_per_run_usd",
    "time_per_epoch_s",
    "cost_per_epoch_usd",
    "time_to_train_s",
    "cost_to_train_usd",
)
#: where the peak memory of a row comes from, first present wins
PEAK_MEMORY_SOURCES = (
    ("mem_nvidia_peak_bytes_max", 1, "NVML peak over the job's GPUs"),
    ("torch_max_memory_reserved_bytes", 1, "torch reserved, largest rank"),
    ("mem_peak_torch_mem_alloc_in_bytes", 1, "HF stage metrics"),
    ("mem_nvidia_mem_reserved", MIB, "NVML, mean over GPUs"),
    ("mem_peak_rss_bytes", 1, "resident memory of a training process"),
)


#: a failed run without metrics whose memory reached this share of the device's is
#: likely out of memory. In the predecessor's published A100 80GB tables every row
#: without metrics reached 77,734-81,214 MiB of 81,920 (95-99%). Finished runs get as
#: high (up to 98.6%), so memory alone is no verdict: only runs without metrics qualify.
LIKELY_OOM_FRACTION = 0.9
#: figures whose absence means a run left no metrics
RUN_FIGURES = (
    "train_runtime",
    "tokens_per_second_global",
    "train_tokens_per_second",
    "step_time_median_s",
    "train_loss",
)
#: nominal memory of GPUs known by name, for a table that does not record it: a name
#: matched (lower case) in the rows' ``gpu_device_name``, else in the file or folder name
KNOWN_GPU_MEMORY = (
    (r"a100.{0,12}?80\s*gb", 80 * GIB, "A100 80GB"),
    (r"a100.{0,12}?40\s*gb", 40 * GIB, "A100 40GB"),
    (r"h100(?![-_ ]*nvl)", 80 * GIB, "H100 80GB"),
    (r"h200", 141 * GIB, "H200"),
)
#: the header of HF Trainer's throughput estimate, and what it is
HF_ESTIMATE_HEADER = "HF est. tokens/s/GPU"
HF_ESTIMATE_NOTE = (
    f"**{HF_ESTIMATE_HEADER}** is HF Trainer's `train_tokens_per_second`: per device, "
    "padding included, estimated by HF Trainer from the first batch's length × the number "
    "of steps. It is not a measurement and is not comparable with measured tokens/s, so it "
    "is kept apart from them."
)


@dataclass(frozen=True)
class Capacity:
    """The memory of one device of a run, and where that figure came from."""

    bytes: float
    #: for summary.md: "given with --gpu-memory-gib", "from the file name …"
    source: str
    #: a GPU's memory (likely-OOM applies); else the machine's, for a CPU run
    gpu: bool = True


@dataclass(frozen=True)
class CostSettings:
    usd_per_gpu_hour: float | None = None
    #: a token budget to estimate the time and cost to train
    tokens: float | None = None


@dataclass
class Report:
    rows: pd.DataFrame
    cells: pd.DataFrame
    scaling: pd.DataFrame
    written: list[Path] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: the rows as raw_summary.csv writes them
    raw: list[dict[str, Any]] = field(default_factory=list)
    #: the memory of a device, when known (likely-OOM, memory plot)
    capacity: Capacity | None = None
    #: one line per plot: what it shows, or why it was not drawn
    plot_notes: list[str] = field(default_factory=list)


# ---------------------------------------------------------------------------
# Derived columns
# ---------------------------------------------------------------------------


def _num(df: pd.DataFrame, column: str) -> pd.Series:
    if column not in df.columns:
        return pd.Series([math.nan] * len(df), index=df.index, dtype=float)
    return pd.to_numeric(df[column], errors="coerce")


def add_derived(df: pd.DataFrame, cost: CostSettings) -> pd.DataFrame:
    """Peak memory (with its source), cost and time-to-train columns."""
    df = df.copy()
    peak = pd.Series([math.nan] * len(df), index=df.index, dtype=float)
    source = pd.Series([None] * len(df), index=df.index, dtype=object)
    for column, scale, label in PEAK_MEMORY_SOURCES:
        values = _num(df, column) * scale
        take = peak.isna() & values.notna() & (values > 0)
        peak[take] = values[take]
        source[take] = label
    df["peak_memory_bytes"] = peak
    df["peak_memory_source"] = source

    tps = _num(df, "tokens_per_second_global")
    gpus = _num(df, "num_gpus")
    price = cost.usd_per_gpu_hour
    if price is not None:
        df["usd_per_gpu_hour"] = price
        df["cost_per_1m_tokens_usd"] = price * gpus / 3600 / tps * 1e6
        seconds = _num(df, "job_s").fillna(_num(df, "train_runtime"))
        df["cost_per_run_usd"] = price * gpus * seconds / 3600
    epoch = _num(df, "data_tokens")
    df["time_per_epoch_s"] = epoch / tps
    if price is not None:
        df["cost_per_epoch_usd"] = df["time_per_epoch_s"] * gpus * price / 3600
    if cost.tokens:
        df["time_to_train_s"] = cost.tokens / tps
        if price is not None:
            df["cost_to_train_usd"] = df["time_to_train_s"] * gpus * price / 3600
    return df


# ---------------------------------------------------------------------------
# Cells: repeats aggregated
# ---------------------------------------------------------------------------


def _status_mix(statuses: list[str]) -> str:
    counts: dict[str, int] = {}
    for s in statuses:
        counts[s] = counts.get(s, 0) + 1
    if len(counts) == 1:
        return statuses[0]
    return " ".join(f"{s}×{n}" for s, n in sorted(counts.items(), key=lambda kv: -kv[1]))


_AGGREGATE_COLUMNS = {
    f"{metric}{suffix}" for metric in SPREAD_METRICS for suffix in ("_cv", "_min", "_max")
} | {"repeats", "repeats_ok", "peak_memory_source", "usd_per_gpu_hour", "log", "error"}


#: columns the report adds to cells for its own tables and plots, never written to a CSV
REPORT_ONLY_COLUMNS = ("likely_oom", "failed_peak_memory_bytes")


def argument_columns(df: pd.DataFrame) -> list[str]:
    """Columns that are neither keys nor figures we declare: scenario arguments, and
    outputs of other tables we have no declaration for (the predecessor's ``epoch``);
    ``config_columns`` leaves the latter out."""
    known = set(KEY_COLUMNS) | set(METRIC_COLUMNS) | set(EXTRA_METRICS) | set(OUTCOME_COLUMNS)
    known |= set(MEDIAN_METRICS) | _AGGREGATE_COLUMNS | set(REPORT_ONLY_COLUMNS)
    return [c for c in df.columns if c not in known and not c.startswith("mem_")]


def config_columns(df: pd.DataFrame) -> list[str]:
    """The scenario arguments of ``df``: never a measured output (``compare.is_output``)."""
    return [c for c in argument_columns(df) if not is_output(c)]


def other_outputs(df: pd.DataFrame) -> list[str]:
    """Outputs of ``df`` that no list of ours declares (the predecessor's ``epoch``…)."""
    return [c for c in argument_columns(df) if is_output(c)]


def aggregate(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per cell: medians over the ok repeats, spread of the main figures.

    Vectorised over all cells at once (a Python loop per cell takes minutes for
    10,000 experiments).
    """
    if rows.empty:
        return pd.DataFrame()
    args = config_columns(rows)
    by_cell = rows.groupby("cell_id", sort=False, dropna=False)
    keys = [k for k in (*CELL_KEYS, *args) if k in rows.columns]
    cells = by_cell[keys].first() if keys else pd.DataFrame(index=by_cell.size().index)
    cells["repeats"] = by_cell.size()
    status = rows["status"].fillna("unknown").astype(str).replace({"skipped": "ok"})
    mixed = status.groupby(rows["cell_id"], sort=False).agg(
        lambda s: s.iloc[0] if s.nunique() == 1 else _status_mix(list(s))
    )
    cells["status"] = mixed
    errors = rows["error"].where(rows["error"].astype(str).str.len() > 0)
    cells["error"] = errors.groupby(rows["cell_id"], sort=False).first()
    if "log" in rows.columns:
        cells["log"] = (
            rows["log"].groupby(rows["cell_id"], sort=False).first().where(cells["error"].notna())
        )
    ok = rows[rows["status"].isin(["ok", "skipped"])]
    cells["repeats_ok"] = (
        ok.groupby("cell_id", sort=False).size().reindex(cells.index, fill_value=0)
    )
    metrics = [m for m in (*SPREAD_METRICS, *MEDIAN_METRICS) if m in rows.columns]
    # outputs we declare nothing for: numbers to the median of the ok repeats, as ours;
    # text (the predecessor's error messages, output folders) as the first repeat has it
    others = other_outputs(rows)
    numeric = [c for c in others if pd.api.types.is_numeric_dtype(rows[c])]
    metrics += numeric
    text = [c for c in others if c not in numeric]
    if text:
        firsts = by_cell[text].first()
        for column in text:
            cells[column] = firsts[column]
    values = ok[metrics].apply(pd.to_numeric, errors="coerce")
    grouped = values.groupby(ok["cell_id"], sort=False)
    medians = grouped.median().reindex(cells.index)
    for metric in metrics:
        cells[metric] = medians[metric]
    spread = [m for m in SPREAD_METRICS if m in values.columns]
    if spread:
        count = grouped[spread].count().reindex(cells.index)
        mean = grouped[spread].mean().reindex(cells.index)
        # the sample standard deviation (ddof=1): repeats are a sample of the run-to-run spread
        std = grouped[spread].std(ddof=1).reindex(cells.index)
        lo = grouped[spread].min().reindex(cells.index)
        hi = grouped[spread].max().reindex(cells.index)
        for metric in spread:
            cv = std[metric] / mean[metric].abs()
            cells[f"{metric}_cv"] = cv.where((count[metric] >= 2) & (mean[metric] != 0))
            cells[f"{metric}_min"] = lo[metric]
            cells[f"{metric}_max"] = hi[metric]
    for metric in SPREAD_METRICS:  # always present, so tables and plots can rely on them
        for column in (metric, f"{metric}_cv", f"{metric}_min", f"{metric}_max"):
            if column not in cells.columns:
                cells[column] = math.nan
    for extra in ("peak_memory_source",):
        if extra in ok.columns:
            cells[extra] = ok[extra].groupby(ok["cell_id"], sort=False).first().reindex(cells.index)
    if "gpu_device_name" in rows.columns:
        cells["gpu_device_name"] = by_cell["gpu_device_name"].first()
    cells = cells.reset_index()
    return cells.astype(object).where(cells.notna(), None)


# ---------------------------------------------------------------------------
# Scaling
# ---------------------------------------------------------------------------

SCALING_FAMILY = (
    "scenario",
    "framework_config",
    "model_name_or_path",
    "effective_batch_size",
    "max_seq_len",
    "packing",
    "peft_method",
    "torch_dtype",
    "device",
)


#: the columns ``scaling`` adds to a family's keys
SCALING_FIGURES = (
    "num_gpus",
    "base_num_gpus",
    "tokens_per_second_global",
    "speedup",
    "scaling_efficiency",
)


def scaling_keys(cells: pd.DataFrame) -> list[str]:
    """What defines a family: everything but the GPU count (and the per-device batch)."""
    return [k for k in SCALING_FAMILY if k in cells.columns] + [
        c for c in config_columns(cells) if c in cells.columns and c not in SCALING_FIGURES
    ]


def scaling(cells: pd.DataFrame) -> pd.DataFrame:
    """Speedup and efficiency of each cell family against its smallest GPU count.

    A family is a cell with everything but the GPU count (and so the per-device
    batch) fixed; the effective batch stays the same across counts.
    """
    if cells.empty:
        return pd.DataFrame()
    keys = scaling_keys(cells)
    usable = cells.copy()
    usable["tokens_per_second_global"] = pd.to_numeric(
        usable["tokens_per_second_global"], errors="coerce"
    )
    usable["num_gpus"] = pd.to_numeric(usable["num_gpus"], errors="coerce")
    usable = usable[usable["tokens_per_second_global"].notna() & usable["num_gpus"].notna()]
    if usable.empty:
        return pd.DataFrame()
    # families group on text, so that missing values group like any other
    labels = usable[keys].map(str)
    group_cols = [f"_family{i}" for i in range(len(keys))]
    usable = usable.assign(**{c: labels[k] for c, k in zip(group_cols, keys, strict=True)})
    usable = usable.sort_values([*group_cols, "num_gpus"], kind="stable")
    grouped = usable.groupby(group_cols, sort=False)
    usable = usable[grouped["num_gpus"].transform("nunique") >= 2]
    if usable.empty:
        return pd.DataFrame()
    grouped = usable.groupby(group_cols, sort=False)
    base_tps = grouped["tokens_per_second_global"].transform("first")
    base_n = grouped["num_gpus"].transform("first")
    table = usable[keys].copy()
    table["num_gpus"] = usable["num_gpus"].astype(int)
    table["base_num_gpus"] = base_n.astype(int)
    table["tokens_per_second_global"] = usable["tokens_per_second_global"]
    table["speedup"] = usable["tokens_per_second_global"] / base_tps
    table["scaling_efficiency"] = table["speedup"] / (usable["num_gpus"] / base_n)
    return table.reset_index(drop=True)


# ---------------------------------------------------------------------------
# Writing
# ---------------------------------------------------------------------------


def benchmarks_table(cells: pd.DataFrame) -> pd.DataFrame:
    """Cells for reading: keys kept, settings constant across all cells dropped, sorted.

    A measured figure is kept whenever some cell has it, even when every cell
    has the same value (one cell alone has every figure constant).
    """
    if cells.empty:
        return cells
    keep = set(CELL_KEYS) | {"status", "cell_id", "repeats"}
    cells = cells.drop(columns=[c for c in REPORT_ONLY_COLUMNS if c in cells.columns])
    constant = [
        c
        for c in cells.columns
        if c not in keep
        and not (is_output(c) and cells[c].notna().any())
        and cells[c].astype(str).nunique(dropna=False) <= 1
    ]
    table = cells.drop(columns=constant)
    order = [
        k
        for k in (
            "scenario",
            "framework_config",
            "model_name_or_path",
            "num_gpus",
            "effective_batch_size",
            "max_seq_len",
        )
        if k in table.columns
    ]
    return table.sort_values(order, kind="stable", na_position="last").reset_index(drop=True)


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


def _md_table(headers: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return out


def _spread(cell: Mapping[Any, Any], metric: str) -> str:
    text = _fmt(cell.get(metric), "int")
    cv = cell.get(f"{metric}_cv")
    if (
        cell.get("repeats_ok", 0) > 1
        and cv is not None
        and not (isinstance(cv, float) and math.isnan(cv))
    ):
        text += f" ±{100 * cv:.1f}%"
    return text


def _gib(value: float) -> str:
    """GiB to one decimal, without a trailing ``.0`` (``80``, ``79.3``)."""
    text = f"{value / GIB:.1f}"
    return text.removesuffix(".0")


def status_text(cell: Mapping[Any, Any], capacity: Capacity | None) -> str:
    """A cell's status for reading: a failed cell without metrics says what its memory shows."""
    status = str(cell.get("status"))
    memory = cell.get("failed_peak_memory_bytes")
    if memory is None or (isinstance(memory, float) and math.isnan(memory)):
        return status
    if cell.get("likely_oom") and capacity is not None:
        return f"no metrics (likely OOM: {_gib(memory)} of {_gib(capacity.bytes)} GiB)"
    on_gpu = str(cell.get("device")) != "cpu"
    if status == "failed" and on_gpu and (capacity is None or not capacity.gpu):
        return f"no metrics (memory reached {_gib(memory)} GiB; device capacity unknown)"
    return status


def status_counts(rows: pd.DataFrame) -> str:
    """``failed 39 (36 likely OOM), ok 85``: the rows' statuses, likely OOMs among the failed."""
    counts = rows["status"].value_counts().to_dict()
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


def _present(cells: pd.DataFrame, column: str) -> bool:
    return column in cells.columns and bool(
        pd.to_numeric(cells[column], errors="coerce").notna().any()
    )


def shows_hf_estimate(cells: pd.DataFrame) -> bool:
    """Whether some cell's only throughput figure is HF Trainer's estimate."""
    if not _present(cells, "train_tokens_per_second"):
        return False
    hf = pd.to_numeric(cells["train_tokens_per_second"], errors="coerce")
    measured = pd.to_numeric(cells["tokens_per_second_global"], errors="coerce")
    return bool((hf.notna() & measured.isna()).any())


#: the figure columns of summary.md: header, the cells' column, how a cell shows it
_FIGURES: tuple[tuple[str, str, Any], ...] = (
    ("tokens/s", "tokens_per_second_global", lambda c: _spread(c, "tokens_per_second_global")),
    (
        "tokens/s/GPU",
        "tokens_per_second_per_device",
        lambda c: _spread(c, "tokens_per_second_per_device"),
    ),
    (
        HF_ESTIMATE_HEADER,
        "train_tokens_per_second",
        lambda c: _fmt(c.get("train_tokens_per_second"), "int"),
    ),
    ("peak mem GiB", "peak_memory_bytes", lambda c: _fmt(c.get("peak_memory_bytes"), "gib")),
    ("MFU %", "mfu", lambda c: _fmt(c.get("mfu"), "pct")),
    (
        "$/1M tokens",
        "cost_per_1m_tokens_usd",
        lambda c: _fmt(c.get("cost_per_1m_tokens_usd"), "usd"),
    ),
    ("loss", "train_loss", lambda c: _fmt(c.get("train_loss"))),
)
#: key columns a scenario's table shows when they vary within it
_VARYING_KEYS = ("peft_method", "max_seq_len", "torch_dtype", "packing")


def summary_markdown(report: Report, source: Path, cost: CostSettings) -> str:
    rows, cells = report.rows, report.cells
    hf = shows_hf_estimate(cells)
    figures = [
        f
        for f in _FIGURES
        if (f[1] == "train_tokens_per_second" and hf)
        or (f[1] != "train_tokens_per_second" and _present(cells, f[1]))
    ]
    missing = [
        f[0] for f in _FIGURES if f[1] != "train_tokens_per_second" and not _present(cells, f[1])
    ]
    lines = [
        "# Benchmark summary",
        "",
        f"Source: `{source}` — {len(rows)} experiment(s) in {len(cells)} cell(s); "
        + status_counts(rows),
        "",
    ]
    if _present(cells, "tokens_per_second_global"):
        lines.append(
            "Tokens/s count real (non-padding) tokens over the measured steps (warm-up "
            "excluded), for all GPUs (global) and per GPU. "
        )
    else:
        lines.append("No cell has a measured tokens/s. ")
    lines[-1] += (
        "Peak memory is the first there is of: "
        + "; ".join(label for _, _, label in PEAK_MEMORY_SOURCES)
        + "."
    )
    if "peak_memory_source" in cells.columns and cells["peak_memory_source"].notna().any():
        sources = cells["peak_memory_source"].dropna().astype(str).value_counts()
        lines[-1] += (
            " Here: "
            + ", ".join(
                f"{source} ({n} cell{'s' if n > 1 else ''})" for source, n in sources.items()
            )
            + "."
        )
    lines[-1] += " With repeats, figures are medians (± the coefficient of variation)."
    if hf:
        lines += ["", HF_ESTIMATE_NOTE]
    if missing:
        lines += ["", f"Columns with no figure in any cell are left out: {', '.join(missing)}."]
    lines += _capacity_lines(report)
    args = config_columns(cells)
    order = [
        k
        for k in (
            "model_name_or_path",
            "framework_config",
            "num_gpus",
            "effective_batch_size",
            "per_device_train_batch_size",
        )
        if k in cells.columns
    ]
    for scenario, group in cells.groupby("scenario", sort=False):
        group = group.sort_values(order, kind="stable", key=lambda c: c.map(_sort_key))
        varying = [
            a
            for a in (*_VARYING_KEYS, *args)
            if a in group.columns and group[a].astype(str).nunique() > 1
        ]
        headers = [
            "model",
            "framework",
            "GPUs",
            "batch/dev × accum",
            *varying,
            *[f[0] for f in figures],
            "status",
        ]
        body = []
        for c in group.to_dict("records"):
            model = str(c.get("model_name_or_path"))
            body.append(
                [
                    model,
                    str(c.get("framework_config")),
                    _fmt(c.get("num_gpus"), "int"),
                    f"{_fmt(c.get('per_device_train_batch_size'), 'int')} × {_fmt(c.get('gradient_accumulation_steps'), 'int')}",
                    *[_fmt(c.get(a)) for a in varying],
                    *[f[2](c) for f in figures],
                    status_text(c, report.capacity),
                ]
            )
        lines += ["", f"## {str(scenario) or '(no scenario)'}", "", *_md_table(headers, body)]
        problems = group[~group["status"].isin(["ok"])]
        if len(problems):
            lines += ["", "Not ok:"]
            for c in problems.to_dict("records"):
                where = f" (log: `{c['log']}`)" if c.get("log") else ""
                lines.append(
                    f"- {c['status']}: {c.get('model_name_or_path')}, {c.get('framework_config')}, {_fmt(c.get('num_gpus'), 'int')} GPU(s): {c.get('error') or 'no error recorded'}{where}"
                )
    lines += scaling_markdown(report.scaling)
    lines += cost_markdown(cells, cost)
    if report.plot_notes:
        lines += ["", "## Plots", "", *[f"- {n}" for n in report.plot_notes]]
    if report.notes:
        lines += ["", "## Notes", "", *[f"- {n}" for n in report.notes]]
    return "\n".join(lines) + "\n"


def _capacity_lines(report: Report) -> list[str]:
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
        text = f"Device memory: {_gib(capacity.bytes)} GiB, {capacity.source}."
        if failed_with_memory:
            text += (
                f" A failed run without metrics whose memory reached ≥ "
                f"{100 * LIKELY_OOM_FRACTION:.0f}% of it "
                f"({_gib(LIKELY_OOM_FRACTION * capacity.bytes)} GiB) is shown as likely OOM: "
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


def _family_title(row: Mapping[Any, Any], keys: list[str], varying: list[str]) -> str:
    parts = []
    for k in keys:
        value = row.get(k)
        if str(value) in ("", "none", "nan", "None"):
            continue
        if k == "effective_batch_size":
            parts.append(f"eb {_fmt(value, 'int')}")
        elif k == "max_seq_len":
            parts.append(f"seq {_fmt(value, 'int')}")
        elif k in ("scenario", "model_name_or_path", "peft_method"):
            parts.append(str(value))
        elif k in varying:
            parts.append(f"{k}={_fmt(value)}")
    return " · ".join(parts)


def scaling_markdown(table: pd.DataFrame) -> list[str]:
    if table.empty:
        return []
    lines = [
        "",
        "## Scaling",
        "",
        "Throughput relative to the smallest GPU count of each family (the same effective "
        "batch split over more GPUs); in brackets, the scaling efficiency (speedup over the "
        "ideal). One column per framework.",
    ]
    keys = [k for k in scaling_keys(table) if k != "framework_config"]
    varying = [k for k in keys if table[k].map(str).nunique() > 1]
    titles: dict[tuple[str, ...], str] = {}
    frameworks: dict[tuple[str, ...], list[str]] = {}
    cells: dict[tuple[str, ...], dict[int, dict[str, str]]] = {}
    for row in table.to_dict("records"):
        key = tuple(str(row[k]) for k in keys)
        titles.setdefault(key, _family_title(row, keys, varying))
        fw = str(row.get("framework_config"))
        if fw not in frameworks.setdefault(key, []):
            frameworks[key].append(fw)
        text = f"{row['speedup']:.2f} ({100 * row['scaling_efficiency']:.0f}%)"
        cells.setdefault(key, {}).setdefault(int(row["num_gpus"]), {}).setdefault(fw, text)
    for key, by_gpus in cells.items():
        fws = frameworks[key]
        body = [[str(g), *[by_gpus[g].get(fw, "–") for fw in fws]] for g in sorted(by_gpus)]
        lines += ["", f"### {titles[key]}", "", *_md_table(["GPUs", *fws], body)]
    return lines


def cost_markdown(cells: pd.DataFrame, cost: CostSettings) -> list[str]:
    if cost.usd_per_gpu_hour is None and not cost.tokens:
        return []
    ok = cells[cells["tokens_per_second_global"].notna()]
    if ok.empty:
        return []
    headers = ["scenario", "model", "framework", "GPUs", "tokens/s"]
    if cost.usd_per_gpu_hour is not None:
        headers += ["$/1M tokens", "$ per run"]
    headers += ["time per epoch"]
    if cost.usd_per_gpu_hour is not None:
        headers += ["$ per epoch"]
    if cost.tokens:
        headers += [f"time for {cost.tokens:,.0f} tokens"]
        if cost.usd_per_gpu_hour is not None:
            headers += [f"$ for {cost.tokens:,.0f} tokens"]
    body = []
    for c in ok.to_dict("records"):
        row = [
            str(c["scenario"]),
            str(c["model_name_or_path"]),
            str(c["framework_config"]),
            _fmt(c["num_gpus"], "int"),
            _fmt(c["tokens_per_second_global"], "int"),
        ]
        if cost.usd_per_gpu_hour is not None:
            row += [
                _fmt(c.get("cost_per_1m_tokens_usd"), "usd"),
                _fmt(c.get("cost_per_run_usd"), "usd"),
            ]
        row += [_fmt(c.get("time_per_epoch_s"), "time")]
        if cost.usd_per_gpu_hour is not None:
            row += [_fmt(c.get("cost_per_epoch_usd"), "usd")]
        if cost.tokens:
            row += [_fmt(c.get("time_to_train_s"), "time")]
            if cost.usd_per_gpu_hour is not None:
                row += [_fmt(c.get("cost_to_train_usd"), "usd")]
        body.append(row)
    price = (
        f"${cost.usd_per_gpu_hour:g} per GPU-hour"
        if cost.usd_per_gpu_hour is not None
        else "no price set"
    )
    return [
        "",
        "## Cost and time to train",
        "",
        f"At {price}; an epoch is one pass over the prepared dataset of the run. Estimates "
        "extrapolate the measured steady-state throughput.",
        "",
        *_md_table(headers, body),
    ]


def cost_from_env(root: Path) -> float | None:
    """The price a run recorded in its env.json (from the scenarios file's ``cost:``)."""
    env = envinfo.read(root)
    if env is None:
        return None
    value = (env.get("cost") or {}).get("usd_per_gpu_hour")
    return float(value) if isinstance(value, (int, float)) else None


def capacity_from_env(source: Path, cells: pd.DataFrame) -> Capacity | None:
    """The memory of one device of the run: a GPU's, or the machine's for CPU runs."""
    env = envinfo.read(source) if source.is_dir() else None
    if env is None:
        return None
    devices = (env.get("gpus") or {}).get("devices") or []
    on_gpu = "device" in cells.columns and (cells["device"].astype(str) == "gpu").any()
    if on_gpu and devices:
        name = devices[0].get("name") or "the GPU"
        return Capacity(float(devices[0]["memory_bytes"]), f"{name}, from env.json")
    memory = (env.get("cpu") or {}).get("memory_bytes")
    if memory and not on_gpu:
        return Capacity(float(memory), "the machine's memory, from env.json", gpu=False)
    return None


def known_gpu_memory(text: str) -> tuple[float, str] | None:
    """The nominal memory and name of a GPU named in ``text`` (``a100_80gb`` -> 80 GiB)."""
    lowered = text.lower()
    for pattern, memory, name in KNOWN_GPU_MEMORY:
        if re.search(pattern, lowered):
            return memory, name
    return None


def resolve_capacity(
    source: Path, rows: pd.DataFrame, gpu_memory_bytes: float | None = None
) -> Capacity | None:
    """A device's memory: given, else the run's env.json, else a GPU named in the rows'
    ``gpu_device_name`` (all alike), else one named in the file or folder name."""
    if gpu_memory_bytes is not None:
        return Capacity(float(gpu_memory_bytes), "given with --gpu-memory-gib")
    from_env = capacity_from_env(source, rows)
    if from_env is not None:
        return from_env
    if "gpu_device_name" in rows.columns:
        names = sorted({str(n) for n in rows["gpu_device_name"].dropna() if str(n).strip()})
        first = known_gpu_memory(names[0]) if names else None
        if first is not None and all(known_gpu_memory(n) == first for n in names):
            return Capacity(
                first[0],
                f"nominal for the {first[1]} (from the rows' gpu_device_name {names[0]!r})",
            )
    found = known_gpu_memory(source.name)
    if found is not None:
        return Capacity(
            found[0], f"nominal for the {found[1]} (from the file name `{source.name}`)"
        )
    return None


def mark_likely_oom(table: pd.DataFrame, capacity: Capacity | None) -> pd.DataFrame:
    """``likely_oom`` and ``failed_peak_memory_bytes`` per row; likely OOMs say so in ``error``.

    ``failed_peak_memory_bytes``: the memory a run that did not finish and left none
    of ``RUN_FIGURES`` reached. Such a run is likely out of memory when it failed
    (a confirmed ``oom`` says so itself), ran on a GPU and its memory reached
    ``LIKELY_OOM_FRACTION`` of the device's.
    """
    table = table.copy()
    no_figures = pd.Series(True, index=table.index)
    for column in RUN_FIGURES:
        no_figures &= _num(table, column).isna()
    on_gpu = table["device"].astype(str) != "cpu"
    memory = _num(table, "peak_memory_bytes")
    unfinished = ~table["status"].isin(["ok", "skipped", "planned"]) & no_figures
    table["failed_peak_memory_bytes"] = memory.where(unfinished & memory.notna())
    candidate = unfinished & (table["status"] == "failed") & on_gpu & memory.notna()
    likely = pd.Series(False, index=table.index)
    if capacity is not None and capacity.gpu:
        likely = candidate & (memory >= LIKELY_OOM_FRACTION * capacity.bytes)
        note = [
            f"memory reached {_gib(m)} of {_gib(capacity.bytes)} GiB "
            f"(≥ {100 * LIKELY_OOM_FRACTION:.0f}%): likely out of memory"
            for m in memory[likely]
        ]
        errors = table.loc[likely, "error"].astype(object)
        table.loc[likely, "error"] = [
            f"{e}; {n}" if isinstance(e, str) and e else n
            for e, n in zip(errors, note, strict=True)
        ]
    table["likely_oom"] = likely
    return table


def _cells_likely_oom(cells: pd.DataFrame, table: pd.DataFrame) -> pd.DataFrame:
    """A cell is likely OOM when it failed and every repeat is; its memory, the largest."""
    if cells.empty:
        return cells
    by_cell = table.groupby("cell_id", sort=False)
    likely = by_cell["likely_oom"].all()
    memory = by_cell["failed_peak_memory_bytes"].max()
    cells = cells.copy()
    ids = cells["cell_id"]
    cells["likely_oom"] = (ids.map(likely).fillna(False).astype(bool)) & (
        cells["status"] == "failed"
    )
    reached = ids.map(memory)
    cells["failed_peak_memory_bytes"] = reached.astype(object).where(reached.notna(), None)
    return cells


#: columns the report adds to each raw row
DERIVED_COLUMNS = (
    "peak_memory_bytes",
    "peak_memory_source",
    "usd_per_gpu_hour",
    "cost_per_1m_tokens_usd",
    "cost_per_run_usd",
    "time_per_epoch_s",
    "cost_per_epoch_usd",
    "time_to_train_s",
    "cost_to_train_usd",
)


def build_report(
    source: Path,
    cost: CostSettings,
    rows: list[dict[str, Any]] | None = None,
    *,
    gpu_memory_bytes: float | None = None,
) -> Report:
    """The report of ``source``; ``rows`` (a run's own) replace what is read from disk.

    ``gpu_memory_bytes``: one device's memory, when the source does not say it.
    """
    if rows is None:
        rows, predecessor = collect.raw_rows(source)
    else:
        predecessor = False
    table = add_derived(collect.normalise(pd.DataFrame(rows), predecessor=predecessor), cost)
    capacity = resolve_capacity(source, table, gpu_memory_bytes)
    table = mark_likely_oom(table, capacity)
    cells = _cells_likely_oom(aggregate(table), table)
    report = Report(rows=table, cells=cells, scaling=scaling(cells), capacity=capacity)
    report.raw = _raw_with_derived(rows, table)
    return report


def _raw_with_derived(rows: list[dict[str, Any]], table: pd.DataFrame) -> list[dict[str, Any]]:
    """The rows as read (their own number formats), plus status and the derived columns."""
    out = []
    extra = table[[c for c in ("status", "error", *DERIVED_COLUMNS) if c in table.columns]]
    for row, derived in zip(rows, extra.to_dict("records"), strict=True):
        merged = dict(row)
        for key, value in derived.items():
            if value is not None and not (isinstance(value, float) and math.isnan(value)):
                merged[key] = value
        out.append(merged)
    return out


def write_report(
    source: Path,
    output: Path,
    cost: CostSettings,
    *,
    plots: bool = True,
    gpu_memory_bytes: float | None = None,
    rows: list[dict[str, Any]] | None = None,
) -> Report:
    """Read ``source`` (or take a run's ``rows``), write the tables and plots into ``output``.

    ``gpu_memory_bytes``: one device's memory, when the source does not say it.
    """
    report = build_report(source, cost, rows, gpu_memory_bytes=gpu_memory_bytes)
    output.mkdir(parents=True, exist_ok=True)
    raw = output / "raw_summary.csv"
    write_atomic(raw, to_csv(report.raw))
    bench = output / "benchmarks.csv"
    write_atomic(bench, benchmarks_table(report.cells).to_csv(index=False))
    if not report.scaling.empty:
        write_atomic(output / "scaling.csv", report.scaling.to_csv(index=False))
        report.written.append(output / "scaling.csv")
    md = output / "summary.md"
    if plots:
        from orchestrator.results import plots as plotting

        report.written += plotting.write_all(report, output / "plots", source=source)
    write_atomic(md, summary_markdown(report, source, cost))
    report.written = [raw, bench, md, *report.written]
    return report
