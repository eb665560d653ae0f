"""A summary CSV opened by ``#`` lines (where it came from, its licence) reads as its rows."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.contract.errors import UserError
from orchestrator.results import collect, recommend
from orchestrator.results.report import CostSettings, build_report

REPO = Path(__file__).resolve().parents[2]
#: fms-acceleration's published A100 table, with a comment header saying where it is from
PUBLISHED = REPO / "benchmarks" / "fixtures" / "fms_acceleration_a100_80gb.csv"


def test_a_commented_predecessor_table_is_reported_row_for_row() -> None:
    comments = sum(1 for line in PUBLISHED.read_text().splitlines() if line.startswith("#"))
    assert comments > 0
    rows = [line for line in PUBLISHED.read_text().splitlines()[comments + 1 :] if line]
    report = build_report(PUBLISHED, CostSettings())
    assert len(report.rows) == len(rows) == len(collect.load(PUBLISHED))
    assert all(isinstance(c, str) for c in report.rows.columns)
    ok = int((report.rows["status"] == "ok").sum())
    assert 0 < ok < len(rows)
    # its figures are HF's estimates only: ok cells, but nothing measured to recommend
    assert recommend.markdown(report.cells)[2] == (
        f"No cell has a measured tokens/s ({ok} of {len(report.cells)} cell(s) finished ok; "
        "HF's estimate is not a measurement): nothing to recommend."
    )


def test_a_row_longer_than_the_header_is_one_line(tmp_path: Path) -> None:
    table = tmp_path / "raw_summary.csv"
    table.write_text("# made by hand\nmodel_name_or_path,num_gpus\nm,1\nm,2,extra\n")
    with pytest.raises(
        UserError, match=r"data row 2 has more fields than the header has columns \(2\)$"
    ):
        collect.raw_rows(table)
