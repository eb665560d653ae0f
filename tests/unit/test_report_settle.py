"""``report`` on a results folder whose jobs were submitted without waiting: the jobs
that ended are collected, and the run enters the history once, when none is left
running. The command line and the Python API take the same path."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fakeruns import write_run

from orchestrator import api
from orchestrator.cli.app import main
from orchestrator.results import history


def _awaited_run(tmp_path: Path) -> Path:
    """A results folder as `run --no-wait` leaves it once its two jobs have ended."""
    root = tmp_path / "results"
    write_run(root, "a.g1")
    write_run(root, "a.g2", num_gpus=2, tps=1800.0)
    env = {"started_at": "2026-01-01T00:00:00+00:00", "host": "node1", "awaiting_jobs": True}
    (root / "env.json").write_text(json.dumps(env))
    return root


def _env(root: Path) -> dict:
    return json.loads((root / "env.json").read_text())


@pytest.fixture
def jobs(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """What the SLURM queue says (no cluster is asked): jobs collected, jobs running."""
    from orchestrator.executors.base import Settled
    from orchestrator.executors.registry import get

    state: dict[str, Any] = {"collected": 0, "running": []}

    def settle(cls: type, layout: object) -> Settled:
        return Settled(state["collected"], list(state["running"]), "SLURM job", "scancel them")

    monkeypatch.setattr(get("slurm"), "settle", classmethod(settle))
    return state


def test_the_command_records_an_awaited_run_once(tmp_path, capsys, jobs) -> None:
    root = _awaited_run(tmp_path)
    jobs["collected"] = 2
    assert main(["report", str(root), "--no-plots"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("collected 2 finished SLURM job(s)\n")
    assert f"  recorded as run 1 in {root / 'history.sqlite'}" in out
    (run,) = history.runs(root / "history.sqlite")
    assert (run["experiments"], run["host"]) == (2, "node1")
    env = _env(root)
    assert env["awaiting_jobs"] is False and env["finished_at"]
    # a second report changes nothing: the run is in the history already
    jobs["collected"] = 0
    assert main(["report", str(root), "--no-plots"]) == 0
    assert "recorded as run" not in capsys.readouterr().out
    assert len(history.runs(root / "history.sqlite")) == 1


def test_a_run_with_jobs_still_running_is_not_recorded(tmp_path, capsys, jobs) -> None:
    root = _awaited_run(tmp_path)
    jobs["running"] = ["101", "102"]
    assert main(["report", str(root), "--no-plots"]) == 0
    out = capsys.readouterr().out
    assert (
        "2 SLURM job(s) still queued or running (101, 102); the report shows them as not run yet"
        in out
    )
    assert "recorded as run" not in out
    assert not (root / "history.sqlite").exists()
    assert _env(root)["awaiting_jobs"] is True


def test_the_api_report_settles_and_records_as_the_command_does(tmp_path, jobs) -> None:
    root = _awaited_run(tmp_path)
    done = api.settle_and_report(root, plots=False)
    assert [(s.collected, s.running) for s in done.settled] == [(0, [])]
    assert (done.running, done.history_run_id) == ([], 1)
    assert done.history == root / "history.sqlite"
    assert len(done.report.rows) == 2
    # report() is the same path: the run is recorded once, not again
    again = api.report(root, plots=False)
    assert len(again.rows) == 2
    assert len(history.runs(root / "history.sqlite")) == 1


def test_a_run_that_waited_for_its_jobs_is_not_recorded_again(tmp_path, capsys, jobs) -> None:
    root = _awaited_run(tmp_path)
    (root / "env.json").write_text(json.dumps({"host": "node1", "awaiting_jobs": False}))
    assert main(["report", str(root), "--no-plots"]) == 0
    assert "recorded as run" not in capsys.readouterr().out
    assert not (root / "history.sqlite").exists()


@pytest.mark.parametrize("option", ["tokens", "usd_per_gpu_hour", "gpu_memory_gib"])
def test_bad_report_options_name_the_flag_before_anything_is_touched(
    tmp_path, capsys, jobs, option: str
) -> None:
    root = _awaited_run(tmp_path)
    jobs["collected"] = 2
    flag = "--" + option.replace("_", "-")
    assert main(["report", str(root), flag, "-1"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == f"tunematrix: error: {flag} must be a positive number, got -1\n"
    assert not (root / "summary.md").exists()
    assert _env(root)["awaiting_jobs"] is True
    # the API names its own keyword
    with pytest.raises(api.UserError, match=f"^{option} must be a positive number, got -1$"):
        api.report(root, **{option: -1.0})
