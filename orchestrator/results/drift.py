"""Whether throughput trends with a run's place in the plan's order (``position``).

A machine that warms up, throttles or fills its page cache over a run makes
later runs faster or slower. The plan's order counterbalances the variants of
a cell size (``orchestrator.matrix.order``: A B B A), so such a drift biases no
variant; this module says whether there was one. Two figures, both from
``tokens_per_second_global`` of the measured runs (ok, not pruned) that have a
position:

- per cell with at least ``MIN_CELL_RUNS`` measured runs, ``position_trend_pct``:
  the least-squares slope of tokens/s against position, as a percentage of
  the cell's median per ``PER_POSITIONS`` positions; the trend *exceeds its
  noise* when the slope's 95% interval (Student t, n − 2 degrees of freedom)
  excludes 0;
- over the whole run, the drift: each run's tokens/s over its cell's median,
  less 1, in %, regressed on position within cells (both centred on their
  cell's mean, so each cell's own speed drops out; cells with at least 2
  measured runs), slope in % per position with its 95% interval (Student t,
  N − C − 1 degrees of freedom for N runs in C cells).

``summary.md`` gets a short section only when the drift's interval excludes 0
or a cell's trend exceeds its noise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from orchestrator.contract.columns import TOKENS_PER_SECOND
from orchestrator.contract.steady import t975
from orchestrator.results.records import records
from orchestrator.results.tablecolumns import measured, numeric

FIGURE = TOKENS_PER_SECOND
#: the column of benchmarks.csv (a cell's trend), and its span in positions
TREND_COLUMN = "position_trend_pct"
PER_POSITIONS = 10
#: measured runs a cell needs for its own trend
MIN_CELL_RUNS = 3


@dataclass(frozen=True)
class Slope:
    """A least-squares slope with its 95% interval."""

    slope: float
    low: float
    high: float
    #: the runs it is made from, and the cells
    runs: int
    cells: int = 1

    @property
    def excludes_zero(self) -> bool:
        return self.low > 0 or self.high < 0


def _fit(x: pd.Series, y: pd.Series, dof: int) -> tuple[float, float] | None:
    """Slope and its standard error of ``y`` on ``x`` (both already centred); None
    when ``x`` does not vary or no degree of freedom is left."""
    sxx = float((x * x).sum())
    if sxx <= 0 or dof < 1:
        return None
    slope = float((x * y).sum()) / sxx
    residual = float(((y - slope * x) ** 2).sum())
    return slope, math.sqrt(residual / dof / sxx)


def _measured_runs(rows: pd.DataFrame) -> pd.DataFrame:
    """``cell_id``, ``position`` and the figure of every measured run that has both."""
    if rows.empty or "position" not in rows.columns:
        empty: pd.DataFrame = pd.DataFrame(columns=["cell_id", "position", "value"])
        return empty
    runs = pd.DataFrame(
        {
            "cell_id": rows["cell_id"],
            "position": numeric(rows, "position"),
            "value": numeric(rows, FIGURE),
        }
    )[measured(rows)]
    runs = runs.dropna()
    positive: pd.DataFrame = runs[runs["value"] > 0]
    return positive


def cell_trends(rows: pd.DataFrame) -> dict[str, Slope]:
    """Each cell's trend with position (% of its median per ``PER_POSITIONS``
    positions), for cells with at least ``MIN_CELL_RUNS`` measured runs."""
    out: dict[str, Slope] = {}
    for cell, runs in _measured_runs(rows).groupby("cell_id", sort=False):
        if len(runs) < MIN_CELL_RUNS:
            continue
        x = runs["position"] - runs["position"].mean()
        y = runs["value"] - runs["value"].mean()
        fit = _fit(x, y, len(runs) - 2)
        if fit is None:
            continue
        slope, se = fit
        scale = 100 * PER_POSITIONS / float(runs["value"].median())
        half = t975(len(runs) - 2) * se
        out[str(cell)] = Slope(
            slope * scale, (slope - half) * scale, (slope + half) * scale, len(runs)
        )
    return out


def run_drift(rows: pd.DataFrame) -> Slope | None:
    """The whole run's drift in % per position (see the module), or None when too few
    cells have two measured runs."""
    runs = _measured_runs(rows)
    sizes = runs.groupby("cell_id")["value"].transform("size")
    runs = runs[sizes >= 2]
    if runs.empty:
        return None
    by_cell = runs.groupby("cell_id")
    relative = 100 * (runs["value"] / by_cell["value"].transform("median") - 1)
    x = runs["position"] - by_cell["position"].transform("mean")
    y = relative - relative.groupby(runs["cell_id"]).transform("mean")
    cells = runs["cell_id"].nunique()
    dof = len(runs) - cells - 1
    fit = _fit(x, y, dof)
    if fit is None:
        return None
    slope, se = fit
    half = t975(dof) * se
    return Slope(slope, slope - half, slope + half, len(runs), cells)


def add_position_trend(cells: pd.DataFrame, rows: pd.DataFrame) -> pd.DataFrame:
    """``cells`` with ``position_trend_pct`` where a cell has enough measured runs."""
    if cells.empty or "cell_id" not in cells.columns:
        return cells
    trends = cell_trends(rows)
    if not trends:
        return cells
    cells = cells.copy()
    cells[TREND_COLUMN] = [
        round(trends[c].slope, 3) if c in trends else None for c in cells["cell_id"].astype(str)
    ]
    return cells


def drift_markdown(rows: pd.DataFrame, cells: pd.DataFrame) -> list[str]:
    """summary.md's order-trend section: only when the run drifted or a cell's trend
    exceeds its noise."""
    drift = run_drift(rows)
    trends = cell_trends(rows)
    noisy = {c: s for c, s in trends.items() if s.excludes_zero}
    if not (drift is not None and drift.excludes_zero) and not noisy:
        return []
    lines = ["", "## Order trend", ""]
    if drift is not None:
        verdict = "drifted" if drift.excludes_zero else "showed no drift beyond its noise"
        lines.append(
            f"Over the run, throughput {verdict}: {drift.slope:+.3f}% per position "
            f"(95% interval {drift.low:+.3f} to {drift.high:+.3f}; {drift.runs} runs of "
            f"{drift.cells} cells, each run's tokens/s against its cell's median, within "
            "cells). The plan's order alternates the variants of a cell size by repeat "
            "(A B B A), so a steady drift biases none of them; their spread grows."
        )
    if noisy:
        labels = _cell_labels(cells)
        lines += [
            "",
            f"Cells whose tokens/s trend with position beyond their noise (% of the cell's "
            f"median per {PER_POSITIONS} positions, 95% interval excluding 0):",
        ]
        for cell, s in noisy.items():
            lines.append(
                f"- {labels.get(cell, cell)}: {s.slope:+.1f}% ({s.low:+.1f} to {s.high:+.1f}), "
                f"{s.runs} runs"
            )
    return lines


def _cell_labels(cells: pd.DataFrame) -> dict[str, str]:
    if cells.empty or "cell_id" not in cells.columns:
        return {}
    out = {}
    for c in records(cells):
        parts = [
            str(c.get(k))
            for k in ("scenario", "model_name_or_path", "framework_config")
            if c.get(k) is not None
        ]
        parts.append(f"bs {c.get('per_device_train_batch_size')}")
        out[str(c["cell_id"])] = ", ".join(parts)
    return out
