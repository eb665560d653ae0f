"""The report's tables: derived columns, cells (repeats aggregated), scaling.

Repeats of a cell aggregate as their columns declare (``Column.aggregate`` in
``orchestrator.contract.columns``): the main figures to the median with the
coefficient of variation and the min/max, the others to the median. A cell's
status is its repeats' status, or the mix (``ok×2 oom×1``). Failed cells stay
in every table.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import pandas as pd

from orchestrator.contract import columns as registry
from orchestrator.contract.columns import (
    CO2_PER_1M_TOKENS,
    COST_PER_1M_TOKENS,
    COST_PER_EPOCH,
    COST_PER_RUN,
    COST_TO_TRAIN,
    DATA_TOKENS,
    ENERGY_COST_PER_1M_TOKENS,
    ENERGY_DEVICES,
    ENERGY_J,
    ENERGY_NOTE,
    ENERGY_PER_SAMPLE,
    ENERGY_PER_TOKEN,
    ENERGY_SOURCE,
    ENERGY_WINDOW,
    HF_TOKENS_PER_SECOND,
    JOB_S,
    KWH_PER_1M_TOKENS,
    NVML_PEAK,
    PEAK_MEMORY,
    PEAK_MEMORY_SOURCE,
    PROCESS_RSS_PEAK,
    SAMPLES_MEASURED,
    TIME_PER_EPOCH,
    TIME_TO_TRAIN,
    TOKENS_MEASURED,
    TOKENS_PER_SECOND,
    TORCH_RESERVED_PEAK,
    TRAIN_RUNTIME,
    USD_PER_GPU_HOUR,
)
from orchestrator.contract.window import WINDOW_MEASURED
from orchestrator.results.capacity import Capacity
from orchestrator.results.runrecords import RunRecords
from orchestrator.results.tablecolumns import (
    REPORT_ONLY_COLUMNS,
    config_columns,
    is_output,
    measured,
    numeric,
    other_outputs,
    shown_status,
)

MIB = 2**20

#: where the peak memory of a row comes from, first present wins
PEAK_MEMORY_SOURCES = (
    (NVML_PEAK, 1, "NVML peak over the job's GPUs"),
    (TORCH_RESERVED_PEAK, 1, "torch reserved, largest rank"),
    ("mem_peak_torch_mem_alloc_in_bytes", 1, "HF stage metrics"),
    ("mem_nvidia_mem_reserved", MIB, "NVML, mean over GPUs"),
    (PROCESS_RSS_PEAK, 1, "resident memory of a training process"),
)
#: the order of the median figures in a cell (``benchmarks.csv``), after the spread
#: ones; a median figure not named here follows these, in the registry's order
FIGURE_ORDER = registry.with_role("cell_figure")


@dataclass(frozen=True)
class CostSettings:
    usd_per_gpu_hour: float | None = None
    #: a token budget to estimate the time and cost to train
    tokens: float | None = None
    #: the user's price of a kWh and grams of CO2 per kWh: the energy's cost and emissions
    usd_per_kwh: float | None = None
    grams_co2_per_kwh: float | None = None


class ReportTables(Protocol):
    """What the summary and the plots read of a report (``orchestrator.results.report.Report``)."""

    rows: pd.DataFrame
    cells: pd.DataFrame
    scaling: pd.DataFrame
    #: the memory of a device, when known (likely-OOM, memory plot)
    capacity: Capacity | None
    notes: list[str]
    #: one line per plot: what it shows, or why it was not drawn
    plot_notes: list[str]
    #: what the read kept of each run (runrecords; None: read from the folder when asked)
    runs: RunRecords | None
    #: one line per run file the read could not read (``collect.rows_from_folder``)
    warnings: list[str]


# ---------------------------------------------------------------------------
# Which columns a cell has
# ---------------------------------------------------------------------------


def cell_keys() -> list[str]:
    """What a cell is, besides its id: the key columns its repeats share."""
    return [c.name for c in registry.select(key=True, aggregate="first")]


def spread_figures() -> list[str]:
    """The main figures: median, coefficient of variation, min and max over repeats."""
    return [c.name for c in registry.select(aggregate="spread")]


def cell_figures() -> list[str]:
    """Every figure a cell has, in order: the spread ones, then the medians
    (``FIGURE_ORDER``, then the registry's order)."""
    medians = [c.name for c in registry.select(aggregate="median")]
    ordered = [m for m in FIGURE_ORDER if m in medians]
    return spread_figures() + ordered + [m for m in medians if m not in ordered]


def has_figures(cells: pd.DataFrame, column: str) -> bool:
    """Whether some cell has a number in ``column``."""
    return column in cells.columns and bool(
        pd.to_numeric(cells[column], errors="coerce").notna().any()
    )


def shows_hf_estimate(cells: pd.DataFrame) -> bool:
    """Whether some cell's only throughput figure is HF Trainer's estimate."""
    if not has_figures(cells, HF_TOKENS_PER_SECOND):
        return False
    hf = pd.to_numeric(cells[HF_TOKENS_PER_SECOND], errors="coerce")
    measured = pd.to_numeric(cells[TOKENS_PER_SECOND], errors="coerce")
    return bool((hf.notna() & measured.isna()).any())


# ---------------------------------------------------------------------------
# Derived columns
# ---------------------------------------------------------------------------


def add_derived(df: pd.DataFrame, cost: CostSettings) -> pd.DataFrame:
    """Peak memory (with its source), cost and time-to-train columns (each declared
    in the registry with source ``derived``)."""
    df = df.copy()
    peak = pd.Series([math.nan] * len(df), index=df.index, dtype=float)
    source = pd.Series([None] * len(df), index=df.index, dtype=object)
    for column, scale, label in PEAK_MEMORY_SOURCES:
        values = numeric(df, column) * scale
        take = peak.isna() & values.notna() & (values > 0)
        peak[take] = values[take]
        source[take] = label
    df[PEAK_MEMORY] = peak
    df[PEAK_MEMORY_SOURCE] = source

    tps = numeric(df, TOKENS_PER_SECOND)
    gpus = numeric(df, "num_gpus")
    price = cost.usd_per_gpu_hour
    if price is not None:
        df[USD_PER_GPU_HOUR] = price
        df[COST_PER_1M_TOKENS] = price * gpus / 3600 / tps * 1e6
        seconds = numeric(df, JOB_S).fillna(numeric(df, TRAIN_RUNTIME))
        df[COST_PER_RUN] = price * gpus * seconds / 3600
    epoch = numeric(df, DATA_TOKENS)
    df[TIME_PER_EPOCH] = epoch / tps
    if price is not None:
        df[COST_PER_EPOCH] = df[TIME_PER_EPOCH] * gpus * price / 3600
    if cost.tokens:
        df[TIME_TO_TRAIN] = cost.tokens / tps
        if price is not None:
            df[COST_TO_TRAIN] = df[TIME_TO_TRAIN] * gpus * price / 3600
    return add_energy(df, cost)


#: joules in a kWh
J_PER_KWH = 3.6e6


def add_energy(df: pd.DataFrame, cost: CostSettings) -> pd.DataFrame:
    """Energy per token and per sample, kWh per 1M tokens and, with the user's numbers,
    their cost and emissions (``orchestrator.job.energy`` measured the energy).

    Only where the energy covers the measured steps (the tokens/s window) and the
    devices the cell ran on: energy over another window, RAPL's on a GPU cell, another
    number of GPUs than the cell's, a CPU cell packed beside others (RAPL counts the
    whole package) or no tokens measured give none, and ``energy_note`` says why (a
    multi-node job has no energy total to begin with: ``energy.of_first_node``).
    """
    energy = numeric(df, ENERGY_J)
    has = energy.notna() & (energy > 0)
    window = df[ENERGY_WINDOW] if ENERGY_WINDOW in df.columns else pd.Series(None, df.index)
    note = (
        df[ENERGY_NOTE].astype(object)
        if ENERGY_NOTE in df.columns
        else pd.Series(None, index=df.index, dtype=object)
    )
    # a table without the column (an older one, the predecessor's): no such rows
    absent = pd.Series(False, index=df.index)
    cpu = df["device"].astype(str).eq("cpu") if "device" in df.columns else absent
    devices = numeric(df, ENERGY_DEVICES)
    packed = df["run_mode"].astype(str).eq("packed") if "run_mode" in df.columns else absent
    rapl = (
        df[ENERGY_SOURCE].astype(str).str.startswith("rapl")
        if ENERGY_SOURCE in df.columns
        else absent
    )
    tokens = numeric(df, TOKENS_MEASURED)
    refusals = (
        (has & window.ne(WINDOW_MEASURED), "energy over the training, not the measured steps"),
        (has & ~cpu & rapl, "the CPU packages' energy (RAPL), not the GPUs' the cell ran on"),
        (
            has & ~cpu & ~rapl & devices.ne(numeric(df, "num_gpus")),
            "energy of another number of GPUs than the cell ran on",
        ),
        (has & cpu & packed, "RAPL counts the whole CPU package, which packed jobs shared"),
        (has & ~(tokens > 0), "no tokens measured"),
    )
    usable = has.copy()
    for refused, why in refusals:
        usable &= ~refused
        note = note.where(~refused, "no energy per token: " + why)
    if has.any():
        df[ENERGY_NOTE] = note
    per_token = (energy / tokens).where(usable)
    df[ENERGY_PER_TOKEN] = per_token
    df[ENERGY_PER_SAMPLE] = (energy / numeric(df, SAMPLES_MEASURED)).where(usable)
    df[KWH_PER_1M_TOKENS] = per_token * 1e6 / J_PER_KWH
    if cost.usd_per_kwh is not None:
        df[ENERGY_COST_PER_1M_TOKENS] = df[KWH_PER_1M_TOKENS] * cost.usd_per_kwh
    if cost.grams_co2_per_kwh is not None:
        df[CO2_PER_1M_TOKENS] = df[KWH_PER_1M_TOKENS] * cost.grams_co2_per_kwh
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


def aggregate(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per cell: medians over the ok repeats, spread of the main figures.

    Vectorised over all cells at once (a Python loop per cell takes minutes for
    10,000 experiments).
    """
    if rows.empty:
        return pd.DataFrame()
    args = config_columns(rows)
    by_cell = rows.groupby("cell_id", sort=False, dropna=False)
    keys = [k for k in (*cell_keys(), *args) if k in rows.columns]
    cells = by_cell[keys].first() if keys else pd.DataFrame(index=by_cell.size().index)
    cells["repeats"] = by_cell.size()
    status = shown_status(rows)  # skipped on resume: ok; pruned: pruned, never ok
    # one status per cell; the mix of them (``oom×1 pruned×1``) only where repeats differ
    by_status = status.groupby(rows["cell_id"], sort=False)
    mixed = by_status.first()
    differ = by_status.nunique()
    differ = differ.index[differ > 1]
    if len(differ):
        apart = rows["cell_id"].isin(differ)
        mixes = status[apart].groupby(rows["cell_id"][apart], sort=False)
        mixed.loc[differ] = mixes.agg(lambda s: _status_mix(list(s))).reindex(differ)
    cells["status"] = mixed
    errors = rows["error"].where(rows["error"].astype(str).str.len() > 0)
    cells["error"] = errors.groupby(rows["cell_id"], sort=False).first()
    if "log" in rows.columns:
        cells["log"] = (
            rows["log"].groupby(rows["cell_id"], sort=False).first().where(cells["error"].notna())
        )
    ok = rows[measured(rows)]
    cells["repeats_ok"] = (
        ok.groupby("cell_id", sort=False).size().reindex(cells.index, fill_value=0)
    )
    figures = [m for m in cell_figures() if m in rows.columns]
    # outputs we declare nothing for: numbers to the median of the ok repeats, as ours;
    # text (the predecessor's error messages, output folders) as the first repeat has it
    others = other_outputs(rows)
    numeric_others = [c for c in others if pd.api.types.is_numeric_dtype(rows[c])]
    figures += numeric_others
    text = [c for c in others if c not in numeric_others]
    if text:
        firsts = by_cell[text].first()
        for column in text:
            cells[column] = firsts[column]
    values = ok[figures].apply(pd.to_numeric, errors="coerce")
    # the new columns are gathered and joined once (one insert each fragments the frame);
    # a name the frame has is set in place, so the order is as if each were assigned
    added: dict[str, pd.Series] = {}

    def put(name: str, column: pd.Series) -> None:
        if name in cells.columns:
            cells[name] = column
        else:
            added[name] = column

    grouped = values.groupby(ok["cell_id"], sort=False)
    medians = grouped.median().reindex(cells.index)
    for figure in figures:
        put(figure, medians[figure])
    main = spread_figures()
    spread = [m for m in main if m in values.columns]
    if spread:
        count = grouped[spread].count().reindex(cells.index)
        mean = grouped[spread].mean().reindex(cells.index)
        # the sample standard deviation (ddof=1): repeats are a sample of the run-to-run spread
        std = grouped[spread].std(ddof=1).reindex(cells.index)
        lo = grouped[spread].min().reindex(cells.index)
        hi = grouped[spread].max().reindex(cells.index)
        for metric in spread:
            cv = std[metric] / mean[metric].abs()
            put(f"{metric}_cv", cv.where((count[metric] >= 2) & (mean[metric] != 0)))
            put(f"{metric}_min", lo[metric])
            put(f"{metric}_max", hi[metric])
    for metric in main:  # always present, so tables and plots can rely on them
        for column in (metric, f"{metric}_cv", f"{metric}_min", f"{metric}_max"):
            if column not in cells.columns and column not in added:
                put(column, pd.Series(math.nan, index=cells.index))
    for name in [c.name for c in registry.select(aggregate="first_ok")]:
        if name in ok.columns:
            put(name, ok[name].groupby(ok["cell_id"], sort=False).first().reindex(cells.index))
    for name in [c.name for c in registry.select(aggregate="first", key=False)]:
        if name in rows.columns:
            put(name, by_cell[name].first())
    if added:
        cells = pd.concat([cells, pd.DataFrame(added, index=cells.index)], axis=1)
    cells = cells.reset_index()
    return cells.astype(object).where(cells.notna(), None)


def benchmarks_table(cells: pd.DataFrame) -> pd.DataFrame:
    """Cells for reading: keys kept, settings constant across all cells dropped, sorted.

    A measured figure is kept whenever some cell has it, even when every cell
    has the same value (one cell alone has every figure constant).
    """
    if cells.empty:
        return cells
    keep = set(cell_keys()) | {"status", "cell_id", "repeats"}
    cells = cells.drop(columns=[c for c in REPORT_ONLY_COLUMNS if c in cells.columns])
    constant = [
        c
        for c in cells.columns
        if c not in keep
        and not (is_output(c) and cells[c].notna().any())
        and cells[c].astype(str).nunique(dropna=False) <= 1
    ]
    table = cells.drop(columns=constant)
    order = [k for k in registry.with_role("sort") if k in table.columns]
    return table.sort_values(order, kind="stable", na_position="last").reset_index(drop=True)


# ---------------------------------------------------------------------------
# Scaling
# ---------------------------------------------------------------------------

#: what a scaling series' cells share: everything but the GPU count (and the batch)
SCALING_SERIES = registry.with_role("series")


#: the columns ``scaling`` adds to a series' keys
SCALING_FIGURES = ("num_gpus", "base_num_gpus", TOKENS_PER_SECOND, "speedup", "scaling_efficiency")


def scaling_keys(cells: pd.DataFrame) -> list[str]:
    """What defines a series: everything but the GPU count (and the per-device batch)."""
    return [k for k in SCALING_SERIES if k in cells.columns] + [
        c for c in config_columns(cells) if c in cells.columns and c not in SCALING_FIGURES
    ]


def scaling(cells: pd.DataFrame) -> pd.DataFrame:
    """Speedup and efficiency of each scaling series against its smallest GPU count.

    A series is a cell with everything but the GPU count (and so the per-device
    batch) fixed; the effective batch stays the same across counts.
    """
    if cells.empty:
        return pd.DataFrame()
    keys = scaling_keys(cells)
    usable = cells.copy()
    usable[TOKENS_PER_SECOND] = pd.to_numeric(usable[TOKENS_PER_SECOND], errors="coerce")
    usable["num_gpus"] = pd.to_numeric(usable["num_gpus"], errors="coerce")
    usable = usable[usable[TOKENS_PER_SECOND].notna() & usable["num_gpus"].notna()]
    if usable.empty:
        return pd.DataFrame()
    # series group on text, so that missing values group like any other
    labels = usable[keys].map(str)
    group_cols = [f"_series{i}" for i in range(len(keys))]
    usable = usable.assign(**{c: labels[k] for c, k in zip(group_cols, keys, strict=True)})
    usable = usable.sort_values([*group_cols, "num_gpus"], kind="stable")
    grouped = usable.groupby(group_cols, sort=False)
    usable = usable[grouped["num_gpus"].transform("nunique") >= 2]
    if usable.empty:
        return pd.DataFrame()
    grouped = usable.groupby(group_cols, sort=False)
    base_tps = grouped[TOKENS_PER_SECOND].transform("first")
    base_n = grouped["num_gpus"].transform("first")
    table = usable[keys].copy()
    table["num_gpus"] = usable["num_gpus"].astype(int)
    table["base_num_gpus"] = base_n.astype(int)
    table[TOKENS_PER_SECOND] = usable[TOKENS_PER_SECOND]
    table["speedup"] = usable[TOKENS_PER_SECOND] / base_tps
    table["scaling_efficiency"] = table["speedup"] / (usable["num_gpus"] / base_n)
    return table.reset_index(drop=True)
