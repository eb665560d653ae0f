"""Throughput against run order: each cell's trend, the whole run's drift, summary.md."""

from __future__ import annotations

import math

import pandas as pd

from orchestrator.contract.outcome import Skip
from orchestrator.results.drift import (
    add_position_trend,
    cell_trends,
    drift_markdown,
    run_drift,
)


def _rows(runs: list[tuple[str, int, float]], status: str = "ok") -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "cell_id": cell,
                "position": position,
                "status": status,
                "error": None,
                "tokens_per_second_global": value,
            }
            for cell, position, value in runs
        ]
    )


def test_a_cell_whose_speed_rises_with_position() -> None:
    # 100, 102, 104, 106 tokens/s at positions 1, 11, 21, 31: +2 per 10 positions
    rows = _rows([("a", 1 + 10 * i, 100.0 + 2 * i) for i in range(4)])
    (trend,) = cell_trends(rows).values()
    median = 103.0
    assert math.isclose(trend.slope, 100 * 2 / median, rel_tol=1e-9)
    assert trend.runs == 4 and trend.excludes_zero  # an exact line: no noise at all
    cells = add_position_trend(pd.DataFrame({"cell_id": ["a", "b"]}), rows)
    assert math.isclose(cells.loc[0, "position_trend_pct"], round(trend.slope, 3))
    assert math.isnan(cells.loc[1, "position_trend_pct"])  # too few runs: empty


def test_noise_without_a_trend_is_no_trend() -> None:
    rows = _rows([("a", 1, 100.0), ("a", 2, 110.0), ("a", 3, 90.0), ("a", 4, 100.0)])
    (trend,) = cell_trends(rows).values()
    assert trend.low < 0 < trend.high and not trend.excludes_zero


def test_fewer_than_three_runs_give_no_cell_trend_and_pruned_rows_do_not_count() -> None:
    rows = pd.concat(
        [
            _rows([("a", 1, 100.0), ("a", 5, 120.0)]),
            _rows([("a", 9, math.nan)], status="skipped").assign(
                error=Skip(cause="out_of_memory", follows="x").error
            ),
        ],
        ignore_index=True,
    )
    assert cell_trends(rows) == {}
    assert add_position_trend(pd.DataFrame({"cell_id": ["a"]}), rows).columns.tolist() == [
        "cell_id"
    ]


def test_the_whole_run_drift_is_found_within_cells() -> None:
    # three cells of very different speeds, each 0.5% faster per position, A B B A order
    runs = []
    for cell, base, positions in (("a", 100.0, (1, 4)), ("b", 1000.0, (2, 3)), ("c", 50.0, (5, 8))):
        runs += [(cell, p, base * (1 + 0.005 * p)) for p in positions]
    runs += [("c", 6, 50.0 * (1 + 0.005 * 6) * 1.0001)]
    drift = run_drift(_rows(runs))
    assert drift is not None and drift.cells == 3 and drift.runs == 7
    # ~0.5% of the median per position (the median sits mid-cell, so the ratio is close)
    assert 0.45 < drift.slope < 0.55 and drift.excludes_zero
    lines = drift_markdown(_rows(runs), pd.DataFrame())
    assert lines[1] == "## Order trend" and "drifted" in lines[3]


def test_no_section_when_nothing_trends() -> None:
    rows = _rows([("a", 1, 100.0), ("a", 4, 101.0), ("b", 2, 50.0), ("b", 3, 49.0)])
    drift = run_drift(rows)
    assert drift is not None and not drift.excludes_zero
    assert drift_markdown(rows, pd.DataFrame()) == []
    # a run without positions (a table from before they existed) has nothing to say
    assert run_drift(rows.drop(columns=["position"])) is None
    assert drift_markdown(rows.drop(columns=["position"]), pd.DataFrame()) == []
