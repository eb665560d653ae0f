"""``compare --across``: one results folder's values of a key (environments, by default)
compared with one another, each against a baseline value, matched on every other key."""

from __future__ import annotations

import pandas as pd

from orchestrator.contract.errors import UserError
from orchestrator.contract.wording import signed_change
from orchestrator.results.compare import Comparison, cell_label, compare, short_number
from orchestrator.results.envtables import COLUMN, labels, named


def compare_across(
    rows: pd.DataFrame,
    *,
    across: str = COLUMN,
    baseline: str | None = None,
    metrics: list[str] | None = None,
    threshold: float = 0.1,
) -> tuple[Comparison, str, list[str]]:
    """One results folder's ``across`` values (environments, by default) compared with
    one another: ``baseline`` (default: the first) as the reference, each other value as
    a new run, matched on every other key. Returns one comparison of them all (its first
    key is ``across``, the candidate's value), the baseline and the candidates."""
    if across not in rows.columns:
        raise UserError(f"the results have no column '{across}' to compare across")
    values = named(rows, across)
    if len(values) < 2:
        found = ", ".join(values) or "none"
        raise UserError(
            f"--across {across}: the results hold {len(values)} value(s) of it ({found}); "
            "it takes at least two"
        )
    baseline = values[0] if baseline is None else baseline
    if baseline not in values:
        raise UserError(
            f"--baseline {baseline}: not a value of {across} here; values: {', '.join(values)}"
        )
    candidates = [v for v in values if v != baseline]
    text = rows[across].astype(str)
    ref = rows[text == baseline].drop(columns=[across])
    parts: list[Comparison] = []
    for value in candidates:
        part = compare(
            rows[text == value].drop(columns=[across]), ref, metrics=metrics, threshold=threshold
        )
        for frame in (part.table, part.only_new, part.only_ref):
            frame.insert(0, across, value)
        parts.append(part)
    first = parts[0]
    notes = list(dict.fromkeys(n for p in parts for n in p.notes))
    if across == COLUMN:
        by_env = labels(rows)
        notes.insert(
            0,
            "versions that differ: "
            + "; ".join(f"{name}: {by_env.get(name, '?')}" for name in [baseline, *candidates]),
        )
    return (
        Comparison(
            table=pd.concat([p.table for p in parts], ignore_index=True),
            keys=[across, *first.keys],
            only_new=pd.concat([p.only_new for p in parts], ignore_index=True),
            only_ref=pd.concat([p.only_ref for p in parts], ignore_index=True),
            metrics=first.metrics,
            notes=notes,
        ),
        baseline,
        candidates,
    )


def across_lines(result: Comparison, across: str = COLUMN) -> list[str]:
    """What ``compare --across`` prints per matched cell and metric: each candidate's
    median against the baseline's, side by side."""
    table = result.table
    if table.empty:
        return []
    keys = [k for k in result.keys if k != across]
    out = []
    for row in table[table["metric"] != "status"].to_dict("records"):
        change = row.get("change")
        shown = "" if change is None or change != change else f" ({signed_change(change)})"
        out.append(
            f"  {row[across]} vs baseline: {cell_label(row, keys)}: {row['metric']} "
            f"{short_number(row['new'])} vs {short_number(row['ref'])}{shown}"
        )
    return out
