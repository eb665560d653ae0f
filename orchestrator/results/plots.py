"""The report's plots (matplotlib, headless PNG).

Each plot stays readable whatever the table: bars are horizontal with one
labelled row per cell; a label names what tells its cell apart from the others
(long ones wrap), and the figure is sized to its labels and legends, so that
nothing falls off the image. With more cells than fit, each scenario keeps its
highest and the title says how many are shown (every cell is in
benchmarks.csv). No two labels of a figure read the same: cells that would
(two scenarios that hold one setup) get the key that tells them apart.

The value axis keeps to the bars: a capacity line (the device's memory) is
drawn only where the largest bar reaches half of it, else the axis label names
it. A whisker (min–max over repeats) is drawn, and named, only where repeats
differ. Loss curves that overlap stay apart by dash, marker shape and
staggered markers, and identical ones say so in the legend.

Colours: bars of finished cells take their scenario's colour (a palette with
no red, orange, green or grey); a cell without a figure is marked by its status
in the status's colour: ok green, likely OOM orange, oom deep orange, failed
red, timeout and interrupted grey.

A plot with nothing to draw is not written; ``write_all`` says why in
``report.plot_notes``, which summary.md lists.
"""

from __future__ import annotations

import colorsys
import math
import textwrap
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from orchestrator.contract import columns as registry
from orchestrator.contract.columns import (
    ENERGY_PER_TOKEN,
    GPU_CONDITIONS,
    HF_TOKENS_PER_SECOND,
    PEAK_MEMORY,
    PEAK_MEMORY_SOURCE,
    TOKENS_PER_SECOND,
)
from orchestrator.contract.wording import worker, workers
from orchestrator.matrix.ids import model_short_name
from orchestrator.results.aggregate import SCALING_FIGURES, ReportTables, shows_hf_estimate
from orchestrator.results.capacity import LIKELY_OOM_FRACTION
from orchestrator.results.energyreport import THROTTLED, shows_energy
from orchestrator.results.runrecords import RunRecords
from orchestrator.results.tablecolumns import CELL_ORDER, config_columns, measured, ran_on_cpu

MAX_BARS = 60
MAX_LINES = 12
GIB = 2**30
DPI = 110
#: lines of the line plots (one per scaling series or cell)
COLORS = plt.get_cmap("tab10").colors  # type: ignore[attr-defined]
#: bars, one colour per scenario: no red, orange, green or grey, which statuses use
SCENARIO_COLORS = (
    "#1f77b4",
    "#9467bd",
    "#17becf",
    "#8c564b",
    "#bcbd22",
    "#393b79",
    "#7b4173",
    "#6baed6",
)
#: what a status looks like, by meaning; ``likely_oom``: failed without metrics, memory full
STATUS_COLORS = {
    "ok": "#2e7d32",
    "skipped": "#2e7d32",
    "likely_oom": "#ef6c00",
    "oom": "#d84315",
    "failed": "#c62828",
    "timeout": "#616161",
    "interrupted": "#757575",
    "planned": "#90a4ae",
    "pruned": "#bcaaa4",
    "spared": "#bcaaa4",
}
UNKNOWN_STATUS_COLOR = "#616161"
#: a status by its bar; the legend says more (``STATUS_LEGEND``)
STATUS_LABELS = {
    "ok": "ok, no figure",
    "skipped": "ok, no figure",
    "likely_oom": "likely OOM",
    "oom": "OOM",
    "pruned": "pruned",
    "spared": "spared",
}
STATUS_LEGEND = {
    **STATUS_LABELS,
    "likely_oom": f"likely OOM: failed, no metrics, memory ≥ {100 * LIKELY_OOM_FRACTION:.0f}% "
    "of the device",
    "oom": "OOM: out of memory",
    "pruned": "pruned: not run, a cell of its family that needs no more memory ran out",
    "spared": "spared: not run, two cells like it failed with the same error",
}
#: a mix of repeats' statuses takes the colour of the first of these it has
_SEVERITY = ("oom", "failed", "timeout", "interrupted", "planned", "pruned", "spared")
#: a label's lines, in characters
WRAP = 56
#: the width of the bars' axes, inches
AXES_WIDTH_IN = 7.0


def status_kind(status: str, likely_oom: bool = False) -> str:
    """The kind a cell's status colours as: its status, ``likely_oom``, or a mix's worst."""
    if likely_oom:
        return "likely_oom"
    parts = {p.split("×")[0] for p in str(status).split()}
    if parts <= {"ok", "skipped"}:
        return "ok"
    for kind in _SEVERITY:
        if kind in parts:
            return kind
    return next(iter(parts)) if len(parts) == 1 else "failed"


def status_color(kind: str) -> str:
    return STATUS_COLORS.get(kind, UNKNOWN_STATUS_COLOR)


def is_reddish(color: str) -> bool:
    """Red to orange: hue within 40° of red, saturated."""
    hue, lightness, saturation = colorsys.rgb_to_hls(*to_rgb(color))
    return (hue < 40 / 360 or hue > 340 / 360) and saturation > 0.4 and 0.2 < lightness < 0.8


def _number(value: float) -> str:
    if value >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def _missing(value: Any) -> bool:
    if value is None:
        return True
    try:
        return bool(pd.isna(value))
    except (TypeError, ValueError):
        return False


def _value_text(value: Any) -> str:
    if _missing(value):
        return "none"
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else f"{value:g}"
    return str(value)


def _counted(frame: pd.DataFrame) -> str:
    """What a cell's num_gpus counts: GPUs, processes (CPU), or both in one table."""
    cpu = ran_on_cpu(frame)
    if not cpu and "device" in frame.columns and "cpu" in set(frame["device"].astype(str)):
        return f"{workers(False)} ({workers(True)} on the CPU)"
    return workers(cpu)


def _part(column: str, cell: pd.Series) -> str:
    """One labelled part of a cell's label: a key column as it declares
    (``Column.short``, ``Column.flags``), else ``name=value``."""
    value = cell.get(column)
    cpu = ran_on_cpu(cell)
    unit = workers(cpu, short=True)
    if column == "scenario":
        return _scenario_name(value)
    if column == "model_name_or_path":
        return model_short_name(str(value))
    if column == "framework_config":
        return str(value)
    if column == "peft_method":
        return "no PEFT" if _value_text(value) == "none" else str(value)
    if column == "learning_rate":
        return f"lr {_value_text(value)}"
    if column == "environment":
        return "no env" if _missing(value) else f"env {value}"
    if column == "device":
        return f"on {_value_text(value)}"
    if column == "processes" and str(_value_text(value)).isdigit():
        return workers(True, int(_value_text(value)))
    if column == "cell_id":
        return f"cell {_value_text(value)}"
    declared = registry.find(column)
    if declared is not None and declared.flags is not None:
        yes, no = declared.flags
        return {"true": yes, "false": no}.get(_value_text(value).lower(), f"{column} ?")
    # a GPU count nobody recorded reads as "? GPU"
    text = "?" if column == "num_gpus" and _missing(value) else _value_text(value)
    short = registry.short_label(column, text, unit=unit, per=unit)
    return short if short is not None else f"{column}={_value_text(value)}"


#: what a label starts with: model, framework and GPU count
LABEL_BASE = registry.with_role("label_base")
#: the keys a label may add, in this order, after the cells' own arguments
#: (``config_columns``) are appended
LABEL_KEYS = registry.with_role("label")


def _label_columns(
    cells: pd.DataFrame, base: Sequence[str] = LABEL_BASE, lead: Sequence[str] = ()
) -> list[str]:
    """Model, framework and GPU count, then each column that tells more cells apart.

    A column joins the label only when it splits cells the label so far does not
    (within a scenario): LoRA's rank is left out where the PEFT method already
    says it, the learning rate where the framework already does. ``lead``: columns
    every label starts with (the scenario in a legend that shows it), never repeated.
    """
    candidates = [*LABEL_KEYS, *config_columns(cells)]
    text = cells.astype(object).map(_value_text)
    chosen = [c for c in base if c in cells.columns and c not in lead]
    within = ["scenario"] if "scenario" in cells.columns else []

    def distinct(columns: list[str]) -> int:
        return len(text[list(dict.fromkeys([*within, *lead, *columns]))].drop_duplicates())

    count = distinct(chosen)
    for column in candidates:
        if column not in cells.columns or column in chosen or column in lead:
            continue
        more = distinct([*chosen, column])
        if more > count:
            chosen.append(column)
            count = more
    return chosen


def _label_parts(
    cells: pd.DataFrame, base: Sequence[str] = LABEL_BASE, lead: Sequence[str] = ()
) -> list[list[str]]:
    """Each cell's label, as its parts: no two cells of ``cells`` get the same.

    The columns of ``_label_columns`` tell cells of one scenario apart; cells that
    still read the same (two scenarios that hold one setup, cells that differ only in
    a key no label names) get the key that tells them apart added, to their labels
    only: the key among the label keys and the cells' arguments that splits them
    into the most groups, else the scenario's name, else the cell's id. The rest keep
    their short labels.
    """
    cells = cells.reset_index(drop=True)
    rows = [cell for _, cell in cells.iterrows()]
    shared = [*lead, *_label_columns(cells, base, lead)]
    columns = [list(shared) for _ in rows]
    extra = [
        c
        for c in dict.fromkeys([*base, *LABEL_KEYS, *config_columns(cells)])
        if c in cells.columns and c not in shared
    ]
    fallback = [c for c in ("scenario", "cell_id") if c in cells.columns and c not in shared]

    def parts(i: int) -> list[str]:
        return [_part(c, rows[i]) for c in columns[i]]

    while True:
        same: dict[tuple[str, ...], list[int]] = {}
        for i in range(len(rows)):
            same.setdefault(tuple(parts(i)), []).append(i)
        groups = [group for group in same.values() if len(group) > 1]
        progressed = False
        for group in groups:
            used = {c for i in group for c in columns[i]}
            best, most = None, 1
            for column in [c for c in extra if c not in used]:
                split = len({_part(column, rows[i]) for i in group})
                if split > most:
                    best, most = column, split
            if best is None:
                best = next(
                    (
                        c
                        for c in fallback
                        if c not in used and len({_part(c, rows[i]) for i in group}) > 1
                    ),
                    None,
                )
            if best is not None:
                for i in group:
                    columns[i].append(best)
                progressed = True
        if not progressed:
            break
    labelled = [parts(i) for i in range(len(rows))]
    # cells nothing tells apart (a table with one row twice) are numbered
    counts = Counter(tuple(label) for label in labelled)
    seen: Counter[tuple[str, ...]] = Counter()
    for label in labelled:
        key = tuple(label)
        if counts[key] > 1:
            seen[key] += 1
            label.append(f"#{seen[key]}")
    return labelled


def _fill(pieces: Sequence[str], width: int) -> list[str]:
    lines: list[str] = []
    for piece in pieces:
        if lines and len(lines[-1]) + 3 + len(piece) <= width:
            lines[-1] += " · " + piece
        else:
            lines.append(piece)
    return lines


def _wrap(parts: Sequence[str], width: int = WRAP) -> str:
    """Parts joined by `` · ``, in as few lines of at most about ``width`` characters as
    it takes, of even length (a lone last word on a line of its own reads badly)."""
    pieces = [piece for part in parts for piece in (textwrap.wrap(part, width) or [part])]
    fewest = len(_fill(pieces, width))
    shortest = max(len(" · ".join(pieces)) // fewest, *(len(p) for p in pieces))
    for target in range(shortest, width + 1):
        lines = _fill(pieces, target)
        if len(lines) <= fewest:
            return "\n".join(lines)
    return "\n".join(_fill(pieces, width))


def labels(cells: pd.DataFrame) -> list[str]:
    """One label per cell, no two the same, wrapped to lines of about ``WRAP`` characters."""
    return [_wrap(parts) for parts in _label_parts(cells)]


def _select(cells: pd.DataFrame, values: pd.Series) -> tuple[pd.DataFrame, str]:
    """At most MAX_BARS cells, the highest of each scenario when there are more."""
    if len(cells) <= MAX_BARS:
        return cells, ""
    per = max(1, MAX_BARS // max(1, cells["scenario"].nunique()))
    picked = (
        cells.assign(_rank=values.fillna(-math.inf))
        .sort_values("_rank", ascending=False, kind="stable")
        .groupby("scenario", sort=False)
        .head(per)
        .drop(columns="_rank")
    )
    return picked, (
        f" — the {per} highest per scenario, {len(picked)} of {len(cells)} cells "
        "(all are in benchmarks.csv)"
    )


def _ordered(cells: pd.DataFrame) -> pd.DataFrame:
    """Scenarios in file order; within one, by model, framework and GPU count."""
    order = {s: i for i, s in enumerate(dict.fromkeys(cells["scenario"]))}
    keys = ["_s", *[k for k in CELL_ORDER if k in cells.columns]]
    return (
        cells.assign(_s=cells["scenario"].map(order))
        .sort_values(keys, kind="stable")
        .drop(columns="_s")
    )


def _scenario_name(scenario: Any) -> str:
    return str(scenario) if str(scenario) not in ("", "nan", "None") else "(no scenario)"


def bar_figure(
    cells: pd.DataFrame,
    metric: str,
    *,
    scale: float,
    xlabel: str,
    title: str,
    whiskers: tuple[str, str] | None = None,
    whisker_xlabel: str | None = None,
    vline: tuple[float, str] | None = None,
    failed_metric: str | None = None,
) -> Figure:
    """Horizontal bars of ``metric`` per cell, the figure sized to fit every text in it.

    ``whiskers``: the columns of a whisker's ends, drawn where they differ;
    ``whisker_xlabel``: the axis label when at least one is drawn (it says what a
    whisker is), ``xlabel`` otherwise.
    ``vline``: a capacity (its value and name), drawn as a line only where the bars
    come near it (``near_capacity``); else the axis keeps to the bars and its label
    names the capacity, off the axis.
    ``failed_metric``: a column whose value is drawn, hatched in the status's colour,
    for a cell that did not finish (the memory a failed run reached).
    """
    bars = _bars(_ordered(cells).reset_index(drop=True), metric, scale, whiskers, failed_metric)
    fig = plt.figure(figsize=(12, 4), dpi=DPI)
    ax = fig.add_subplot()
    value_texts, shown_kinds = _draw_bars(ax, bars)
    if _draw_whiskers(ax, bars) and whisker_xlabel is not None:
        xlabel = whisker_xlabel
    xlabel, top = _draw_capacity(ax, bars, vline, xlabel)
    _set_axes(ax, bars, xlabel, top)
    legends = _legends(ax, bars.scenarios, shown_kinds)
    title_artist = fig.suptitle(title, fontsize=11, x=0.01, ha="left", y=0.99, va="top")
    _fit(fig, ax, legends, title_artist, value_texts, rows=len(bars.y), row_in=bars.row_in)
    return fig


@dataclass(frozen=True)
class _Bars:
    """What ``bar_figure`` draws, one entry per cell (the first cell at the top)."""

    #: each cell's place on the y axis, its label and the height of a row of labels
    y: list[int]
    texts: list[str]
    row_in: float
    #: each cell's value, and for a cell that did not finish the value it reached
    values: list[float]
    failed: list[float]
    #: each cell's status, its kind (``status_kind``), its scenario; the scenarios in order
    statuses: list[str]
    kinds: list[str]
    names: list[str]
    scenarios: list[str]
    #: each cell's whisker ends (NaN: none)
    lo: list[float]
    hi: list[float]

    @property
    def finite(self) -> list[float]:
        """Every value and failed value that is a number."""
        return [v for v in [*self.values, *self.failed] if not math.isnan(v)]

    @property
    def top(self) -> float:
        """The largest of them (1 where there is none): what the axis must reach."""
        return max(self.finite) if self.finite else 1.0

    def color(self, name: str) -> str:
        """A scenario's colour."""
        return SCENARIO_COLORS[self.scenarios.index(name) % len(SCENARIO_COLORS)]


def _bars(
    cells: pd.DataFrame,
    metric: str,
    scale: float,
    whiskers: tuple[str, str] | None,
    failed_metric: str | None,
) -> _Bars:
    """The figures, statuses and labels of ``cells`` (in the order drawn), scaled."""
    likely = (
        cells["likely_oom"].fillna(False).astype(bool)
        if "likely_oom" in cells.columns
        else pd.Series(False, index=cells.index)
    )
    kinds = [status_kind(s, lo) for s, lo in zip(cells["status"].astype(str), likely, strict=True)]
    names = [_scenario_name(s) for s in cells["scenario"]]
    texts = labels(cells)
    lines = max(t.count("\n") + 1 for t in texts)

    def scaled(column: str) -> list[float]:
        return (pd.to_numeric(cells[column], errors="coerce") / scale).tolist()

    nothing = [math.nan] * len(cells)
    return _Bars(
        y=list(range(len(cells)))[::-1],
        texts=texts,
        row_in=max(0.3, 0.15 * lines + 0.12),
        values=scaled(metric),
        failed=scaled(failed_metric)
        if failed_metric and failed_metric in cells.columns
        else nothing,
        statuses=cells["status"].astype(str).tolist(),
        kinds=kinds,
        names=names,
        scenarios=list(dict.fromkeys(names)),
        lo=scaled(whiskers[0]) if whiskers is not None else nothing,
        hi=scaled(whiskers[1]) if whiskers is not None else nothing,
    )


#: the white box behind a bar's text, so that a grid or capacity line passes behind it
_TEXT_BOX = {"facecolor": "white", "edgecolor": "none", "pad": 0.5, "alpha": 0.85}


def _draw_bars(ax: Any, bars: _Bars) -> tuple[list[Any], list[str]]:
    """Each cell's bar and its text, top to bottom; the texts, and the statuses shown
    (in the order met) of the cells that did not finish."""
    shown_kinds: list[str] = []
    value_texts = []
    top = bars.top
    for yi, v, v_failed, kind, name, status, v_hi in zip(
        bars.y,
        bars.values,
        bars.failed,
        bars.kinds,
        bars.names,
        bars.statuses,
        bars.hi,
        strict=True,
    ):
        if not math.isnan(v):
            value_texts.append(_finished_bar(ax, yi, v, v_hi, status, bars.color(name), top))
            continue
        if kind not in shown_kinds:
            shown_kinds.append(kind)
        value_texts.append(_unfinished_bar(ax, yi, v_failed, kind, top))
    return value_texts, shown_kinds


def _finished_bar(
    ax: Any, yi: int, v: float, v_hi: float, status: str, color: str, top: float
) -> Any:
    """A bar in its scenario's colour, its value after it (or after its whisker)."""
    ax.barh(yi, v, color=color, height=0.7)
    # a figure of the finished repeats of a cell some of whose repeats did not finish
    mix = f" ({status})" if "×" in status else ""
    return ax.text(
        (v if math.isnan(v_hi) else max(v, v_hi)) + top * 0.01,
        yi,
        _number(v) + mix,
        va="center",
        ha="left",
        fontsize=7,
        zorder=4,
        bbox={**_TEXT_BOX},
    )


def _unfinished_bar(ax: Any, yi: int, v_failed: float, kind: str, top: float) -> Any:
    """A cell that did not finish: its status in the status's colour, after the hatched
    bar of the value it reached where there is one."""
    label = STATUS_LABELS.get(kind, kind.replace("_", " "))
    if not math.isnan(v_failed):
        ax.barh(yi, v_failed, color="white", edgecolor=status_color(kind), hatch="///", height=0.7)
        text, x = f"{_number(v_failed)} · {label}", v_failed + top * 0.01
    else:
        text, x = label, top * 0.01
    return ax.text(
        x,
        yi,
        text,
        va="center",
        ha="left",
        color=status_color(kind),
        fontsize=7.5,
        fontweight="bold",
        zorder=4,
        # the capacity line passes behind the text, not through it
        bbox={**_TEXT_BOX},
    )


def _draw_whiskers(ax: Any, bars: _Bars) -> int:
    """The whiskers whose ends differ; how many were drawn."""
    drawn = 0
    for yi, a, b in zip(bars.y, bars.lo, bars.hi, strict=True):
        if not (math.isnan(a) or math.isnan(b)) and b > a:
            ax.plot([a, b], [yi, yi], color="black", linewidth=1)
            drawn += 1
    return drawn


def _draw_capacity(
    ax: Any, bars: _Bars, vline: tuple[float, str] | None, xlabel: str
) -> tuple[str, float]:
    """The capacity's line where the bars come near it, else its name in the axis label;
    the axis label and how far the axis must reach."""
    top = bars.top
    if vline is not None and not near_capacity(max(bars.finite, default=0.0), vline[0]):
        # a far capacity would squeeze the bars into slivers: it is named, not drawn
        return xlabel + f"\n{vline[1]}: off the axis, far above every bar", top
    if vline is not None:
        ax.axvline(vline[0], color="#b71c1c", linestyle="--", linewidth=1)
        ax.text(
            vline[0],
            1.0,
            f"{vline[1]} ",
            color="#b71c1c",
            fontsize=8,
            va="bottom",
            ha="right",
            transform=ax.get_xaxis_transform(),
        )
        top = max(top, vline[0])
    return xlabel, top


def _set_axes(ax: Any, bars: _Bars, xlabel: str, top: float) -> None:
    """The cells' labels on the y axis, the x axis from 0 to a little past ``top``."""
    ax.set_yticks(bars.y)
    ax.set_yticklabels(bars.texts, fontsize=8)
    ax.set_ylim(-0.6, len(bars.y) - 0.4)
    ax.set_xlim(0, top * 1.05)
    ax.set_xlabel(xlabel, fontsize=9)
    ax.grid(axis="x", alpha=0.3)


def _legends(ax: Any, scenarios: list[str], shown_kinds: list[str]) -> list[Any]:
    """The scenarios' colours (unless the cells name none) and the statuses shown."""
    legends = []
    if len(scenarios) > 1 or scenarios[0] != "(no scenario)":
        handles = [
            Patch(color=SCENARIO_COLORS[i % len(SCENARIO_COLORS)]) for i in range(len(scenarios))
        ]
        legends.append(
            ax.legend(handles, scenarios, title="scenario", fontsize=8, loc="upper left")
        )
    if shown_kinds:
        if legends:
            ax.add_artist(legends[0])
        handles = [
            Patch(facecolor="white", edgecolor=status_color(k), hatch="///") for k in shown_kinds
        ]
        legends.append(
            ax.legend(
                handles,
                [STATUS_LEGEND.get(k, k.replace("_", " ")) for k in shown_kinds],
                title="status",
                fontsize=8,
                loc="upper left",
            )
        )
    return legends


#: the capacity line is drawn when the largest bar reaches this share of it
CAPACITY_LINE_FRACTION = 0.5


def near_capacity(largest: float, capacity: float) -> bool:
    """Whether bars whose largest is ``largest`` come near enough to ``capacity`` for
    its line to be drawn: at least ``CAPACITY_LINE_FRACTION`` of it. Then the axis
    reaches the line and the bars fill at least about half of it; below, the line
    would squeeze them into slivers (0.6 GiB against 23.5 GiB), and the axis keeps
    to the bars."""
    return capacity > 0 and largest >= CAPACITY_LINE_FRACTION * capacity


def _fit(
    fig: Figure,
    ax: Any,
    legends: list[Any],
    title: Any,
    value_texts: list[Any],
    *,
    rows: int,
    row_in: float,
) -> None:
    """Size the figure to its texts: the labels on the left, legends on the right,
    the title above (wrapped to the figure's width), the value texts inside the axes."""
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    dpi = fig.dpi

    def inches(artist: Any) -> tuple[float, float]:
        box = artist.get_window_extent(renderer)
        return box.width / dpi, box.height / dpi

    label_w = max((inches(t)[0] for t in ax.get_yticklabels() if t.get_text()), default=0.0)
    legend_sizes = [inches(legend) for legend in legends]
    legend_w = max((w for w, _ in legend_sizes), default=0.0)
    legend_h = sum(h for _, h in legend_sizes) + 0.15 * max(0, len(legends) - 1)
    pad, gap = 0.15, 0.12
    left_in = pad + label_w + gap
    right_in = (gap + legend_w + pad) if legends else pad + 0.1
    width = left_in + AXES_WIDTH_IN + right_in
    # the title wraps to the figure's width
    title_w = inches(title)[0]
    if title_w > width - 2 * pad:
        chars = max(20, int(len(title.get_text()) * (width - 2 * pad) / title_w) - 2)
        title.set_text(textwrap.fill(title.get_text(), chars))
    title_h = inches(title)[1]
    top_in = pad + title_h + 0.3
    # the tick labels, then the axis label (one line or more)
    bottom_in = 0.45 + inches(ax.xaxis.label)[1] + pad
    axes_h = max(rows * row_in, legend_h + 0.1, 1.0)
    height = top_in + axes_h + bottom_in
    fig.set_size_inches(width, height)
    fig.subplots_adjust(
        left=left_in / width,
        right=1 - right_in / width,
        top=1 - top_in / height,
        bottom=bottom_in / height,
    )
    # legends stacked at the right of the axes, from its top
    offset = 0.0
    for legend, (_, h) in zip(legends, legend_sizes, strict=True):
        legend.set_bbox_to_anchor((1 + gap / AXES_WIDTH_IN, 1 - offset / axes_h), ax.transAxes)
        offset += h + 0.15
    title.set_y(1 - pad / height)
    # room at the right of the bars for their value texts
    axes_px = AXES_WIDTH_IN * dpi
    xmax = ax.get_xlim()[1]
    for t in value_texts:
        x = t.get_position()[0]
        w = t.get_window_extent(renderer).width + 4
        if w < axes_px:
            xmax = max(xmax, x * axes_px / (axes_px - w))
    ax.set_xlim(0, xmax)


def _save(fig: Figure, path: Path) -> Path:
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


def _widen_to_legend(fig: Any, ax: Any) -> None:
    """A legend wider than the figure widens the figure."""
    legend = ax.get_legend()
    if legend is None:
        return
    renderer = fig.canvas.get_renderer()
    needed = legend.get_window_extent(renderer).width / fig.dpi + 0.4
    if needed > fig.get_figwidth():
        fig.set_size_inches(needed, fig.get_figheight())


def throughput_figure(cells: pd.DataFrame) -> Figure | None:
    """Measured tokens/s per cell; None when no cell has one."""
    values = pd.to_numeric(cells[TOKENS_PER_SECOND], errors="coerce")
    if values.isna().all():
        return None
    shown, note = _select(cells, values)
    tasks = shown["task"].dropna().astype(str).nunique() if "task" in shown.columns else 1
    # a token is each task's own (a transcript's, a source's or target's, a patch)
    apart = "\ntasks count tokens apart (summary.md's reading guide): compare within one task" * (
        tasks > 1
    )
    return bar_figure(
        shown,
        TOKENS_PER_SECOND,
        scale=1.0,
        xlabel=f"measured tokens per second, all {_counted(shown)} (real tokens, median "
        "over repeats)" + apart,
        # one repeat, or repeats that agree, draw no whisker, and the label promises none
        whisker_xlabel=f"measured tokens per second, all {_counted(shown)} (real tokens; "
        "bar: the median over repeats, whisker: their min–max)" + apart,
        title="Throughput per cell" + note,
        whiskers=(f"{TOKENS_PER_SECOND}_min", f"{TOKENS_PER_SECOND}_max"),
    )


def hf_estimate_figure(cells: pd.DataFrame) -> Figure | None:
    """HF Trainer's tokens/s estimate per cell, apart from measured throughput."""
    if HF_TOKENS_PER_SECOND not in cells.columns:
        return None
    values = pd.to_numeric(cells[HF_TOKENS_PER_SECOND], errors="coerce")
    if values.isna().all():
        return None
    shown, note = _select(cells, values)
    return bar_figure(
        shown,
        HF_TOKENS_PER_SECOND,
        scale=1.0,
        xlabel=f"HF Trainer's train_tokens_per_second: per {worker(ran_on_cpu(shown))}, padding "
        "included, estimated from the first batch × steps",
        title="HF Trainer's throughput estimate per cell (not measured; not comparable "
        "with measured tokens/s)" + note,
    )


def _sources(frame: pd.DataFrame, mask: pd.Series) -> str:
    if PEAK_MEMORY_SOURCE not in frame.columns:
        return ""
    return " / ".join(sorted(frame.loc[mask, PEAK_MEMORY_SOURCE].dropna().astype(str).unique()))


def memory_figure(
    cells: pd.DataFrame, capacity: Any = None, rows: pd.DataFrame | None = None
) -> Figure | None:
    """Peak memory per cell, and the memory failed cells reached, against the capacity.

    ``rows``: when given, and the failed runs' memory comes from another source than
    the finished ones' (the predecessor: HF's figure for these, NVML's for those),
    the axis says which is which.
    """
    peak = pd.to_numeric(cells[PEAK_MEMORY], errors="coerce")
    failed = (
        pd.to_numeric(cells["failed_peak_memory_bytes"], errors="coerce")
        if "failed_peak_memory_bytes" in cells.columns
        else pd.Series(math.nan, index=cells.index)
    )
    values = peak.fillna(failed)
    if values.isna().all():
        return None
    shown, note = _select(cells, values)
    vline = None
    if capacity is not None:
        what = "device memory" if capacity.gpu else "machine memory"
        gib = f"{capacity.bytes / GIB:.1f}".removesuffix(".0")
        vline = (capacity.bytes / GIB, f"{what} {gib} GiB")
    counted = _counted(shown)
    xlabel = {
        workers(True): "peak memory per process, GiB",
        workers(False): "peak memory per device, GiB",
    }.get(counted, f"peak memory per device (per {worker(True)} on the CPU), GiB")
    if failed.notna().any():
        xlabel += "; hatched: the memory a run that did not finish reached"
        if rows is not None and "failed_peak_memory_bytes" in rows.columns:
            finished = _sources(cells, peak.notna())
            unfinished = _sources(rows, rows["failed_peak_memory_bytes"].notna())
            if finished and unfinished and finished != unfinished:
                xlabel += f"\nsources differ: bars {finished}; hatched {unfinished}"
    return bar_figure(
        shown,
        PEAK_MEMORY,
        scale=GIB,
        xlabel=xlabel,
        title="Peak memory per cell" + note,
        vline=vline,
        failed_metric="failed_peak_memory_bytes",
    )


def scaling_figure(table: pd.DataFrame) -> Figure | None:
    """Scaling efficiency against the GPU (process) count; None without a series."""
    if table.empty:
        return None
    fig, ax = plt.subplots(figsize=(10, 5.5 + 0.2 * min(len(table), MAX_LINES)), dpi=DPI)
    # a series is what aggregate.scaling made one: every key column of the table
    keys = [c for c in table.columns if c not in SCALING_FIGURES]
    text = table[keys].astype(object).map(str)
    series = list(table.groupby([text[k] for k in keys], sort=False))
    shown = series[:MAX_LINES]
    counts: set[int] = set()
    # a line's label: its scenario, then what tells it apart from the others
    heads = pd.DataFrame([group.iloc[0][keys] for _, group in shown]).reset_index(drop=True)
    names = [
        " · ".join(parts)
        for parts in _label_parts(
            heads, base=LABEL_BASE[:2], lead=("scenario",) if "scenario" in keys else ()
        )
    ]
    smallest = min(int(n) for n in table["num_gpus"])
    for i, ((_, group), label) in enumerate(zip(shown, names, strict=True)):
        group = group.sort_values("num_gpus")
        if int(group["base_num_gpus"].iloc[0]) > smallest:
            label += f" (relative to {int(group['base_num_gpus'].iloc[0])})"
        ax.plot(
            group["num_gpus"],
            100 * group["scaling_efficiency"],
            color=COLORS[i % len(COLORS)],
            # lines on one another (two series that scale alike) stay apart by dash and
            # marker; an earlier line's larger marker rings a later one's
            linestyle=LINESTYLES[i % len(LINESTYLES)],
            marker=MARKER_SHAPES[i % len(MARKER_SHAPES)],
            markersize=max(4.0, 9.0 - 1.5 * (i % 4)),
            label=label,
        )
        counts.update(int(n) for n in group["num_gpus"])
    ax.axhline(100, color="grey", linestyle="--", linewidth=1)
    ax.text(max(counts), 101, "ideal ", color="grey", fontsize=8, ha="right", va="bottom")
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(counts))
    ax.set_xticklabels([str(c) for c in sorted(counts)])
    ax.set_xlabel(_counted(table))
    ax.set_ylabel("scaling efficiency, % (speedup / ideal speedup)")
    extra = f" ({len(shown)} of {len(series)} families)" if len(series) > len(shown) else ""
    ax.set_title(f"Scaling efficiency vs {worker(ran_on_cpu(table))} count" + extra, fontsize=11)
    ax.grid(alpha=0.3)
    ax.set_ylim(0, max(110, float(100 * table["scaling_efficiency"].max()) + 10))
    _legend_below(fig, ax, len(shown))
    _widen_to_legend(fig, ax)
    return fig


#: the most cells the energy plot marks (the frontier's first, then the fastest)
MAX_POINTS = 24


def frontier(points: Sequence[tuple[float, float]]) -> list[int]:
    """The indices of the efficient frontier of ``(joules per token, tokens/s)`` points,
    in order: the points no other beats on both, using no more energy per token and
    running at least as fast, and better on one of them. One sort and one sweep: by
    energy (then the fastest first), a point is on it when it is faster than every
    point before it."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0], -points[i][1]))
    out: list[int] = []
    fastest = -math.inf
    for i in order:
        # a point equal to the last one on it is on it too: neither beats the other
        if points[i][1] > fastest or (out and points[i] == points[out[-1]]):
            out.append(i)
            fastest = points[i][1]
    return sorted(out)


def _frontier_groups(cells: pd.DataFrame) -> list[str]:
    """Each cell's frontier: its task and device."""
    keys = [k for k in ("task", "device") if k in cells.columns]
    if not keys:
        return [""] * len(cells)
    return cells[keys].astype(str).agg(" ".join, axis=1).tolist()


def _frontiers(points: Sequence[tuple[float, float]], groups: Sequence[str]) -> set[int]:
    """The indices on their group's frontier."""
    on: set[int] = set()
    for group in sorted(set(groups)):
        members = [i for i, g in enumerate(groups) if g == group]
        on.update(members[k] for k in frontier([points[i] for i in members]))
    return on


def frontier_figure(cells: pd.DataFrame) -> Figure | None:
    """Tokens/s against joules per token, one point per cell, the efficient frontier
    joined; None when no cell has both figures."""
    if ENERGY_PER_TOKEN not in cells.columns:
        return None
    tps = pd.to_numeric(cells[TOKENS_PER_SECOND], errors="coerce")
    joules = pd.to_numeric(cells[ENERGY_PER_TOKEN], errors="coerce")
    has = tps.notna() & joules.notna() & (tps > 0) & (joules > 0)
    if not has.any():
        return None
    shown = _ordered(cells[has])
    points = list(
        zip(
            pd.to_numeric(shown[ENERGY_PER_TOKEN]).astype(float),
            pd.to_numeric(shown[TOKENS_PER_SECOND]).astype(float),
            strict=True,
        )
    )
    # one frontier per task and device: a token is each task's own, and RAPL's energy
    # (the CPU packages) is not the GPUs'
    groups = _frontier_groups(shown)
    best = _frontiers(points, groups)
    note = ""
    if len(shown) > MAX_POINTS:
        rest = sorted((i for i in range(len(points)) if i not in best), key=lambda i: -points[i][1])
        keep = sorted([*sorted(best), *rest][:MAX_POINTS])
        note = f" — {len(keep)} of {len(shown)} cells: the frontier, then the fastest"
        shown = shown.iloc[keep]
        points, groups = [points[i] for i in keep], [groups[i] for i in keep]
        # the kept cells' places: the frontier is the one of every cell
        best = {place for place, i in enumerate(keep) if i in best}
    names = labels(shown)
    scenarios = list(dict.fromkeys(shown["scenario"].map(_scenario_name)))
    conditions = (
        shown[GPU_CONDITIONS].astype(str).tolist()
        if GPU_CONDITIONS in shown.columns
        else [""] * len(shown)
    )
    throttled = [" — ran throttled" if THROTTLED in c else "" for c in conditions]
    lines = sum(name.count("\n") + 1 for name in names)
    fig, ax = plt.subplots(figsize=(10, 5.5 + 0.2 * lines), dpi=DPI)
    for i, ((x, y), name, scenario) in enumerate(
        zip(points, names, shown["scenario"].map(_scenario_name), strict=True)
    ):
        color = SCENARIO_COLORS[scenarios.index(scenario) % len(SCENARIO_COLORS)]
        on = i in best
        ax.scatter(
            [x],
            [y],
            s=60,
            color=color if on else "white",
            edgecolors=color,
            linewidths=1.5,
            zorder=3,
            label=f"{i + 1}{' (frontier)' if on else ''}: {name}{throttled[i]}",
        )
        ax.annotate(str(i + 1), (x, y), textcoords="offset points", xytext=(6, 5), fontsize=8)
    for group in sorted(set(groups)):
        line = sorted(points[i] for i in best if groups[i] == group)
        if len(line) > 1:
            xs, ys = [p[0] for p in line], [p[1] for p in line]
            ax.plot(xs, ys, color="grey", linestyle="--", zorder=2)
    tasks = shown["task"].dropna().astype(str).nunique() if "task" in shown.columns else 1
    apart = "\ntasks count tokens apart: compare within one task" * (tasks > 1)
    ax.set_xlabel(
        f"joules per token, all {_counted(shown)} over the measured steps (lower is better)"
    )
    ax.set_ylabel(f"tokens per second, all {_counted(shown)} (higher is better)")
    ax.set_title(
        "Throughput against energy per cell: filled, the efficient frontier (no cell of its "
        "task is both faster and more frugal)" + note + "\ncolour: the cell's scenario" + apart,
        fontsize=10,
    )
    ax.grid(alpha=0.3)
    ax.set_xlim(left=0, right=max(p[0] for p in points) * 1.15)
    ax.set_ylim(bottom=0, top=max(p[1] for p in points) * 1.15)
    _legend_below(fig, ax, lines)
    _widen_to_legend(fig, ax)
    return fig


def _loss_curves(
    rows: pd.DataFrame, source: Path, runs: RunRecords | None = None
) -> tuple[list[tuple[pd.Series, Any]], int]:
    """The loss history of each cell's first finished run (at most MAX_LINES), and how
    many finished cells there are; ``runs``: the loss histories the folder's read kept."""
    if not (source / "runs").is_dir():
        return [], 0
    runs = runs if runs is not None else RunRecords(source)
    ok = rows[measured(rows)].sort_values("repeat").drop_duplicates("cell_id")
    curves: list[tuple[pd.Series, Any]] = []
    for _, row in ok.iterrows():
        if len(curves) == MAX_LINES:
            break  # reading thousands of result files for lines nobody could tell apart
        history = runs.loss_history(str(row["experiment_id"])) or []
        if history:
            curves.append((row, history))
    return curves, len(ok)


#: losses this close (relative) at every step two curves share are the same curve
SAME_LOSS = 1e-6
#: about this many markers on the longest curve (more where more curves must stagger)
MARKERS = 12
LINESTYLES = ("-", "--", ":", "-.")
MARKER_SHAPES = "osd^v<>"


def _same_loss(a: Sequence[Sequence[float]], b: Sequence[Sequence[float]]) -> bool:
    """Whether two loss histories ([step, loss]…) agree at every step both have (and
    have one at least), within ``SAME_LOSS``."""
    first = {int(h[0]): float(h[1]) for h in a}
    second = {int(h[0]): float(h[1]) for h in b}
    shared = first.keys() & second.keys()
    return bool(shared) and all(
        math.isclose(first[s], second[s], rel_tol=SAME_LOSS, abs_tol=1e-9) for s in shared
    )


def _listed(names: Sequence[str]) -> str:
    """ "a", "a and b", "a, b and c"."""
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _offset(i: int, curves: int, every: int, points: int) -> int:
    """The index of curve ``i``'s first marker: ``i``/``curves`` of the way into the
    spacing ``every``, so that no two curves mark one step; a curve too short for its
    offset marks a point of its own instead (where curves of a few points must share)."""
    offset = i * every // curves
    return offset if offset < points else i % max(1, points)


def _differs(label: Sequence[str], other: Sequence[str]) -> str:
    """``other`` as it reads beside ``label``: its parts ``label`` lacks (the whole of it
    where there are none)."""
    own = set(label)
    return " · ".join(p for p in other if p not in own) or " · ".join(other)


def loss_figure(curves: Sequence[tuple[pd.Series, Any]], finished: int | None = None) -> Figure:
    """Loss per step of each curve ((its row, its [step, loss] history)), at most
    ``MAX_LINES``; ``finished``: how many cells there are, where more than are drawn.

    Curves that overlap stay apart: each has its own dash and marker shape, and its
    markers sit at steps no other curve marks (the same spacing, a curve's own offset).
    Curves equal at every step they share say so in the legend ("same loss as …"),
    and the first of them is drawn wide and pale beneath the others.
    """
    shown = list(curves[:MAX_LINES])
    frame = pd.DataFrame([row for row, _ in shown]).reset_index(drop=True)
    lead = ("scenario",) if "scenario" in frame.columns else ()
    parts = _label_parts(frame, lead=lead)
    histories = [history for _, history in shown]
    twins: list[list[int]] = [
        [j for j in range(len(shown)) if j != i and _same_loss(histories[i], histories[j])]
        for i in range(len(shown))
    ]
    longest = max(len(h) for h in histories)
    every = max(len(shown), math.ceil(longest / MARKERS))
    fig, ax = plt.subplots(figsize=(10, 5.5 + 0.2 * len(shown)), dpi=DPI)
    for i, history in enumerate(histories):
        label = " · ".join(parts[i])
        if twins[i]:
            label += f" (same loss as {_listed([_differs(parts[i], parts[j]) for j in twins[i]])})"
        # the first of identical curves lies wide beneath the later ones, which draw over it
        under = bool(twins[i]) and twins[i][0] > i
        ax.plot(
            [h[0] for h in history],
            [h[1] for h in history],
            color=COLORS[i % len(COLORS)],
            linestyle=LINESTYLES[i % len(LINESTYLES)],
            marker=MARKER_SHAPES[i % len(MARKER_SHAPES)],
            # staggered: no two curves put a marker on the same step
            markevery=(_offset(i, len(shown), every, len(history)), every),
            markersize=6 if under else 4.5,
            linewidth=3.0 if under else 1.2,
            alpha=0.45 if under else 1.0,
            zorder=2 if under else 3,
            label=label,
        )
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("training loss")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    total = finished if finished is not None else len(shown)
    extra = f" (the first {len(shown)} of {total} cells)" if total > len(shown) else ""
    ax.set_title("Loss curves" + extra, fontsize=11)
    ax.grid(alpha=0.3)
    _legend_below(fig, ax, len(shown))
    _widen_to_legend(fig, ax)
    return fig


#: the files ``write_all`` writes into the plots folder
PLOT_NAMES = (
    "throughput.png",
    "throughput_hf_estimate.png",
    "memory.png",
    "scaling.png",
    "loss.png",
    "energy.png",
)


def write_all(report: ReportTables, folder: Path, *, source: Path | None = None) -> list[Path]:
    """Every plot there is something to draw for; ``report.plot_notes`` gets a line per
    plot, what it shows or why it was not drawn. A plot of ``PLOT_NAMES`` not drawn
    this time is removed, so that none is left from an earlier report."""
    written: list[Path] = []
    notes = report.plot_notes
    cells = report.cells
    if cells.empty:
        notes.append("no plots: the source has no cells")
        return written

    def draw(name: str, figure: Figure | None, shows: str, not_drawn: str | None) -> None:
        """Save ``figure`` as ``name`` and note what it shows; else note why it is not
        drawn (``not_drawn``: None, no note)."""
        if figure is not None:
            written.append(_save(figure, folder / name))
            notes.append(f"`plots/{name}`: {shows}")
        elif not_drawn is not None:
            notes.append(f"`plots/{name}`: not drawn, {not_drawn}")

    draw(
        "throughput.png",
        throughput_figure(cells),
        "measured tokens/s per cell",
        "no cell has a measured tokens/s",
    )
    draw(
        "throughput_hf_estimate.png",
        hf_estimate_figure(cells) if shows_hf_estimate(cells) else None,
        "HF Trainer's estimate (`train_tokens_per_second`), drawn apart from measured throughput",
        None,
    )
    hatched = (
        "failed_peak_memory_bytes" in cells.columns
        and cells["failed_peak_memory_bytes"].notna().any()
    )
    draw(
        "memory.png",
        memory_figure(cells, report.capacity, report.rows),
        "peak memory per cell" + ("; hatched, the memory a failed run reached" if hatched else ""),
        "no cell has a memory figure",
    )
    # a table without a device column ran on GPUs
    unit = worker(ran_on_cpu(cells))
    draw(
        "scaling.png",
        scaling_figure(report.scaling),
        f"scaling efficiency against the {unit} count",
        f"no family of cells has a measured tokens/s at two or more {unit} counts",
    )
    curves, finished = _loss_curves(report.rows, source, report.runs) if source else ([], 0)
    draw(
        "loss.png",
        loss_figure(curves, finished) if curves else None,
        "loss per optimizer step",
        "no finished run left a loss history"
        + ("" if source is not None and (source / "runs").is_dir() else " (no runs/ folder)"),
    )
    draw(
        "energy.png",
        frontier_figure(cells),
        "tokens/s against joules per token per cell, the efficient frontier filled and joined",
        "no cell has both tokens/s and joules per token (the Energy section says why)"
        if shows_energy(cells)
        else None,
    )
    # a plot an earlier report drew and this one does not would show figures of then
    for stale in PLOT_NAMES:
        if folder / stale not in written:
            (folder / stale).unlink(missing_ok=True)
    return written
