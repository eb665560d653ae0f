"""Environments in the tables: their versions in each row, side by side in summary.md,
and compared against one another (``tunematrix compare RESULTS --across environment``).

An environment (``environments:`` in the scenarios file) is a key column: the
same cell under two interpreters is two cells. Two results folders that ran one
environment each are still compared cell by cell: the environment is a match key
only where a side holds more than one.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pandas as pd

from orchestrator.config.environments import drift, short_labels
from orchestrator.contract import columns as registry
from orchestrator.contract.wording import worker

COLUMN = "environment"
VERSIONS = "environment_versions"
NOTE = "environment_note"
#: the figures summary.md puts side by side, per environment
SIDE_BY_SIDE = registry.with_role("environment_figure")


def versions_of(value: Any) -> dict[str, Any]:
    """An ``environment_versions`` cell as a mapping: a row's own, or its JSON from a CSV."""
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, str) and value.strip().startswith("{"):
        try:
            parsed = json.loads(value)
        except ValueError:
            return {}
        return parsed if isinstance(parsed, dict) else {}
    return {}


def environment_columns(row: dict[str, Any], result: Mapping[str, Any] | None) -> None:
    """Finish a row's environment columns (the versions read from its spec): empty without
    an environment; a note where the run reported other versions than the plan found
    (the interpreter changed between)."""
    planned = versions_of(row.get(VERSIONS))
    row[VERSIONS] = planned or None
    ran = (result or {}).get("versions")
    changed = drift(planned, ran) if planned and isinstance(ran, Mapping) else []
    row[NOTE] = (
        "the run's versions differ from the plan's probe: " + "; ".join(changed)
        if changed
        else None
    )


def named(frame: pd.DataFrame, column: str = COLUMN) -> list[str]:
    """The values of a key column (the environments), in the order its rows have them
    (empty ones left out)."""
    if column not in frame.columns:
        return []
    values = frame[column].dropna().astype(str)
    return list(dict.fromkeys(v for v in values if v.strip() and v.lower() != "nan"))


def _versions(frame: pd.DataFrame) -> dict[str, dict[str, Any]]:
    """Per environment of ``frame``, the versions its first row with any has."""
    versions: dict[str, dict[str, Any]] = {name: {} for name in named(frame)}
    if VERSIONS not in frame.columns:
        return versions
    for name, value in zip(frame[COLUMN].astype(str), frame[VERSIONS], strict=True):
        if name in versions and not versions[name]:
            versions[name] = versions_of(value)
    return versions


def match_on_environment(new: pd.DataFrame, ref: pd.DataFrame) -> tuple[bool, str | None]:
    """Whether compare matches rows on the environment, and a note when it does not.

    Where each side ran one environment (two folders, one interpreter each, or
    ``--across``), the environment is the thing compared, not a key; where a side
    holds several, a cell of one environment meets only its own.
    """
    mine, theirs = named(new), named(ref)
    if not mine or not theirs:
        return False, None
    if len(mine) > 1 or len(theirs) > 1:
        return True, None
    if mine == theirs:
        return True, None
    both = pd.concat(
        [f[[c for c in (COLUMN, VERSIONS) if c in f.columns]] for f in (ref, new)],
        ignore_index=True,
    )
    by_env = labels(both)
    return False, (
        f"environment {theirs[0]} ({by_env[theirs[0]]}) in the reference against "
        f"{mine[0]} ({by_env[mine[0]]}) in the new run: matched without it"
    )


def labels(frame: pd.DataFrame) -> dict[str, str]:
    """Per environment of ``frame``: its versions of the packages that differ between them."""
    return short_labels(_versions(frame))


def _cell_keys(cells: pd.DataFrame, args: Sequence[str]) -> list[str]:
    from orchestrator.results.aggregate import cell_keys

    keys = [k for k in (*cell_keys(), *args) if k in cells.columns and k != COLUMN]
    return [k for k in keys if cells[k].map(str).nunique() > 1 or k in _ALWAYS]


#: what a side-by-side row always names
_ALWAYS = registry.with_role("environment_row")


def _ordered(keys: Sequence[str]) -> list[str]:
    return [*[k for k in _ALWAYS if k in keys], *[k for k in keys if k not in _ALWAYS]]


def _label(row: Mapping[str, Any], keys: Sequence[str]) -> str:
    parts = []
    for k in keys:
        value = row.get(k)
        if value is None or (isinstance(value, float) and math.isnan(value)):
            continue
        if k == "num_gpus":
            unit = worker(str(row.get("device")) == "cpu")
            parts.append(f"{value} {unit}")
        elif k in _ALWAYS:
            parts.append(str(value))
        else:
            parts.append(f"{k}={value}")
    return " · ".join(parts)


def side_by_side_markdown(
    cells: pd.DataFrame,
    args: Sequence[str],
    header: Callable[[str], str],
    figure: Callable[[Mapping[Any, Any], str], str],
) -> list[str]:
    """summary.md's environments section: per cell, each environment's figures side by
    side, headed by the versions that differ. Nothing where the folder has one or none."""
    names = named(cells)
    if len(names) < 2:
        return []
    shown = [name for name in SIDE_BY_SIDE if name in cells.columns and cells[name].notna().any()]
    keys = _ordered(_cell_keys(cells, args))
    versions = _versions(cells)
    by_env = short_labels(versions)
    lines = [
        "",
        "## Environments side by side",
        "",
        "Each cell under each environment; a header names the versions that differ "
        "between the environments.",
        "",
    ]
    from orchestrator.config.environments import versions_text

    lines += [
        f"- **{name}**: {versions_text(versions[name]) or 'versions unknown'}" for name in names
    ]
    headers = ["cell"]
    for figure_name in shown:
        headers += [f"{header(figure_name)}: {name} ({by_env[name]})" for name in names]
    headers.append("status")
    body: list[list[str]] = []
    rows = [{str(k): v for k, v in r.items()} for r in cells.to_dict("records")]
    groups: dict[tuple[str, ...], dict[str, Mapping[str, Any]]] = {}
    firsts: dict[tuple[str, ...], Mapping[str, Any]] = {}
    for row in rows:
        key = tuple(str(row.get(k)) for k in keys)
        groups.setdefault(key, {})[str(row.get(COLUMN))] = row
        firsts.setdefault(key, row)
    for key, by_name in groups.items():
        line = [_label(firsts[key], keys)]
        for figure_name in shown:
            line += [
                figure(by_name[name], figure_name) if name in by_name else "–" for name in names
            ]
        line.append(
            " / ".join(str(by_name[n].get("status")) if n in by_name else "–" for n in names)
        )
        body.append(line)
    lines += ["", "| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in body]
    if NOTE in cells.columns and cells[NOTE].notna().any():
        lines += ["", *[f"- {note}" for note in cells[NOTE].dropna().astype(str).unique()]]
    return lines
