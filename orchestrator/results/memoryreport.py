"""summary.md's section on what shapes memory: the settings besides a cell's keys that
decide its peak (the loss, the attention, activation checkpointing's mode, the dtypes of
weights, gradients and optimizer states, the optimizer), read by each run from its own
trained objects (``trainer_entry/results/memoryshape.py``).

Two cells of one model at the same tokens/s can peak at 12 GB and 34 GB because one
trainer computes its loss from the full fp32 logits and the other never builds them;
nothing else in their rows says so. Where the cells differ in one of these settings the
section lists each cell's, and for each model whose cells peak apart, names what of
these tells the fullest and the leanest apart. Where every cell agrees it says nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import pandas as pd

from orchestrator.contract import columns as registry
from orchestrator.contract.columns import (
    ATTENTION_LOADED,
    CHECKPOINTING_MODE,
    GRADIENTS_DTYPE,
    LOSS_IMPLEMENTATION,
    MEMORY_SHAPE,
    OPTIMIZER,
    OPTIMIZER_STATES_DTYPE,
    PEAK_MEMORY,
    PEAK_MEMORY_SOURCE,
    WEIGHTS_DTYPE,
)
from orchestrator.results.capacity import GIB
from orchestrator.results.mdtable import md_table
from orchestrator.results.tablecolumns import numeric

#: each setting as the section names it
NAMES: Mapping[str, str] = {
    LOSS_IMPLEMENTATION: "loss implementation",
    ATTENTION_LOADED: "attention",
    CHECKPOINTING_MODE: "checkpointing mode",
    WEIGHTS_DTYPE: "weights dtype",
    GRADIENTS_DTYPE: "gradients dtype",
    OPTIMIZER_STATES_DTYPE: "optimizer states dtype",
    OPTIMIZER: "optimizer",
}
#: a setting a run that recorded the others leaves empty where it was off
OFF = {CHECKPOINTING_MODE: "off"}
#: the settings the runs record themselves: a cell with none of them recorded nothing
#: (a failed run, a result written before they existed)
_RECORDED = [name for name in MEMORY_SHAPE if name not in OFF]
_CELL = "cell"
#: peaks closer than this share of the larger are not told apart
PEAK_GAP = 0.05
#: the keys the table shows where its cells differ in them, and the closing sentence
#: names where the two cells it compares do
_KEYS = (
    *registry.with_role("varying"),
    "framework_config",
    "num_gpus",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "effective_batch_size",
)


def _text(values: pd.Series) -> pd.Series:
    """A column's values as text, empty where missing."""
    return cast(pd.Series, values.astype(object).where(values.notna(), "").astype(str).str.strip())


def _settings(cells: pd.DataFrame) -> pd.DataFrame:
    """The memory settings of the cells that recorded them, as text."""
    present = [name for name in MEMORY_SHAPE if name in cells.columns]
    recorded_by = [name for name in _RECORDED if name in present]
    recorded = (
        cells[recorded_by].notna().any(axis=1)
        if recorded_by
        else pd.Series(False, index=cells.index)
    )
    settings: pd.DataFrame = pd.DataFrame(
        {name: _text(cells.loc[recorded, name]) for name in present},
        index=cells.index[recorded],
        columns=present,
    )
    for name, off in OFF.items():
        if name in settings.columns:
            settings[name] = settings[name].where(settings[name] != "", off)
    return settings


def _keys(cells: pd.DataFrame) -> list[str]:
    """The key columns of ``cells`` that tell cells apart where memory is concerned."""
    return [k for k in _KEYS if k in cells.columns]


def _peak(value: float) -> str:
    """A peak in GiB as the scenario tables show it."""
    return f"{value / GIB:.2f}"


def _differ(
    a: Mapping[str, Any], b: Mapping[str, Any], names: list[str], *, both: bool = True
) -> list[str]:
    """Which of ``names`` two cells have apart (``both``: only those both recorded)."""
    return [n for n in names if (not both or (a.get(n) and b.get(n))) and a.get(n) != b.get(n)]


def memory_shape_markdown(cells: pd.DataFrame) -> list[str]:
    """The section; nothing when every cell that recorded these settings agrees in them."""
    if cells.empty or "cell_id" not in cells.columns:
        return []
    settings = _settings(cells)
    differing = [n for n in settings.columns if settings[n][settings[n] != ""].nunique() > 1]
    if not differing:
        return []
    shown = cells.loc[settings.index]
    peak = numeric(shown, PEAK_MEMORY)
    # the keys the listed cells differ in, so that a reader knows which cell is which
    keys = [k for k in _keys(shown) if _text(shown[k]).nunique() > 1]
    # a column at a time: a row at a time took 0.7 s for 5,000 cells
    columns = [
        [f"`{cell}`" for cell in shown["cell_id"].astype(str)],
        *(_text(shown[k]).replace("", "none").tolist() for k in keys),
        [_peak(p) if pd.notna(p) else "–" for p in peak],
        *(settings[n].replace("", "–").tolist() for n in differing),
    ]
    body = [list(row) for row in zip(*columns, strict=True)]
    lines = [
        "",
        "## What shapes memory",
        "",
        "The cells differ in settings that decide their memory but that the tables above "
        "do not show, each read by the run from its own trained objects (raw_summary.csv's "
        + ", ".join(f"`{n}`" for n in differing)
        + "): whether the loss builds the full logits (and in fp32), the attention kernel, "
        "what activation checkpointing recomputes, the dtypes weights, gradients and "
        "optimizer states are kept in, and the optimizer. Each cell's:",
        "",
        *md_table(
            [_CELL, *keys, registry.get(PEAK_MEMORY).header, *(NAMES[n] for n in differing)],
            body,
        ),
        *_gaps(shown, settings, peak, differing),
    ]
    return lines


def _gaps(
    cells: pd.DataFrame, settings: pd.DataFrame, peak: pd.Series, differing: list[str]
) -> list[str]:
    """Per model (and peak memory source) whose cells peak apart: which of the settings,
    and which keys, the fullest and the leanest cell differ in."""
    frame = pd.DataFrame(
        {
            "peak": peak,
            "model": _text(cells.get("model_name_or_path", pd.Series("", cells.index))),
            "source": _text(cells.get(PEAK_MEMORY_SOURCE, pd.Series("", cells.index))),
        },
        index=cells.index,
    ).dropna(subset=["peak"])
    keys = _keys(cells)
    out: list[str] = []
    for (model, _), group in frame.groupby(["model", "source"], sort=False):
        if len(group) < 2:
            continue
        high, low = group["peak"].idxmax(), group["peak"].idxmin()
        top, bottom = group.at[high, "peak"], group.at[low, "peak"]
        if top <= 0 or (top - bottom) / top < PEAK_GAP:
            continue
        a, b = settings.loc[low].to_dict(), settings.loc[high].to_dict()
        apart = _differ(a, b, differing)
        names = (
            "they differ in " + "; ".join(f"{NAMES[n]} ({a[n]} vs {b[n]})" for n in apart) + "."
            if apart
            else "they differ in none of these settings."
        )
        ka = {k: _text(cells.loc[[low], k]).iloc[0] for k in keys}
        kb = {k: _text(cells.loc[[high], k]).iloc[0] for k in keys}
        also = _differ(ka, kb, keys, both=False)
        if also:
            keys_apart = ", ".join(f"{k} ({ka[k] or 'none'} vs {kb[k] or 'none'})" for k in also)
            names += f" They {'also ' if apart else ''}differ in {keys_apart}."
        lean, full = str(cells.at[low, "cell_id"]), str(cells.at[high, "cell_id"])
        out.append(
            f"- {model or 'the model'}: `{lean}` peaks {_peak(bottom)} GiB and `{full}` "
            f"{_peak(top)} GiB: {names}"
        )
    if not out:
        return []
    return [
        "",
        "Where a model's cells peak apart (by 5% or more, read from the same source), its "
        "leanest and fullest cell, and what of the above and of their keys they differ in "
        "(a difference, not a measured cause):",
        "",
        *out,
    ]
