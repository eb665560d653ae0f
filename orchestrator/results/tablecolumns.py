"""What a column of a table is: a key, a measured output, or a scenario argument.

Tables come with columns we declare (``orchestrator.contract.columns``) and
columns we do not: the scenario arguments, swept or not, and the outputs and
bookkeeping of other tables (the predecessor's ``epoch``). Cells group on the
key columns and the arguments, never on an output; compare matches rows the
same way.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import pandas as pd

from orchestrator.contract import columns as registry
from orchestrator.contract.outcome import MEASURED, never_launched, shown
from orchestrator.contract.wording import on_cpu

#: columns a cell has besides the declared ones: how many repeats, how many ok
CELL_COUNTS = ("repeats", "repeats_ok")
#: the order of a scenario's cells in summary.md's tables and in the plots' legends
CELL_ORDER = registry.with_role("cell_order")
#: columns the report adds to cells for its own tables and plots, never written to a CSV
REPORT_ONLY_COLUMNS = ("likely_oom", "failed_peak_memory_bytes")
#: the columns ``add_equivalence`` gives the cells: each variant's loss against its
#: scenario's baseline (orchestrator/results/equivalence.py; ``loss_*``: outputs, never keys)
LOSS_COLUMNS = (
    "loss_baseline",
    "loss_steps_compared",
    "loss_gap_pct",
    "loss_max_gap_pct",
    "loss_vs_baseline",
)
#: figures the report computes per cell from its runs, never per run: the trend of
#: tokens/s with the run's position in the plan's order (orchestrator/results/drift.py),
#: and the loss against the baseline
CELL_ONLY_FIGURES = ("position_trend_pct", *LOSS_COLUMNS)
#: the predecessor's columns that are no configuration and that no column of ours declares:
#: measured outputs, and bookkeeping (its row position, output folder, config file path)
PREDECESSOR_NOT_CONFIG = frozenset(
    {
        "epoch",
        "error_messages",
        "index",
        "output_dir",
        "framework_config_file",
        "acceleration_framework_config_file",
    }
)
#: name patterns of measured outputs (HF's ``train_*``/``eval_*`` metrics, memory, cost, time)
OUTPUT_PREFIXES = ("train_", "eval_", "mem_", "loss_", "cost_", "time_", "tokens_", "step_time")
OUTPUT_SUFFIXES = ("_per_second", "_bytes", "_usd", "_tflops_per_device")


def is_output(column: str) -> bool:
    """Whether ``column`` is a measured output or bookkeeping (so never a key), not configuration.

    That is: every declared column but the key columns (figures, outcome and
    sidecar columns, derived ones), the predecessor's ``epoch``,
    ``error_messages``, ``index``, ``output_dir`` and config file path, and
    names shaped like outputs (``train_*``, ``mem_*``, ``*_per_second``, ``*_bytes``…).
    """
    declared = registry.find(column)
    if declared is not None:
        return declared.output
    if column in PREDECESSOR_NOT_CONFIG or column in CELL_ONLY_FIGURES:
        return True
    return column.startswith(OUTPUT_PREFIXES) or column.endswith(OUTPUT_SUFFIXES)


def known_columns() -> frozenset[str]:
    """Every column a row or cell of ours can have that is no scenario argument."""
    return (
        registry.names(aliases=True)
        | set(registry.spread_columns())
        | set(CELL_COUNTS)
        | set(REPORT_ONLY_COLUMNS)
        | set(CELL_ONLY_FIGURES)
    )


def argument_columns(df: pd.DataFrame) -> list[str]:
    """Columns that are neither keys nor figures we declare: scenario arguments, and
    outputs of other tables we have no declaration for (the predecessor's ``epoch``);
    ``config_columns`` leaves the latter out."""
    known = known_columns()
    return [c for c in df.columns if c not in known and not c.startswith("mem_")]


def config_columns(df: pd.DataFrame) -> list[str]:
    """The scenario arguments of ``df``: never a measured output (``is_output``)."""
    return [c for c in argument_columns(df) if not is_output(c)]


def other_outputs(df: pd.DataFrame) -> list[str]:
    """Outputs of ``df`` that no column of ours declares (the predecessor's ``epoch``…)."""
    return [c for c in argument_columns(df) if is_output(c)]


def _by_status(rows: pd.DataFrame, test: Callable[[Any, Any], Any]) -> pd.Series:
    errors = rows["error"] if "error" in rows.columns else pd.Series(None, index=rows.index)
    # a test per distinct status and error, not per row: most rows share both
    found: dict[tuple[Any, Any], Any] = {}
    out = []
    for pair in zip(rows["status"], errors, strict=True):
        try:
            value = found[pair]
        except KeyError:
            value = found[pair] = test(*pair)
        except TypeError:  # an unhashable cell
            value = test(*pair)
        out.append(value)
    return pd.Series(out, index=rows.index, dtype=object)


def measured(rows: pd.DataFrame) -> pd.Series:
    """Which rows' figures count: ok, or kept from an earlier ok run on resume (not pruned,
    not spared after its model's repeated failure)."""
    return rows["status"].isin(MEASURED) & ~_by_status(rows, never_launched).astype(bool)


def status_labels(rows: pd.DataFrame) -> pd.Series:
    """Each row's status, with the experiments skipped without running named for why
    (``pruned``, ``spared``; ``outcome.shown``); a row without a status stays empty."""
    return _by_status(rows, lambda s, e: shown(s, e) if isinstance(s, str) else None)


def shown_status(rows: pd.DataFrame) -> pd.Series:
    """Each row's status as tables show it: ``skipped`` (kept from an earlier run) as ok,
    a pruned one as ``pruned``, a spared one as ``spared``."""
    return status_labels(rows).fillna("unknown").astype(str).replace({"skipped": "ok"})


def numeric(df: pd.DataFrame, column: str) -> pd.Series:
    """``column`` of ``df`` as numbers: NaN where a cell is missing or no number, or
    everywhere when ``df`` has no such column."""
    if column not in df.columns:
        return pd.Series([math.nan] * len(df), index=df.index, dtype=float)
    return pd.to_numeric(df[column], errors="coerce")


def ran_on_cpu(frame: pd.DataFrame | pd.Series | Mapping[Any, Any]) -> bool:
    """Whether every cell of ``frame`` (a table, or one cell's row) ran on the CPU, by its
    ``device`` column; a table without one (written before it existed) ran on GPUs."""
    device = frame.get("device")
    if device is None:
        return False
    return on_cpu(device if isinstance(device, pd.Series) else [device])
