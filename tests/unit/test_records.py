"""``results.records``: rows as ``to_dict("records")`` has them, a column boxed once when read;
``contract.jsonio``: the run records read alike with orjson and without."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from orchestrator.contract import jsonio
from orchestrator.results import records as records_module
from orchestrator.results.records import Records, records


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and (a is b or a == b)


def test_rows_read_as_to_dict_makes_them() -> None:
    frame = pd.DataFrame(
        {
            "float": [1.0, None, 2.5],
            "int": [1, 2, 3],
            "text": ["x", None, "z"],
            "mixed": [np.float64(1.5), np.int64(3), "s"],
            "when": pd.to_datetime(["2024-01-01", None, "2024-01-02"]),
            "nullable": pd.array([1, None, 3], dtype="Int64"),
            "flag": [True, False, True],
            "span": [np.timedelta64(5, "s"), None, np.bool_(False)],
        }
    )
    expected = frame.to_dict("records")
    got = records(frame)
    assert len(got) == len(expected)
    for want, row in zip(expected, got, strict=True):
        assert list(row) == list(want) and len(row) == len(want)
        for key in want:
            assert _same(want[key], row[key]), (key, want[key], row[key])
        assert row.get("no such column") is None
        assert "text" in row and "no such column" not in row


def test_a_column_is_boxed_once_whatever_the_rows_and_groups(monkeypatch) -> None:
    """Growth by counting: the columns read are made into Python values once each,
    over every row of a table; columns never read are never made."""
    boxed: list[Any] = []
    real = records_module._Columns.column

    def counted(self: Any, name: Any) -> list[Any]:
        if name not in self.values:
            boxed.append(name)
        return real(self, name)

    monkeypatch.setattr(records_module._Columns, "column", counted)
    for n in (3, 3000):
        boxed.clear()
        frame = pd.DataFrame({f"c{i}": range(n) for i in range(150)})
        rows = records(frame)
        total = sum(r["c1"] + r["c7"] for r in rows) + sum(r["c1"] for r in rows)
        assert total == 3 * n * (n - 1) // 2
        assert boxed == ["c1", "c7"]


def test_the_parts_of_a_table_read_as_its_rows() -> None:
    """A group, a sorted group, a filter: the same rows as their own to_dict; rows that
    are not the table's, or a table whose index repeats, are read on their own."""
    frame = pd.DataFrame(
        {"g": ["a", "b", "a", "b"], "v": [1.5, 2.5, 3.5, 0.5]}, index=["w", "x", "y", "z"]
    )
    table = Records(frame)
    for _, group in frame.groupby("g"):
        part = group.sort_values("v", ascending=False)
        assert [dict(r) for r in table.rows(part)] == part.to_dict("records")
    other = pd.DataFrame({"g": ["c"], "v": [9.0]}, index=["q"])
    assert [dict(r) for r in table.rows(other)] == [{"g": "c", "v": 9.0}]
    repeated = frame.set_axis(["w", "w", "y", "z"])
    part = repeated.iloc[[1, 0]]
    assert [dict(r) for r in Records(repeated).rows(part)] == part.to_dict("records")


def test_run_records_read_alike_with_and_without_orjson(tmp_path: Path, monkeypatch) -> None:
    texts = {
        "plain.json": json.dumps({"a": 1, "b": [0.1, 2e-9, "é"], "c": None, "d": True}),
        # what Python's json.dumps writes and orjson refuses
        "nan.json": json.dumps({"loss": float("nan"), "top": float("inf")}),
        "list.json": "[1, 2]",
        "broken.json": '{"a": ',
        "surrogate.json": '{"a": "\\ud800"}',
    }
    for name, text in texts.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    (tmp_path / "latin1.json").write_bytes(b'{"a": "\xe9"}')
    names = [*texts, "latin1.json", "missing.json"]

    def read_all() -> list[Any]:
        return [jsonio.read_json_object(tmp_path / name) for name in names]

    with_orjson = read_all()
    monkeypatch.setattr(jsonio, "orjson", None)
    without = read_all()
    assert repr(with_orjson) == repr(without)
    assert without[0] == {"a": 1, "b": [0.1, 2e-9, "é"], "c": None, "d": True}
    assert math.isnan(without[1]["loss"]) and without[1]["top"] == math.inf
    assert without[2:4] == [None, None]  # not an object, not JSON
    assert without[4] == {"a": "\ud800"}
    assert without[5:] == [None, None]  # not UTF-8, no file


@pytest.mark.skipif(jsonio.orjson is None, reason="orjson is not installed")
def test_orjson_is_used_where_installed(monkeypatch) -> None:
    used = []
    real = jsonio.orjson.loads

    def counted(data: bytes) -> Any:
        used.append(len(data))
        return real(data)

    monkeypatch.setattr(jsonio.orjson, "loads", counted)
    assert jsonio.parse_json(b'{"a": 1}') == {"a": 1}
    assert used == [8]
