"""Opening a results folder: one run at a time, nothing of an earlier run lost."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.contract.errors import UserError
from orchestrator.job.attempts import keep_previous_attempt
from orchestrator.running.resultsdir import open_results

REPO = Path(__file__).resolve().parents[2]


def _earlier_run(root: Path) -> None:
    (root / "runs" / "a").mkdir(parents=True)
    (root / "runs" / "a" / "result.json").write_text('{"status": "ok"}')
    (root / "raw_summary.csv").write_text("experiment_id\na\n")
    (root / "data" / "L128-x").mkdir(parents=True)
    (root / ".gitkeep").write_text("")


def test_an_earlier_run_is_moved_aside_not_deleted(tmp_path) -> None:
    root = tmp_path / "results"
    root.mkdir()
    _earlier_run(root)
    with open_results(root, resume=False) as opened:
        moved = opened.moved_to
        assert moved is not None and moved.name.startswith("results.")
        assert (moved / "runs" / "a" / "result.json").read_text() == '{"status": "ok"}'
        assert (moved / "raw_summary.csv").exists()
        assert not (root / "runs").exists() and not (root / "raw_summary.csv").exists()
        # the data cache and dotfiles stay where they are
        assert (root / "data" / "L128-x").is_dir() and (root / ".gitkeep").exists()


def test_two_moves_in_one_second_do_not_collide(tmp_path) -> None:
    root = tmp_path / "results"
    root.mkdir()
    _earlier_run(root)
    with open_results(root, resume=False) as first:
        pass
    (root / "runs").mkdir()
    with open_results(root, resume=False) as second:
        pass
    assert first.moved_to != second.moved_to
    assert first.moved_to is not None and first.moved_to.exists()


def test_resume_keeps_everything(tmp_path) -> None:
    root = tmp_path / "results"
    root.mkdir()
    _earlier_run(root)
    with open_results(root, resume=True) as opened:
        assert opened.moved_to is None
        assert (root / "runs" / "a" / "result.json").exists()


def test_a_second_orchestrator_is_refused(tmp_path) -> None:
    root = tmp_path / "results"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; from orchestrator.running.resultsdir import open_results\n"
            "with open_results(Path(sys.argv[1]), resume=True):\n"
            "    print('locked', flush=True); time.sleep(30)",
            str(root),
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        with (
            pytest.raises(
                UserError,
                match=rf"results folder .* is in use by another tunematrix run \(pid {holder.pid}\)",
            ),
            open_results(root, resume=True),
        ):
            pass
    finally:
        holder.kill()
        holder.wait()
    with open_results(root, resume=True):  # free again once the holder is gone
        pass


def test_a_foreign_non_empty_folder_is_refused(tmp_path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "src").mkdir()
    with (
        pytest.raises(UserError, match="is not empty and holds no tunematrix results"),
        open_results(tmp_path, resume=False),
    ):
        pass
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_a_file_is_refused(tmp_path) -> None:
    path = tmp_path / "results"
    path.write_text("")
    with (
        pytest.raises(UserError, match="exists and is not a folder"),
        open_results(path, resume=False),
    ):
        pass


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_unwritable(tmp_path) -> None:
    root = tmp_path / "ro"
    root.mkdir(mode=0o500)
    with pytest.raises(UserError, match="is not writable"), open_results(root, resume=False):
        pass


def test_earlier_attempts_are_kept(tmp_path) -> None:
    run = tmp_path / "runs" / "x"
    run.mkdir(parents=True)
    (run / "stderr.log").write_text("first")
    assert keep_previous_attempt(run) == run / "attempts" / "1"
    (run / "stderr.log").write_text("second")
    assert keep_previous_attempt(run) == run / "attempts" / "2"
    assert (run / "attempts" / "1" / "stderr.log").read_text() == "first"
    assert (run / "attempts" / "2" / "stderr.log").read_text() == "second"
    assert keep_previous_attempt(run) is None


def _earlier_submitted_run(root: Path) -> None:
    """An earlier run whose jobs an executor with logs of its own ran: one job left no
    outcome of its own, so its row points at the executor's log of the job."""
    from orchestrator.contract.layout import ResultsLayout
    from orchestrator.contract.outcome import Outcome, write_outcome
    from orchestrator.results.rows import build_row, write_raw_summary

    layout = ResultsLayout(root)
    rows = []
    for eid, job, own_log in (("a", "11", True), ("b", "12", False)):
        run = layout.run(eid)
        run.dir.mkdir(parents=True)
        job_logs = layout.job_logs("slurm", job)
        job_logs.mkdir(parents=True)
        (job_logs / f"{job}_0_log.err").write_text("slurmstepd: error: *** JOB CANCELLED ***\n")
        if own_log:
            run.stderr.write_text("Traceback ...\n")
            log = layout.relative(run.stderr)
        else:
            log = layout.relative(job_logs / f"{job}_0_log.err")
        outcome = Outcome(status="failed", log=log, executor="slurm", job_id=job)
        write_outcome(run, outcome)
        rows.append(build_row({"experiment_id": eid}, outcome.as_dict(), None))
    write_raw_summary(rows, layout.raw_summary)


def test_a_moved_run_keeps_every_log_its_rows_point_to(tmp_path) -> None:
    import csv

    from orchestrator.contract.layout import ResultsLayout
    from orchestrator.contract.outcome import read_outcome

    root = tmp_path / "results"
    _earlier_submitted_run(root)
    with open_results(root, resume=False) as opened:
        moved = opened.moved_to
    assert moved is not None
    # nothing of the earlier run is left behind, its executor's logs included
    assert not (root / "runs").exists() and not (root / "slurm").exists()
    with (moved / "raw_summary.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [r["log"] for r in rows] == ["runs/a/stderr.log", "slurm/12/12_0_log.err"]
    for row in rows:
        assert (moved / row["log"]).is_file(), row["log"]
        assert (ResultsLayout(moved).job_logs("slurm", row["job_id"])).is_dir()
    for run in ResultsLayout(moved).run_folders():
        outcome = read_outcome(run)
        assert outcome is not None and outcome.log is not None
        assert (moved / outcome.log).is_file(), outcome.log


def test_a_folder_holding_only_executor_logs_is_ours(tmp_path) -> None:
    (tmp_path / "slurm" / "12").mkdir(parents=True)
    with open_results(tmp_path, resume=False) as opened:
        assert opened.moved_to is not None
        assert (opened.moved_to / "slurm" / "12").is_dir()
