"""outcome.json: one writer, one reader, and older records still read."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from orchestrator.contract.layout import ResultsLayout
from orchestrator.contract.outcome import Outcome, read_outcome, write_outcome


def test_written_and_read_back(tmp_path) -> None:
    run = ResultsLayout(tmp_path).run("exp-1")
    outcome = Outcome(
        status="oom",
        error="CUDA out of memory",
        log="runs/exp-1/stderr.log",
        job_s=12.5,
        memory={"mem_nvidia_peak_bytes_max": 2**30},
        devices=["0", "1"],
        executor="packed",
        run_mode="packed",
        packed_with=["exp-2"],
    )
    write_outcome(run, outcome)
    assert read_outcome(run) == outcome
    record = json.loads(run.outcome.read_text())
    assert record["executor"] == "packed" and record["job_id"] is None
    assert "slurm_job_id" not in record
    # sorted keys, one per line: a record a person can read and diff
    assert list(record) == sorted(record)


def test_an_older_record_with_a_named_job_id_still_reads(tmp_path) -> None:
    run = ResultsLayout(tmp_path).run("exp-1")
    run.dir.mkdir(parents=True)
    old = {
        "status": "ok",
        "error": None,
        "log": "runs/exp-1/stderr.log",
        "executor": "slurm",
        "slurm_job_id": "4242_1",
        "a_key_of_the_future": 1,
    }
    run.outcome.write_text(json.dumps(old))
    outcome = read_outcome(run)
    assert outcome is not None
    assert (outcome.status, outcome.executor, outcome.job_id) == ("ok", "slurm", "4242_1")
    # a local run of then named no job
    run.outcome.write_text(json.dumps({"status": "ok", "executor": "local", "slurm_job_id": None}))
    local = read_outcome(run)
    assert local is not None and (local.executor, local.job_id) == ("local", None)


@pytest.mark.parametrize("text", ["", "{", "[]", '{"status": "finished"}', '{"error": "x"}'])
def test_what_is_not_an_outcome_reads_as_none(tmp_path, text: str) -> None:
    run = ResultsLayout(tmp_path).run("exp-1")
    run.dir.mkdir(parents=True)
    run.outcome.write_text(text)
    assert read_outcome(run) is None
    assert read_outcome(ResultsLayout(tmp_path).run("absent")) is None


def test_a_status_outside_the_list_is_refused() -> None:
    outcome = Outcome(status="ok")
    with pytest.raises(ValidationError):
        outcome.status = "finished"  # type: ignore[assignment]


def test_an_older_results_folder_still_reports_its_jobs(tmp_path) -> None:
    """A folder written before the job id was generic: its rows name the executor and job."""
    from fakeruns import write_run

    from orchestrator.results.collect import rows_from_folder

    run = write_run(tmp_path, "exp-1")
    record = json.loads((run / "outcome.json").read_text())
    (run / "outcome.json").write_text(
        json.dumps({**record, "executor": "slurm", "slurm_job_id": "4242"})
    )
    (row,) = rows_from_folder(tmp_path)
    assert (row["status"], row["executor"], row["job_id"]) == ("ok", "slurm", "4242")
    assert row["log"] == "runs/exp-1/stderr.log"


def test_a_cell_pruned_unlaunched_reads_pruned_without_the_runs_table(tmp_path) -> None:
    """Its folder holds only outcome.json; with raw_summary.csv gone, its row is the plan's
    with the recorded verdict, not ``planned``."""
    from orchestrator.contract.outcome import Skip, skipped
    from orchestrator.results.collect import rows_from_folder

    layout = ResultsLayout(tmp_path)
    (tmp_path / "plan.csv").write_text(
        "experiment_id,scenario,per_device_train_batch_size,status\n"
        "s.m.none.g1.eb4-0000,s,4,planned\ns.m.none.g1.eb8-0001,s,8,planned\n"
    )
    run = layout.run("s.m.none.g1.eb8-0001")
    run.dir.mkdir(parents=True)
    write_outcome(run, skipped(Skip(cause="out_of_memory", follows="s.m.none.g1.eb4-0000")))
    rows = {row["experiment_id"]: row for row in rows_from_folder(tmp_path)}
    assert rows["s.m.none.g1.eb4-0000"]["status"] == "planned"
    pruned = rows["s.m.none.g1.eb8-0001"]
    assert (pruned["status"], pruned["error"], pruned["scenario"]) == (
        "skipped",
        "pruned: s.m.none.g1.eb4-0000 ran out of memory",
        "s",
    )
