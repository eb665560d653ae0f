"""A table's rows as mappings, each column turned into Python values once, when first read.

``DataFrame.to_dict("records")`` boxes every value of every column: over a
cells table of 5,000 cells and 150 columns, three quarters of a million values,
for sections that read a dozen of them. ``records(frame)`` gives the same rows,
each a read-only mapping of the same keys and values (numbers as Python
numbers, as ``to_dict`` makes them), but a column is made into Python values
only when a row is first asked for it, and then for every row at once, so a
section costs the columns it reads, however many rows and groups it walks.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import pandas as pd


class _Columns:
    """The columns of one table, each a list of Python values once asked for."""

    def __init__(self, frame: pd.DataFrame) -> None:
        self.frame = frame
        # a repeated name reads its last column, as to_dict's mappings do
        self.position = {name: i for i, name in enumerate(frame.columns)}
        self.values: dict[Any, list[Any]] = {}

    def column(self, name: Any) -> list[Any]:
        values = self.values.get(name)
        if values is None:
            i = self.position[name]  # KeyError: no such column
            series = self.frame.iloc[:, i]
            if series.dtype == np.dtype(object) or isinstance(
                series.dtype, pd.api.extensions.ExtensionDtype
            ):
                # boxed as to_dict boxes them (NumPy scalars, missing values)
                values = list(series.reset_index(drop=True).to_dict().values())
            else:
                # iterating a NumPy column gives Python numbers, as to_dict does
                values = list(series)
            self.values[name] = values
        return values


class Record(Mapping[Any, Any]):
    """One row of a table, read column by column (``records``)."""

    __slots__ = ("_columns", "_row")

    def __init__(self, columns: _Columns, row: int) -> None:
        self._columns = columns
        self._row = row

    def __getitem__(self, key: Any) -> Any:
        try:
            return self._columns.values[key][self._row]
        except KeyError:
            return self._columns.column(key)[self._row]

    def get(self, key: Any, default: Any = None) -> Any:
        try:
            return self._columns.values[key][self._row]
        except KeyError:
            if key not in self._columns.position:
                return default
            return self._columns.column(key)[self._row]

    def __iter__(self) -> Iterator[Any]:
        return iter(self._columns.position)

    def __len__(self) -> int:
        return len(self._columns.position)

    def __repr__(self) -> str:
        return f"Record({dict(self)!r})"


def records(frame: pd.DataFrame) -> list[Record]:
    """The rows of ``frame`` in order, as ``frame.to_dict("records")`` has them."""
    return Records(frame).rows()


class Records:
    """A table whose parts (its groups, their sorted rows, a filter of them) are read as
    records of the whole: each column is made once, whatever the number of parts."""

    def __init__(self, frame: pd.DataFrame) -> None:
        self._columns = _Columns(frame)
        self._index = frame.index

    def rows(self, part: pd.DataFrame | None = None) -> list[Record]:
        """The rows of ``part`` (rows of the table, in any order; default: all of it)."""
        if part is None:
            return [Record(self._columns, i) for i in range(len(self._index))]
        positions = self._index.get_indexer(part.index) if self._index.is_unique else None
        if positions is None or (positions < 0).any():
            # rows told apart only by position, or not the table's: read on their own
            return records(part)
        return [Record(self._columns, int(i)) for i in positions]
