"""summary.md's section on memory predicted before launch, against what each cell measured.

The run's check predicted each GPU cell's peak (``orchestrator.running.memoryfit``)
and wrote it into the folder's ``plan.csv`` (``predicted_*``). Here each cell's
prediction (torch's peak allocated, the reserved and NVML figures it implies,
and its largest term) stands beside the median of its ok runs'
``torch_max_memory_allocated_bytes``, ``torch_max_memory_reserved_bytes`` and
NVML peak. Where the two differ by more than ``TOLERANCE`` the section says so
plainly: the terms are the prediction's account, not the run's. A cell pruned
before launch says so; a folder whose ``plan.csv`` has no prediction (a CPU
matrix, an older run) has no such section.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from orchestrator.contract.columns import NVML_PEAK, TORCH_RESERVED_PEAK
from orchestrator.contract.gpumemory import NVML_LOWER_BOUND, TOLERANCE, gb, nvml_text, part_of
from orchestrator.contract.outcome import is_pruned
from orchestrator.results.mdtable import md_table
from orchestrator.results.tablecolumns import measured, numeric

TORCH_ALLOCATED_PEAK = "torch_max_memory_allocated_bytes"
#: the plan.csv columns the section reads
_PREDICTED = (
    "predicted_peak_bytes",
    "predicted_reserved_bytes",
    "predicted_nvml_bytes",
    "predicted_largest_term",
    "predicted_largest_term_bytes",
    "memory_verdict",
    "memory_prediction_error",
    "device_memory_bytes",
    "predicted_nvml_lower_bound",
)


def _predictions(source: Path) -> pd.DataFrame | None:
    """The folder's predictions, one row per cell; None where it has none."""
    path = source / "plan.csv"
    if not path.is_file():
        return None
    try:
        plan = pd.read_csv(path, dtype=str, keep_default_na=False)
    except (OSError, ValueError, pd.errors.ParserError):
        return None
    if "predicted_peak_bytes" not in plan.columns or "cell_id" not in plan.columns:
        return None
    plan = plan.drop_duplicates("cell_id").set_index("cell_id")
    kept: pd.DataFrame = plan[[c for c in _PREDICTED if c in plan.columns]]
    return kept


def _number(value: object) -> float | None:
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return None if number != number else number


def _apart(predicted: float, measured_value: float) -> float:
    return abs(predicted - measured_value) / measured_value


def predicted_memory_markdown(rows: pd.DataFrame, source: Path) -> list[str]:
    """The section (see the module's docstring); nothing without predictions."""
    predictions = _predictions(source) if source.is_dir() else None
    if predictions is None or "cell_id" not in rows.columns:
        return []
    predictions = predictions[predictions.index.isin(rows["cell_id"].astype(str))]
    if predictions.empty:
        return []
    ok = rows[measured(rows)]
    figures = pd.DataFrame(
        {
            "allocated": numeric(ok, TORCH_ALLOCATED_PEAK),
            "reserved": numeric(ok, TORCH_RESERVED_PEAK),
            "nvml": numeric(ok, NVML_PEAK),
            "cell_id": ok["cell_id"].astype(str),
        }
    )
    measured_by_cell = figures.groupby("cell_id").median()
    pruned = {
        str(r["cell_id"])
        for r in rows.to_dict("records")
        if is_pruned(r.get("status"), r.get("error"))
    }
    got_by_cell = measured_by_cell.to_dict("index")
    body, notes = [], []
    bounded = False
    for cell, p in predictions.to_dict("index").items():
        peak = _number(p.get("predicted_peak_bytes"))
        if peak is None:
            notes.append(f"- {cell}: not predicted ({p.get('memory_prediction_error') or '?'})")
            continue
        got = got_by_cell.get(cell, {})
        allocated = _number(got.get("allocated"))

        bound = str(p.get("predicted_nvml_lower_bound") or "").lower() == "true"
        bounded = bounded or bound

        def pair(
            kind: str,
            column: str,
            got: dict[str, Any] = got,
            p: dict[str, Any] = p,
            bound: bool = bound,
        ) -> str:
            value, seen = _number(p.get(column)), _number(got.get(kind))
            shown = nvml_text(value, bound and kind == "nvml")
            return f"{shown} / {gb(seen) if seen is not None else '-'}"

        term = _number(p.get("predicted_largest_term_bytes"))
        largest = (
            f"{p.get('predicted_largest_term')}: {part_of(term, peak)}" if term is not None else ""
        )
        body.append(
            [
                str(cell),
                pair("allocated", "predicted_peak_bytes"),
                pair("reserved", "predicted_reserved_bytes"),
                pair("nvml", "predicted_nvml_bytes"),
                largest,
            ]
        )
        if p.get("memory_verdict") == "close":
            nvml, device = (
                _number(p.get("predicted_nvml_bytes")),
                _number(p.get("device_memory_bytes")),
            )
            notes.append(
                f"- {cell}: close to the limit: predicted {gb(nvml or 0)} on NVML of the "
                f"device's {(device or 0) / 2**30:.0f} GiB"
            )
        if cell in pruned:
            notes.append(f"- {cell}: pruned before launch, predicted {gb(peak)}: not measured")
        elif allocated is None:
            notes.append(f"- {cell}: no ok run measured torch's peak, nothing to set it against")
        elif _apart(peak, allocated) > TOLERANCE:
            notes.append(
                f"- {cell}: predicted {gb(peak)} of torch allocation, measured "
                f"{gb(allocated)}: {_apart(peak, allocated):.0%} apart, more than "
                f"{TOLERANCE:.0%}. The prediction's terms do not account for this run."
            )
    if not body:
        return ["", "## Memory: predicted before launch, and measured", "", *notes]
    return [
        "",
        "## Memory: predicted before launch, and measured",
        "",
        "Each GPU cell's training step was predicted before launch on fake tensors (its "
        "model, loss, optimizer and checkpointing; `tunematrix plan --memory`). Predicted / "
        f"measured (the median of its ok runs); torch allocated within {TOLERANCE:.0%} unless "
        "said below.",
        "",
        *md_table(
            ["cell", "torch allocated", "torch reserved", "NVML", "largest predicted term"], body
        ),
        *(["", *notes] if notes else []),
        *(["", NVML_LOWER_BOUND] if bounded else []),
    ]
