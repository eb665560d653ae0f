"""A run's wall time in phases that add up to it (orchestrator/job/phases.py), and
summary.md's section on them (orchestrator/results/phasesreport.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fakeruns import write_run

from orchestrator.contract import columns as registry
from orchestrator.contract.columns import PHASE_COLUMNS
from orchestrator.contract.result import RunTimings
from orchestrator.job.phases import _ENDS, PHASES, phase_seconds
from orchestrator.results.aggregate import CostSettings
from orchestrator.results.report import write_report

TIMINGS = {
    "run_start_unix": 104.0,
    "imports_end_unix": 110.0,
    "model_end_unix": 111.5,
    "data_end_unix": 112.0,
    "first_step_unix": 115.0,
    "train_end_unix": 125.0,
}


def test_the_phases_run_from_instant_to_instant_and_add_up_to_the_wall() -> None:
    phases = phase_seconds(100.0, 130.0, TIMINGS)
    assert phases == {
        "launch_s": 4.0,
        "imports_s": 6.0,
        "model_s": 1.5,
        "data_s": 0.5,
        "first_step_s": 3.0,
        "training_s": 10.0,
        "after_training_s": 5.0,
    }
    assert sum(phases.values()) == 30.0


def test_a_phase_without_both_ends_is_none_and_the_others_stay() -> None:
    # a run that failed in its first step: no first_step_unix, no train_end_unix
    failed = {k: v for k, v in TIMINGS.items() if k not in ("first_step_unix", "train_end_unix")}
    phases = phase_seconds(100.0, 113.0, failed)
    assert phases["data_s"] == 0.5 and phases["launch_s"] == 4.0
    assert phases["first_step_s"] is phases["training_s"] is phases["after_training_s"] is None
    assert set(phase_seconds(None, None, None).values()) == {None}
    # clocks of one host a hair apart read 0; a phase far below 0 is no figure
    skewed = phase_seconds(104.02, 130.0, TIMINGS)
    assert skewed["launch_s"] == 0.0
    assert phase_seconds(107.0, 130.0, TIMINGS)["launch_s"] is None


def test_the_instants_are_the_childs_timings_and_each_phase_has_a_column() -> None:
    assert set(_ENDS) <= set(RunTimings.model_fields)
    assert len(_ENDS) == len(PHASES) - 1
    for phase in PHASES:
        column = registry.get(PHASE_COLUMNS[phase])
        assert column.source == "outcome" and column.unit == "s"
        assert column.where == ("phases", f"{phase}_s")


def _with_phases(run: Path, phases: dict[str, float], wall: float) -> None:
    outcome = json.loads((run / "outcome.json").read_text())
    outcome.update(wall_s=wall, phases=phases)
    (run / "outcome.json").write_text(json.dumps(outcome))


def test_summary_says_where_each_cells_wall_time_went(tmp_path: Path) -> None:
    phases = phase_seconds(100.0, 130.0, TIMINGS)
    _with_phases(write_run(tmp_path, "a", cell_id="cell-a"), phases, 30.0)
    other = dict(phases, training_s=40.0, after_training_s=5.0)
    _with_phases(write_run(tmp_path, "b", cell_id="cell-b", effective_batch_size=16), other, 60.0)
    write_run(tmp_path, "c", cell_id="cell-c", status="oom", error="CUDA out of memory")
    write_report(tmp_path, tmp_path, CostSettings(), plots=False)
    summary = (tmp_path / "summary.md").read_text()
    section = summary.split("## Where the wall time went", 1)[1]
    assert "| `cell-a` | 30.0 | 4.0 | 6.0 | 1.5 | 0.5 | 3.0 | 10.0 | 5.0 | 33% |" in section
    assert "| `cell-b` | 60.0 | 4.0 | 6.0 | 1.5 | 0.5 | 3.0 | 40.0 | 5.0 | 67% |" in section
    assert "cell-c" not in section  # no ok run: no phases
    assert "Over the 2 ok run(s): 90.0 s of wall time, of which 50.0 s training (56%)" in section
    rows = (tmp_path / "raw_summary.csv").read_text().splitlines()
    assert all(column in rows[0] for column in PHASE_COLUMNS.values())


def test_a_folder_from_before_the_phases_has_no_such_section(tmp_path: Path) -> None:
    write_run(tmp_path, "a")
    write_report(tmp_path, tmp_path, CostSettings(), plots=False)
    assert "Where the wall time went" not in (tmp_path / "summary.md").read_text()


@pytest.mark.parametrize("missing", ["imports_end_unix", "train_end_unix"])
def test_a_run_with_a_phase_missing_is_left_out_of_the_section(tmp_path: Path, missing) -> None:
    timings = {k: v for k, v in TIMINGS.items() if k != missing}
    _with_phases(write_run(tmp_path, "a"), phase_seconds(100.0, 130.0, timings), 30.0)
    write_report(tmp_path, tmp_path, CostSettings(), plots=False)
    assert "Where the wall time went" not in (tmp_path / "summary.md").read_text()
