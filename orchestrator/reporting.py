"""The report: the tables to decide from, scaling, cost and time to train.

Pure over files: it reads a results folder (or a summary CSV) and writes
``raw_summary.csv`` (rebuilt from the run folders), ``benchmarks.csv`` (one
row per cell, repeats aggregated, constant columns dropped), ``summary.md``
and ``plots/``. It needs pandas and matplotlib, never the training stack.

Repeats of a cell aggregate to the median, with the coefficient of variation
and the min/max of the main figures. A cell's status is its repeats' status,
or the mix (``ok×2 oom×1``). Failed cells stay in every table.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from orchestrator import collect, envinfo
from orchestrator.paths import write_atomic
from orchestrator.plan import KEY_COLUMNS
from orchestrator.summary import EXTRA_METRICS, METRIC_COLUMNS, OUTCOME_COLUMNS, to_csv

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


def argument_columns(df: pd.DataFrame) -> list[str]:
    """Columns that are scenario arguments (neither keys nor figures)."""
    known = set(KEY_COLUMNS) | set(METRIC_COLUMNS) | set(EXTRA_METRICS) | set(OUTCOME_COLUMNS)
    known |= set(MEDIAN_METRICS) | _AGGREGATE_COLUMNS
    return [c for c in df.columns if c not in known and not c.startswith("mem_")]


def aggregate(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per cell: medians over the ok repeats, spread of the main figures.

    Vectorised over all cells at once (a Python loop per cell takes minutes for
    10,000 experiments).
    """
    if rows.empty:
        return pd.DataFrame()
    args = argument_columns(rows)
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


def scaling_keys(cells: pd.DataFrame) -> list[str]:
    """What defines a family: everything but the GPU count (and the per-device batch)."""
    return [k for k in SCALING_FAMILY if k in cells.columns] + [
        c for c in argument_columns(cells) if c in cells.columns
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
    """Cells for reading: keys kept, columns constant across all cells dropped, sorted."""
    if cells.empty:
        return cells
    keep = set(CELL_KEYS) | {"status", "cell_id", "repeats"}
    constant = [
        c
        for c in cells.columns
        if c not in keep and cells[c].astype(str).nunique(dropna=False) <= 1
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


def summary_markdown(report: Report, source: Path, cost: CostSettings) -> str:
    rows, cells = report.rows, report.cells
    counts = rows["status"].value_counts().to_dict()
    lines = [
        "# Benchmark summary",
        "",
        f"Source: `{source}` — {len(rows)} experiment(s) in {len(cells)} cell(s); "
        + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())),
        "",
        "Tokens/s count real (non-padding) tokens over the measured steps (warm-up excluded), "
        "for all GPUs (global) and per GPU. Peak memory is the largest of the job's devices "
        "(NVML), else torch's reserved memory, else a training process's resident memory on "
        "the CPU. With repeats, figures are medians (± the coefficient of variation).",
    ]
    args = argument_columns(cells)
    order = [
        k
        for k in ("model_name_or_path", "framework_config", "num_gpus", "effective_batch_size")
        if k in cells.columns
    ]
    for scenario, group in cells.groupby("scenario", sort=False):
        group = group.sort_values(order, kind="stable", key=lambda c: c.map(_sort_key))
        varying = [a for a in args if a in group.columns and group[a].astype(str).nunique() > 1]
        headers = [
            "model",
            "framework",
            "GPUs",
            "batch/dev × accum",
            *varying,
            "tokens/s",
            "tokens/s/GPU",
            "peak mem GiB",
            "MFU %",
            "$/1M tokens",
            "loss",
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
                    _spread(c, "tokens_per_second_global"),
                    _spread(c, "tokens_per_second_per_device"),
                    _fmt(c.get("peak_memory_bytes"), "gib"),
                    _fmt(c.get("mfu"), "pct"),
                    _fmt(c.get("cost_per_1m_tokens_usd"), "usd"),
                    _fmt(c.get("train_loss")),
                    str(c.get("status")),
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
    if report.notes:
        lines += ["", "## Notes", "", *[f"- {n}" for n in report.notes]]
    return "\n".join(lines) + "\n"


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
            parts.append(f"{k}={value}")
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


def capacity_from_env(source: Path, cells: pd.DataFrame) -> float | None:
    """The memory of one device of the run: a GPU's, or the machine's for CPU runs."""
    env = envinfo.read(source)
    if env is None:
        return None
    devices = (env.get("gpus") or {}).get("devices") or []
    on_gpu = "device" in cells.columns and (cells["device"].astype(str) == "gpu").any()
    if on_gpu and devices:
        return float(devices[0]["memory_bytes"])
    memory = (env.get("cpu") or {}).get("memory_bytes")
    return float(memory) if memory and not on_gpu else None


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
    source: Path, cost: CostSettings, rows: list[dict[str, Any]] | None = None
) -> Report:
    """The report of ``source``; ``rows`` (a run's own) replace what is read from disk."""
    if rows is None:
        rows, predecessor = collect.raw_rows(source)
    else:
        predecessor = False
    table = add_derived(collect.normalise(pd.DataFrame(rows), predecessor=predecessor), cost)
    cells = aggregate(table)
    report = Report(rows=table, cells=cells, scaling=scaling(cells))
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
    capacity_bytes: float | None = None,
    rows: list[dict[str, Any]] | None = None,
) -> Report:
    """Read ``source`` (or take a run's ``rows``), write the tables and plots into ``output``."""
    report = build_report(source, cost, rows)
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
        from orchestrator import plots as plotting

        if capacity_bytes is None:
            capacity_bytes = capacity_from_env(source, report.cells)
        report.written += plotting.write_all(
            report, output / "plots", capacity_bytes=capacity_bytes, source=source
        )
    write_atomic(md, summary_markdown(report, source, cost))
    report.written = [raw, bench, md, *report.written]
    return report
