"""The plan's up-front estimate from a history.sqlite written by history.record."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from orchestrator.results import history
from orchestrator.results.estimate import estimate_plan


@dataclass(frozen=True)
class Planned:
    experiment_id: str
    cell_id: str
    framework: str = "none"
    model_name_or_path: str = "org/m"
    device: str = "gpu"
    num_gpus: int = 2
    effective_batch_size: int = 8
    max_seq_len: int | None = 512
    arguments: dict[str, Any] = field(default_factory=lambda: {"max_steps": 100})
    measure: Any = None


def _row(cell: str, wall: float, **more: Any) -> dict[str, Any]:
    row = {
        "experiment_id": cell,
        "cell_id": cell,
        "scenario": "s",
        "framework_config": "none",
        "model_name_or_path": "org/m",
        "device": "gpu",
        "num_gpus": 2,
        "status": "ok",
        "wall_s": wall,
        "job_s": wall - 1,
        "tokens_per_second_global": 4096.0,
        # 100 steps of 8 × 512 packed tokens: 409,600 tokens, 100 s at 4096 tokens/s
        "tokens_total": 409_600,
        "steps": 100,
        "effective_batch_size": 8,
        "max_seq_len": 512,
    }
    row.update(more)
    return row


def _history(tmp_path: Path, *runs: list[dict[str, Any]]) -> Path:
    db = history.path_for(tmp_path)
    for rows in runs:
        history.record(db, pd.DataFrame(rows), {"host": "h"}, tmp_path)
    return db


def test_own_similar_and_unknown(tmp_path: Path) -> None:
    db = _history(
        tmp_path,
        [_row("c1", 130.0), _row("gone", 0.0, status="oom")],
        [_row("c1", 150.0), _row("c1", 140.0, experiment_id="c1-r1")],
    )
    plan = [
        Planned("c1", "c1"),
        # no run of its own: c1's runs scaled to twice the steps, 30-50 s outside training
        Planned("c2", "c2", arguments={"max_steps": 200}),
        Planned("c3", "c3", framework="fsdp"),
        Planned("gone", "gone"),  # only an oom on record: no own estimate, similar to c1
    ]
    found = estimate_plan(plan, db)
    by_id = {e.experiment_id: e for e in found.experiments}
    assert by_id["c1"].basis == "own" and by_id["c1"].runs == 3
    assert by_id["c1"].seconds == pytest.approx(140.0)  # the median wall time
    assert by_id["c1"].device_hours == pytest.approx(140.0 * 2 / 3600)
    assert by_id["c2"].basis == "similar"
    assert by_id["c2"].seconds == pytest.approx(40.0 + 200.0)  # overhead + 2 × 100 s
    assert by_id["c3"].basis == "none" and by_id["c3"].seconds is None
    assert by_id["gone"].basis == "similar"
    assert (found.count("own"), found.count("similar"), found.count("none")) == (1, 2, 1)
    lines = found.lines(2.0)
    hours = (140.0 + 240.0 + 140.0) * 2 / 3600
    assert lines[0].startswith(f"estimate: {hours:.3g} GPU-hours for 3 of 4 experiment(s)")
    assert f"${hours * 2.0:,.2f} at $2 per GPU-hour" in lines[0]
    assert "1 experiment(s) from their own earlier runs, 2 from similar cells" in lines[1]
    assert "1 with no history" in lines[1]
    assert "leave out the 1 experiment(s) with no history" in lines[2]


def test_unpadded_share_and_steady_cap(tmp_path: Path) -> None:
    # half the slots held real tokens: the tokens to come are scaled the same way
    db = _history(
        tmp_path, [_row("c1", 100.0, tokens_total=204_800, tokens_per_second_global=2048.0)]
    )

    @dataclass(frozen=True)
    class Cap:
        max_steps: int = 300

    found = estimate_plan([Planned("c2", "c2", measure=Cap())], db)
    (one,) = found.experiments
    assert one.basis == "similar" and one.upper_bound
    assert one.seconds == pytest.approx(300.0)  # 0 s outside + 3 × 100 s
    assert "at most" in found.lines(None)[0]


def test_no_history(tmp_path: Path) -> None:
    found = estimate_plan([Planned("c1", "c1")], tmp_path / "none.sqlite")
    assert found.count("none") == 1
    assert found.lines(None) == [
        f"estimate: unknown; no earlier ok run of these or similar cells in "
        f"{tmp_path / 'none.sqlite'} (no history there)"
    ]
