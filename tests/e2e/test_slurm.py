"""--executor slurm against a real one-node SLURM cluster (see tests/slurmcluster.py).

The cluster is started once for the session; where SLURM cannot be installed
or started every test here skips, with the reason in pytest's summary.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from orchestrator.results import history

# with the cluster tests (tox -e cluster): a real SLURM cluster, and over a minute of
# waiting for SLURM's own time limit
pytestmark = [pytest.mark.e2e, pytest.mark.cluster]

REPO = Path(__file__).resolve().parents[2]


def scenarios(max_steps: int = 4, rates: str = "[1e-4, 2e-4]") -> str:
    return f"""\
frameworks:
  ddp: {{accelerate_config: {REPO / "accelerate-ddp.yaml"}}}
matrix:
  effective_batch_size: [4]
scenarios:
  - name: on-slurm
    device: cpu
    framework_config: [ddp]
    num_gpus: [1]
    arguments:
      model_name_or_path: tiny-llama
      max_seq_len: 64
      trainer: hf  # fixed packed blocks: the exact token count below
      max_steps: {max_steps}
    sweep:
      learning_rate: {rates}
"""


GPU_SCENARIO = """\
scenarios:
  - name: needs-gpus
    arguments:
      model_name_or_path: tiny-llama
"""


def environment(cluster: dict[str, str]) -> dict[str, str]:
    return {
        **os.environ,
        **cluster,
        "PYTHONPATH": str(REPO),
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
    }


def command(*args: str) -> list[str]:
    return [sys.executable, "-m", "orchestrator", *args]


def run_args(*extra: str) -> list[str]:
    return command(
        "run",
        "--scenarios",
        "scenarios.yaml",
        "--defaults",
        str(REPO / "defaults.yaml"),
        "--results",
        "results",
        "--device",
        "cpu",
        "--executor",
        "slurm",
        *extra,
    )


def tunematrix(
    tmp: Path, cluster: dict[str, str], argv: list[str], timeout: float = 280
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv,
        cwd=tmp,
        env=environment(cluster),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def rows(results: Path) -> list[dict[str, str]]:
    with (results / "raw_summary.csv").open() as f:
        return list(csv.DictReader(f))


def queue(cluster: dict[str, str]) -> list[str]:
    proc = subprocess.run(
        ["squeue", "-h", "-o", "%i %T"],
        env=environment(cluster),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split("\n")[:-1]


def wait_until_empty(cluster: dict[str, str], seconds: float = 240) -> None:
    deadline = time.monotonic() + seconds
    while queue(cluster) and time.monotonic() < deadline:
        time.sleep(1)
    assert queue(cluster) == []


def test_two_experiments_run_as_slurm_jobs(tmp_path, slurm_cluster) -> None:
    (tmp_path / "scenarios.yaml").write_text(scenarios())
    proc = tunematrix(tmp_path, slurm_cluster, run_args())
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    table = rows(tmp_path / "results")
    assert [r["status"] for r in table] == ["ok", "ok"]
    assert {r["executor"] for r in table} == {"slurm"}
    job_ids = {r["job_id"] for r in table}
    assert len(job_ids) == 2 and all(j.isdigit() for j in job_ids)
    for r in table:
        assert float(r["tokens_per_second_global"]) > 0
        assert int(r["tokens_total"]) == 4 * 4 * 64
        # the same folder layout as a local run: report and compare do not care
        run = tmp_path / "results" / "runs" / r["experiment_id"]
        for name in ("spec.json", "command.sh", "result.json", "outcome.json", "slurm.json"):
            assert (run / name).is_file(), name
        # the step counter the job's child kept in the shared folder, read while waiting
        assert json.loads((run / "progress.json").read_text())["step"] == 4
        assert re.search(
            rf"\] ok +{re.escape(r['experiment_id'])}  [0-9.]+s, step 4/4", proc.stderr
        )
    assert (tmp_path / "results" / "benchmarks.csv").is_file()
    assert "submitted" in proc.stderr + proc.stdout
    assert queue(slurm_cluster) == []
    # resuming runs nothing again, on SLURM as locally
    again = tunematrix(tmp_path, slurm_cluster, run_args("--resume"))
    assert again.returncode == 0, again.stderr[-2000:]
    assert [r["status"] for r in rows(tmp_path / "results")] == ["skipped", "skipped"]
    assert "submitted" not in again.stderr + again.stdout
    # a fresh run moves the earlier one aside with SLURM's logs of its jobs, so every
    # log its rows and outcomes point to is still there
    from orchestrator.contract.layout import ResultsLayout
    from orchestrator.contract.outcome import read_outcome
    from orchestrator.running.resultsdir import open_results

    with open_results(tmp_path / "results", resume=False) as opened:
        moved = opened.moved_to
    assert moved is not None and not (tmp_path / "results" / "slurm").exists()
    for r in rows(moved):
        assert (moved / r["log"]).is_file(), r["log"]
        logs = ResultsLayout(moved).job_logs("slurm", r["job_id"])
        assert (logs / f"{r['job_id']}_0_log.err").is_file(), logs
    for run in ResultsLayout(moved).run_folders():
        outcome = read_outcome(run)
        assert outcome is not None and outcome.log and (moved / outcome.log).is_file()
        assert outcome.executor == "slurm" and outcome.job_id in job_ids


def test_a_job_past_its_slurm_time_limit_is_a_timeout(tmp_path, slurm_cluster) -> None:
    (tmp_path / "scenarios.yaml").write_text(scenarios(max_steps=1_000_000, rates="[1e-4]"))
    started = time.monotonic()
    proc = tunematrix(tmp_path, slurm_cluster, run_args("--slurm-time", "1"))
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    (row,) = rows(tmp_path / "results")
    assert row["status"] == "timeout", row["error"]
    assert "as TIMEOUT" in row["error"]
    assert time.monotonic() - started < 200
    assert queue(slurm_cluster) == []


def test_cancelling_the_orchestrator_cancels_its_jobs(tmp_path, slurm_cluster) -> None:
    (tmp_path / "scenarios.yaml").write_text(
        scenarios(max_steps=1_000_000, rates="[1e-4, 2e-4, 3e-4]")
    )
    with (tmp_path / "out.log").open("w") as out:
        proc = subprocess.Popen(
            run_args(), cwd=tmp_path, env=environment(slurm_cluster), stdout=out, stderr=out
        )
        try:
            # wait until a job trains (its child writes stdout.log), then Ctrl-C
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                if any((tmp_path / "results" / "runs").glob("*/stdout.log")):
                    break
                assert proc.poll() is None, (tmp_path / "out.log").read_text()[-3000:]
                time.sleep(0.5)
            else:
                pytest.fail("no job started: " + (tmp_path / "out.log").read_text()[-3000:])
            assert queue(slurm_cluster), "the jobs should be queued or running"
            proc.send_signal(signal.SIGINT)
            code = proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert code == 130, (tmp_path / "out.log").read_text()[-3000:]
    assert queue(slurm_cluster) == []
    table = rows(tmp_path / "results")
    assert len(table) == 3
    assert {r["status"] for r in table} == {"interrupted"}
    assert all(r["job_id"] for r in table)


def test_array_without_waiting_then_report_collects(tmp_path, slurm_cluster) -> None:
    (tmp_path / "scenarios.yaml").write_text(scenarios())
    proc = tunematrix(
        tmp_path, slurm_cluster, run_args("--array", "--array-parallelism", "1", "--no-wait")
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "tunematrix report results" in proc.stdout
    table = rows(tmp_path / "results")
    assert [r["status"] for r in table] == ["planned", "planned"]
    ids = sorted(r["job_id"] for r in table)
    array_id = ids[0].split("_")[0]
    assert ids == [f"{array_id}_0", f"{array_id}_1"]
    # while the array runs, another run into the same folder is refused
    # (--resume: should the jobs have ended meanwhile, it collects and skips them)
    before = queue(slurm_cluster)
    busy = tunematrix(tmp_path, slurm_cluster, run_args("--resume"))
    if before and queue(slurm_cluster):
        assert busy.returncode == 2 and "still write into" in busy.stderr, busy.stderr
    else:
        assert busy.returncode == 0, busy.stderr[-2000:]
    wait_until_empty(slurm_cluster)
    report = tunematrix(tmp_path, slurm_cluster, command("report", "results", "--no-plots"))
    assert report.returncode == 0, report.stderr[-3000:]
    table = rows(tmp_path / "results")
    assert [r["status"] for r in table] == ["ok", "ok"], table
    assert sorted(r["job_id"] for r in table) == ids
    # the run ends here (unless the --resume run above found the jobs ended and
    # ran itself), so it enters the history like a waited-for run, once
    db = history.path_for(tmp_path / "results")
    if busy.returncode == 2:
        assert "recorded as run 1 in" in report.stdout, report.stdout
    for row in table:
        job_s = history.longest_ok_job(db, row["cell_id"])
        assert job_s is not None and job_s > 0, row["cell_id"]
    again = tunematrix(tmp_path, slurm_cluster, command("report", "results", "--no-plots"))
    assert again.returncode == 0 and "recorded as run" not in again.stdout, again.stdout


def _expect_refusal(tmp: Path, cluster: dict[str, str], argv: list[str], expected: str) -> None:
    proc = tunematrix(tmp, cluster, argv, timeout=120)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert proc.stderr.count("\n") == 1 and expected in proc.stderr, proc.stderr
    assert proc.stdout == ""
    assert not (tmp / "results" / "runs").exists()


def test_unknown_partition_is_refused_before_submission(tmp_path, slurm_cluster) -> None:
    (tmp_path / "scenarios.yaml").write_text(scenarios())
    _expect_refusal(
        tmp_path,
        slurm_cluster,
        run_args("--slurm-partition", "nope"),
        "unknown SLURM partition 'nope'; partitions: debug",
    )


def test_more_gpus_than_the_cluster_has_is_refused(tmp_path, slurm_cluster) -> None:
    (tmp_path / "scenarios.yaml").write_text(GPU_SCENARIO)
    argv = [a if a != "cpu" else "gpu" for a in run_args("--num-gpus", "2")]
    _expect_refusal(tmp_path, slurm_cluster, argv, "needs 2 GPUs; partition debug has 0")


def test_time_limit_below_the_expected_run_is_refused(tmp_path, slurm_cluster) -> None:
    (tmp_path / "scenarios.yaml").write_text(scenarios(rates="[1e-4]"))
    planned = tunematrix(
        tmp_path,
        slurm_cluster,
        command(
            "plan",
            "--scenarios",
            "scenarios.yaml",
            "--defaults",
            str(REPO / "defaults.yaml"),
            "--device",
            "cpu",
            "--output",
            "-",
        ),
    )
    assert planned.returncode == 0, planned.stderr
    plan = pd.read_csv(io.StringIO(planned.stdout))
    # an earlier run of this cell took 10 minutes
    plan["status"], plan["job_s"] = "ok", 600.0
    history.record(history.path_for(tmp_path / "results"), plan, {}, tmp_path / "results")
    _expect_refusal(
        tmp_path,
        slurm_cluster,
        run_args("--slurm-time", "5"),
        "SLURM time limit of 5 min is below the expected run of 10.0 min",
    )
    # a limit that leaves room passes the check (and the plan is what would run)
    ok = tunematrix(tmp_path, slurm_cluster, run_args("--slurm-time", "15", "--no-wait"))
    assert ok.returncode == 0, ok.stderr[-2000:]
    wait_until_empty(slurm_cluster)
    job = json.loads(next((tmp_path / "results" / "runs").glob("*/slurm.json")).read_text())
    assert job["job_id"]
