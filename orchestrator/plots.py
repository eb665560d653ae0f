"""The report's plots (matplotlib, headless PNG).

Each plot stays readable whatever the matrix size: bars are horizontal with
one labelled row per cell, and when there are more cells than fit, each
scenario keeps its best ones and the title says how many are shown (every
cell is in benchmarks.csv).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.patches import Rectangle
from matplotlib.ticker import MaxNLocator

from orchestrator.ids import model_short_name

if TYPE_CHECKING:
    from orchestrator.report import Report

MAX_BARS = 60
MAX_LINES = 12
GIB = 2**30
COLORS = plt.get_cmap("tab10").colors  # type: ignore[attr-defined]


def _number(value: float) -> str:
    if value >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def _label(cell: pd.Series, varying: Sequence[str]) -> str:
    parts = [
        model_short_name(str(cell.get("model_name_or_path"))),
        str(cell.get("framework_config")),
        (
            f"{int(cell['num_gpus'])} {'proc' if cell.get('device') == 'cpu' else 'GPU'}"
            if pd.notna(cell.get("num_gpus"))
            else "? GPU"
        ),
        f"eb {int(cell['effective_batch_size'])}"
        if pd.notna(cell.get("effective_batch_size"))
        else "",
    ]
    parts += [f"{v}={cell.get(v)}" for v in varying]
    return " · ".join(p for p in parts if p)


def _varying(cells: pd.DataFrame) -> list[str]:
    from orchestrator.report import argument_columns

    return [
        a
        for a in argument_columns(cells)
        if a in cells.columns and cells[a].astype(str).nunique() > 1
    ][:3]


def _select(cells: pd.DataFrame, metric: str, ascending: bool = False) -> tuple[pd.DataFrame, str]:
    """At most MAX_BARS cells, the best of each scenario when there are more."""
    if len(cells) <= MAX_BARS:
        return cells, ""
    per = max(1, MAX_BARS // max(1, cells["scenario"].nunique()))
    picked = (
        cells.assign(_rank=cells[metric].fillna(-math.inf if not ascending else math.inf))
        .sort_values("_rank", ascending=ascending)
        .groupby("scenario", sort=False)
        .head(per)
        .drop(columns="_rank")
    )
    return picked, f" (best {per} per scenario; {len(picked)} of {len(cells)} cells)"


def _bar_figure(n: int) -> tuple[Any, Any]:
    height = max(2.5, 0.32 * n + 1.4)
    return plt.subplots(figsize=(12, height), dpi=110)


def _ordered(cells: pd.DataFrame) -> pd.DataFrame:
    """Scenarios in file order; within one, by model, framework and GPU count."""
    order = {s: i for i, s in enumerate(dict.fromkeys(cells["scenario"]))}
    keys = [
        "_s",
        *[
            k
            for k in ("model_name_or_path", "framework_config", "num_gpus", "effective_batch_size")
            if k in cells.columns
        ],
    ]
    return (
        cells.assign(_s=cells["scenario"].map(order))
        .sort_values(keys, kind="stable")
        .drop(columns="_s")
    )


def _horizontal_bars(
    cells: pd.DataFrame,
    metric: str,
    *,
    scale: float,
    xlabel: str,
    title: str,
    path: Path,
    whiskers: tuple[str, str] | None = None,
    vline: tuple[float, str] | None = None,
) -> Path:
    cells = _ordered(cells).reset_index(drop=True)
    varying = _varying(cells)
    fig, ax = _bar_figure(len(cells))
    scenarios = list(dict.fromkeys(cells["scenario"]))
    y = list(range(len(cells)))[::-1]
    values = (pd.to_numeric(cells[metric], errors="coerce") / scale).tolist()
    colors = [COLORS[scenarios.index(s) % len(COLORS)] for s in cells["scenario"]]
    ax.barh(y, [0 if math.isnan(v) else v for v in values], color=colors, height=0.7)
    finite = [v for v in values if not math.isnan(v)]
    top = max(finite) if finite else 1.0
    if whiskers is not None:
        lo = (pd.to_numeric(cells[whiskers[0]], errors="coerce") / scale).tolist()
        hi = (pd.to_numeric(cells[whiskers[1]], errors="coerce") / scale).tolist()
        for yi, a, b in zip(y, lo, hi, strict=True):
            if not (math.isnan(a) or math.isnan(b)) and b > a:
                ax.plot([a, b], [yi, yi], color="black", linewidth=1)
    for yi, v, status in zip(y, values, cells["status"].astype(str), strict=True):
        if math.isnan(v):
            ax.text(
                top * 0.01,
                yi,
                status,
                va="center",
                ha="left",
                color="firebrick",
                fontsize=8,
                fontweight="bold",
            )
        else:
            ax.text(v + top * 0.01, yi, _number(v), va="center", ha="left", fontsize=7)
    if vline is not None:
        ax.axvline(vline[0], color="firebrick", linestyle="--", linewidth=1)
        ax.text(
            vline[0], len(cells) - 0.4, f" {vline[1]}", color="firebrick", fontsize=8, va="bottom"
        )
        top = max(top, vline[0])
    labels = [_label(c, varying) for _, c in cells.iterrows()]
    ax.set_yticks(y)
    ax.set_yticklabels(labels, fontsize=8)
    ax.set_xlim(0, top * 1.15)
    ax.set_xlabel(xlabel)
    ax.set_title(title, fontsize=11)
    ax.grid(axis="x", alpha=0.3)
    handles = [
        Rectangle((0, 0), 1, 1, color=COLORS[i % len(COLORS)]) for i in range(len(scenarios))
    ]
    ax.legend(
        handles,
        scenarios,
        title="scenario",
        fontsize=8,
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
    )
    # room on the left for the longest cell label (about 0.065 in per character at 8 pt),
    # on the right for the legend
    width = fig.get_figwidth()
    left = min(0.55, (0.065 * max(len(label) for label in labels) + 0.3) / width)
    right = 1 - (0.075 * max(len(s) for s in [*scenarios, "scenario"]) + 0.5) / width
    fig.subplots_adjust(
        left=left,
        right=max(left + 0.2, right),
        top=1 - 0.5 / fig.get_figheight(),
        bottom=0.6 / fig.get_figheight(),
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def _legend_below(fig: Any, ax: Any, entries: int) -> None:
    """The legend under the axes, where it cannot hide a line."""
    height = fig.get_figheight()
    legend_in = 0.2 * entries + 0.3
    fig.subplots_adjust(
        left=0.08, right=0.97, top=1 - 0.45 / height, bottom=(legend_in + 0.75) / height
    )
    ax.legend(
        fontsize=8,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.75 / (height - legend_in - 1.2)),
        ncol=1,
        frameon=False,
    )


def throughput(cells: pd.DataFrame, path: Path) -> Path:
    shown, note = _select(cells, "tokens_per_second_global")
    return _horizontal_bars(
        shown,
        "tokens_per_second_global",
        scale=1.0,
        xlabel="tokens per second, all GPUs (real tokens, median over repeats; bars: min–max)",
        title="Throughput per cell" + note,
        path=path,
        whiskers=("tokens_per_second_global_min", "tokens_per_second_global_max"),
    )


def memory(cells: pd.DataFrame, path: Path, capacity_bytes: float | None) -> Path:
    shown, note = _select(cells, "peak_memory_bytes", ascending=True)
    vline = (
        (capacity_bytes / GIB, f"capacity {capacity_bytes / GIB:.0f} GiB")
        if capacity_bytes
        else None
    )
    return _horizontal_bars(
        shown,
        "peak_memory_bytes",
        scale=GIB,
        xlabel="peak memory per device (per process on the CPU), GiB",
        title="Peak memory per cell" + note,
        path=path,
        vline=vline,
    )


def scaling_plot(table: pd.DataFrame, path: Path) -> Path | None:
    if table.empty:
        return None
    fig, ax = plt.subplots(figsize=(10, 5.5 + 0.2 * min(len(table), MAX_LINES)), dpi=110)
    keys = [
        k
        for k in (
            "scenario",
            "model_name_or_path",
            "framework_config",
            "effective_batch_size",
            "max_seq_len",
            "peft_method",
        )
        if k in table.columns
    ]
    families = list(table.groupby(keys, sort=False, dropna=False))
    shown = families[:MAX_LINES]
    counts: set[int] = set()
    for i, (key, group) in enumerate(shown):
        group = group.sort_values("num_gpus")
        parts: dict[str, Any] = dict(
            zip(keys, key if isinstance(key, tuple) else (key,), strict=True)
        )
        label = " · ".join(
            str(v)
            for v in (
                parts.get("scenario"),
                model_short_name(str(parts.get("model_name_or_path"))),
                parts.get("framework_config"),
                f"eb {int(parts['effective_batch_size'])}"
                if pd.notna(parts.get("effective_batch_size"))
                else None,
            )
            if v
        )
        if int(group["base_num_gpus"].iloc[0]) > min(int(n) for n in table["num_gpus"]):
            label += f" (relative to {int(group['base_num_gpus'].iloc[0])})"
        ax.plot(
            group["num_gpus"],
            100 * group["scaling_efficiency"],
            marker="o",
            color=COLORS[i % len(COLORS)],
            label=label,
        )
        counts.update(int(n) for n in group["num_gpus"])
    ax.axhline(100, color="grey", linestyle="--", linewidth=1)
    ax.text(min(counts), 101, "ideal", color="grey", fontsize=8)
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(counts))
    ax.set_xticklabels([str(c) for c in sorted(counts)])
    ax.set_xlabel("GPUs (processes on the CPU)")
    ax.set_ylabel("scaling efficiency, % (speedup / ideal speedup)")
    extra = f" ({len(shown)} of {len(families)} families)" if len(families) > len(shown) else ""
    ax.set_title("Scaling efficiency vs GPU count" + extra, fontsize=11)
    ax.grid(alpha=0.3)
    ax.set_ylim(0, max(110, float(100 * table["scaling_efficiency"].max()) + 10))
    _legend_below(fig, ax, len(shown))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def loss_curves(rows: pd.DataFrame, source: Path, path: Path) -> Path | None:
    """Loss per step of each cell's first finished run (read from its result.json)."""
    runs = source / "runs"
    if not runs.is_dir():
        return None
    ok = (
        rows[rows["status"].isin(["ok", "skipped"])]
        .sort_values("repeat")
        .drop_duplicates("cell_id")
    )
    curves: list[tuple[pd.Series, list[list[float]]]] = []
    for _, row in ok.iterrows():
        if len(curves) == MAX_LINES:
            break  # reading thousands of result files for lines nobody could tell apart
        try:
            result = json.loads((runs / str(row["experiment_id"]) / "result.json").read_text())
        except (OSError, ValueError):
            continue
        history = result.get("loss_history") or []
        if history:
            curves.append((row, history))
    if not curves:
        return None
    shown = curves[:MAX_LINES]
    varying = _varying(rows)
    fig, ax = plt.subplots(figsize=(10, 5.5 + 0.2 * len(shown)), dpi=110)
    for i, (row, history) in enumerate(shown):
        steps = [h[0] for h in history]
        values = [h[1] for h in history]
        ax.plot(
            steps,
            values,
            color=COLORS[i % len(COLORS)],
            linewidth=1.2,
            label=f"{row['scenario']} · {_label(row, varying)}",
        )
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("training loss")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    extra = f" (the first {len(shown)} of {len(ok)} cells)" if len(ok) > len(shown) else ""
    ax.set_title("Loss curves" + extra, fontsize=11)
    ax.grid(alpha=0.3)
    _legend_below(fig, ax, len(shown))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def write_all(
    report: Report, folder: Path, *, capacity_bytes: float | None, source: Path | None = None
) -> list[Path]:
    written: list[Path] = []
    cells = report.cells
    if cells.empty:
        return written
    written.append(throughput(cells, folder / "throughput.png"))
    if cells["peak_memory_bytes"].notna().any():
        written.append(memory(cells, folder / "memory.png", capacity_bytes))
    scaled = scaling_plot(report.scaling, folder / "scaling.png")
    if scaled is not None:
        written.append(scaled)
    if source is not None:
        loss = loss_curves(report.rows, source, folder / "loss.png")
        if loss is not None:
            written.append(loss)
    return written
