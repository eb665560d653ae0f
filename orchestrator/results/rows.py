"""``raw_summary.csv``: one row per planned experiment (and repeat), every status.

A row joins three records: the experiment as planned, the parent's outcome
(status, error, log, wall time, the sidecar's memory figures) and the child's
``result.json`` (the measurements). Every planned experiment gets a row,
including those that failed, ran out of memory, timed out or never started.
What each column is, and where it comes from, is declared once in
``orchestrator.contract.columns``.
"""

from __future__ import annotations

import csv
import io
import json
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.contract import columns as registry
from orchestrator.contract.columns import Column, Source
from orchestrator.contract.layout import write_atomic
from orchestrator.results.envtables import environment_columns


class UndeclaredMetricWarning(UserWarning):
    """A result carries a figure that no column declares, so the tables leave it out."""


#: where a column's value lies: a record (``Source``) and the keys to the mapping in it
_Place = tuple[Source, tuple[str, ...]]


@dataclass(frozen=True)
class _Reader:
    """How to read one column from the records of a run: the first of its ``names``
    in the mapping at its place (``_RowPlan.places``), else, where that is empty or
    falsy and it has one, in the same mapping of its fallback record."""

    name: str
    #: the index of its place, and of its fallback's (None without one)
    place: int
    fallback: int | None
    #: the value's names: its own, then its aliases
    names: tuple[str, ...]

    @property
    def simple(self) -> bool:
        """Whether it has one name and no fallback (most columns): read with one ``get``."""
        return self.fallback is None and len(self.names) == 1


#: a column's read: (column, place, its name there, the reader where it is not simple)
_Step = tuple[str, int, str, _Reader | None]


@dataclass(frozen=True)
class _RowPlan:
    """The registry's columns grouped in the order a row is filled (see ``build_row``),
    each read from a place that is looked up once per row, whatever reads it."""

    #: the registry's columns this plan was made from
    declared: tuple[Column, ...]
    places: tuple[_Place, ...]
    head: tuple[_Step, ...]
    child_metrics: tuple[str, ...]
    child_metric_names: frozenset[str]
    sidecar: tuple[_Step, ...]
    child_record: tuple[_Step, ...]
    outcome: tuple[_Step, ...]

    @classmethod
    def of(cls, declared: tuple[Column, ...]) -> _RowPlan:
        places: dict[_Place, int] = {}

        def reader(column: Column) -> _Reader:
            *parents, last = column.where
            place = places.setdefault((column.source, tuple(parents)), len(places))
            fallback = None
            if column.fallback is not None:
                key = (column.fallback, tuple(parents))
                fallback = places.setdefault(key, len(places))
            return _Reader(column.name, place, fallback, (last, *column.aliases))

        def steps(columns: Iterable[Column]) -> tuple[_Step, ...]:
            readers = [reader(c) for c in columns]
            return tuple((r.name, r.place, r.names[0], None if r.simple else r) for r in readers)

        head = [c for c in declared if c.key or c.aggregate == "evidence" or c.source == "plan"]
        return cls(
            declared=declared,
            head=steps(head),
            child_metrics=tuple(c.name for c in declared if c.child_metric),
            child_metric_names=frozenset(c.name for c in declared if c.child_metric),
            sidecar=steps(c for c in declared if c.source == "sidecar"),
            child_record=steps(c for c in declared if c.source == "child" and not c.child_metric),
            outcome=steps(c for c in declared if c.source == "outcome" and c not in head),
            places=tuple(places),
        )

    def mappings(self, records: Mapping[str, Mapping[str, Any]]) -> list[Mapping[str, Any]]:
        """The mapping at each place in one run's records (empty where there is none)."""
        out: list[Mapping[str, Any]] = []
        for source, parents in self.places:
            record = records[source]
            for key in parents:
                inner = record.get(key)
                record = inner if isinstance(inner, Mapping) else {}
            out.append(record)
        return out


def _first(found: Mapping[str, Any], names: tuple[str, ...]) -> Any:
    for name in names:
        if name in found:
            return found[name]
    return None


def _read(reader: _Reader, mappings: Sequence[Mapping[str, Any]]) -> Any:
    value = _first(mappings[reader.place], reader.names)
    if not value and reader.fallback is not None:
        value = _first(mappings[reader.fallback], reader.names)
    return value


_plan: _RowPlan | None = None


def _row_plan() -> _RowPlan:
    """The plan of the registry as it is now (made again only when it changed)."""
    global _plan
    declared = registry.columns()
    if _plan is None or _plan.declared is not declared:
        _plan = _RowPlan.of(declared)
    return _plan


def warn_undeclared(figures: Mapping[str, Any]) -> list[str]:
    """Warn about figures of a result's ``metrics`` that no column declares (once per
    name and caller); returns their names."""
    unknown = registry.undeclared_metrics(figures)
    for name in unknown:
        warnings.warn(
            f"a run's result reports the metric {name!r}, which no column declares: the "
            "tables leave it out. Declare it in orchestrator/contract/columns.py.",
            UndeclaredMetricWarning,
            stacklevel=3,
        )
    return unknown


def build_row(
    spec: Mapping[str, Any], outcome: Mapping[str, Any], result: Mapping[str, Any] | None
) -> dict[str, Any]:
    """One row: the planned experiment (``Experiment.spec()`` or a run's ``spec.json``),
    the parent's outcome and the child's figures.

    The row is filled record by record, in this order: the experiment and its
    verdict (the key columns, error and log), the swept values, the child's
    metrics, the sidecar's memory figures, the rest of the child's record (where
    there is a result, or the column has another source), the parent's
    bookkeeping, and last every scenario argument by its own name. A metric the
    registry does not declare is left out, with a warning.
    """
    plan = _row_plan()
    memory = outcome.get("memory")
    places = plan.mappings(
        {
            "plan": spec,
            "outcome": outcome,
            "sidecar": memory if isinstance(memory, Mapping) else {},
            "child": result or {},
        }
    )
    # a simple column (one name, no fallback: most) is one get, the others _read
    row: dict[str, Any] = {
        name: places[at].get(key) if r is None else _read(r, places)
        for name, at, key, r in plan.head
    }
    for key, value in (spec.get("swept") or {}).items():
        row.setdefault(key, value)
    figures = (result or {}).get("metrics") or {}
    for name in plan.child_metrics:
        if name in figures and name not in row:
            row[name] = figures[name]
    if not figures.keys() <= plan.child_metric_names:
        warn_undeclared(figures)
    for name, at, key, r in plan.sidecar:
        row[name] = places[at].get(key) if r is None else _read(r, places)
    for name, at, key, r in plan.child_record:
        if result or (r is not None and r.fallback is not None):
            row[name] = places[at].get(key) if r is None else _read(r, places)
    for name, at, key, r in plan.outcome:
        row[name] = places[at].get(key) if r is None else _read(r, places)
    # every scenario argument, by its own name (those already shown above are not repeated)
    for key, value in (spec.get("arguments") or {}).items():
        row.setdefault(key, value)
    environment_columns(row, result)
    return row


def column_order(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The registry's columns first, then every other column in the order rows have it."""
    seen = dict.fromkeys(registry.raw_columns())
    for row in rows:
        for key in row:
            seen.setdefault(key)
    return list(seen)


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, (list, tuple, dict)):
        return json.dumps(value, sort_keys=True)
    if isinstance(value, float):
        return repr(value)
    return str(value)


#: the types whose text ``_cell`` writes is their ``repr`` (``str`` of an int or a bool is too)
_AS_REPR = frozenset({float, int, bool})


def to_csv(rows: Iterable[Mapping[str, Any]]) -> str:
    rows = list(rows)
    columns = column_order(rows)
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(columns)
    cell, plain = _cell, _AS_REPR
    for row in rows:
        # most cells of a wide table are empty, and many are text or numbers: those
        # written here, as _cell writes them, without a call each
        values = [row.get(c) for c in columns]
        writer.writerow(
            [
                ""
                if v is None
                else v
                if type(v) is str
                else repr(v)
                if type(v) in plain
                else cell(v)
                for v in values
            ]
        )
    return buf.getvalue()


def write_raw_summary(rows: Iterable[Mapping[str, Any]], path: Path) -> None:
    write_atomic(path, to_csv(rows))
