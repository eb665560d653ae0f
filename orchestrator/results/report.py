"""The report: read a results folder (or a summary CSV), write its tables and plots.

Pure over files: it reads a results folder (or a summary CSV) and writes
``raw_summary.csv`` (rebuilt from the run folders), ``benchmarks.csv`` (one
row per cell, repeats aggregated, constant columns dropped), ``summary.md``
and ``plots/``. It needs pandas and matplotlib, never the training stack.

The rooms: ``rows`` (raw_summary.csv), ``collect`` (reading sources),
``aggregate`` (derived columns, cells, scaling), ``capacity`` (device memory,
likely OOM), ``markdown`` (summary.md), ``plots``; the columns themselves are
declared in ``orchestrator.contract.columns``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from orchestrator.contract import columns as registry
from orchestrator.contract.layout import ResultsLayout, write_atomic
from orchestrator.results import collect, equivalence
from orchestrator.results.aggregate import (
    CostSettings,
    add_derived,
    aggregate,
    benchmarks_table,
    scaling,
)
from orchestrator.results.capacity import (
    GIB,
    Capacity,
    cells_likely_oom,
    mark_likely_oom,
    resolve_capacity,
)
from orchestrator.results.drift import add_position_trend
from orchestrator.results.envfile import cost_from_env
from orchestrator.results.markdown import status_counts, summary_markdown
from orchestrator.results.rows import to_csv
from orchestrator.results.runrecords import RunRecords

# The report's API for the rest of the project (the CLI, api, the runner).
__all__ = [
    "GIB",
    "CostSettings",
    "Report",
    "add_derived",
    "aggregate",
    "build_report",
    "cost_from_env",
    "status_counts",
    "write_report",
]


@dataclass
class Report:
    """A report's tables (``ReportTables``), and what was written."""

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
    #: what the read kept of each run: swept values, max_steps, loss history (runrecords)
    runs: RunRecords | None = None
    #: one line per run file that could not be read: ``runs/<id>/result.json unreadable
    #: (<reason>); its row reads failed`` (``collect.rows_from_folder``)
    warnings: list[str] = field(default_factory=list)


def derived_columns() -> tuple[str, ...]:
    """The columns the report adds to each raw row (declared with source ``derived``)."""
    return tuple(c.name for c in registry.select(source="derived"))


def build_report(
    source: Path,
    cost: CostSettings,
    rows: list[dict[str, Any]] | None = None,
    *,
    gpu_memory_bytes: float | None = None,
    loss_tolerance: float = equivalence.DEFAULT_TOLERANCE,
) -> Report:
    """The report of ``source``; ``rows`` (a run's own) replace what is read from disk.

    ``gpu_memory_bytes``: one device's memory, when the source does not say it.
    ``loss_tolerance``: the loss gap past which a variant differs from its baseline.
    """
    runs = RunRecords(source)  # filled by the read: no run's files are read again
    warnings: list[str] = []  # the files the read found unreadable, from the same read
    if rows is None:
        rows, predecessor = collect.raw_rows(source, runs, warnings)
    else:
        predecessor = False
    table = add_derived(collect.normalise(pd.DataFrame(rows), predecessor=predecessor), cost)
    capacity = resolve_capacity(source, table, gpu_memory_bytes)
    table = mark_likely_oom(table, capacity)
    cells = cells_likely_oom(aggregate(table), table)
    cells = add_position_trend(cells, table)  # the trend of tokens/s with run order
    # each variant's loss curve against its scenario's baseline (results/equivalence.py)
    cells = equivalence.add_equivalence(cells, table, source, loss_tolerance, runs)
    report = Report(
        rows=table,
        cells=cells,
        scaling=scaling(cells),
        capacity=capacity,
        runs=runs,
        warnings=warnings,
    )
    report.raw = _raw_with_derived(rows, table)
    return report


def _raw_with_derived(rows: list[dict[str, Any]], table: pd.DataFrame) -> list[dict[str, Any]]:
    """The rows as read (their own number formats), plus status and the derived columns."""
    out = []
    wanted = ("status", "error", *derived_columns())
    extra = table[[c for c in wanted if c in table.columns]]
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
    loss_tolerance: float = equivalence.DEFAULT_TOLERANCE,
    rank_by: str = "speed",
) -> Report:
    """Read ``source`` (or take a run's ``rows``), write the tables and plots into ``output``.

    ``gpu_memory_bytes``: one device's memory, when the source does not say it;
    ``rank_by``: what the recommendation ranks by (``recommend.RANK_BY``).
    """
    report = build_report(
        source, cost, rows, gpu_memory_bytes=gpu_memory_bytes, loss_tolerance=loss_tolerance
    )
    output.mkdir(parents=True, exist_ok=True)
    layout = ResultsLayout(output)
    write_atomic(layout.raw_summary, to_csv(report.raw))
    write_atomic(layout.benchmarks, benchmarks_table(report.cells).to_csv(index=False))
    if not report.scaling.empty:
        write_atomic(layout.scaling_csv, report.scaling.to_csv(index=False))
        report.written.append(layout.scaling_csv)
    if plots:
        from orchestrator.results import plots as plotting

        report.written += plotting.write_all(report, layout.plots, source=source)
    write_atomic(
        layout.summary_md,
        summary_markdown(report, source, cost, loss_tolerance=loss_tolerance, rank_by=rank_by),
    )
    report.written = [layout.raw_summary, layout.benchmarks, layout.summary_md, *report.written]
    return report
