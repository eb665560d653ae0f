"""Running matrices for real: accelerate launch per experiment, sidecar, statuses, resume, Ctrl-C."""

from __future__ import annotations

import csv
import json
import os
import re
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from orchestrator.job.energy import rapl_zones

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]

DEFAULTS = """\
max_steps: 4
logging_steps: 1
learning_rate: 1e-3
report_to: none
save_strategy: "no"
"""


def scenarios(*blocks: str, timeout_s: int | None = None) -> str:
    head = (
        "frameworks:\n"
        f"  ddp: {{accelerate_config: {REPO / 'accelerate-ddp.yaml'}}}\n"
        "matrix:\n  effective_batch_size: [4]\n"
    )
    if timeout_s:
        head += f"timeout_s: {timeout_s}\n"
    return head + "scenarios:\n" + "".join(blocks)


def scenario(
    name: str, model: str = "tiny-llama", extra: str = "", num_gpus: str = "[1, 2]"
) -> str:
    return (
        f"  - name: {name}\n"
        "    device: cpu\n"
        "    framework_config: [ddp]\n"
        f"    num_gpus: {num_gpus}\n"
        "    arguments:\n"
        f"      model_name_or_path: {model}\n"
        "      max_seq_len: 64\n"
        f"{extra}"
    )


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "PYTHON": sys.executable}


def tunematrix(cwd: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", "run", *args],
        cwd=cwd,
        env=env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def rows(results: Path) -> list[dict[str, str]]:
    with (results / "raw_summary.csv").open() as f:
        return list(csv.DictReader(f))


def processes_mentioning(text: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if any(text in part for part in proc.info["cmdline"] or []):
                found.append(proc)
        except psutil.Error:
            continue
    return found


def assert_phases_add_up(row: dict[str, str]) -> dict[str, float]:
    """A row's wall time in phases (orchestrator/job/phases.py): every one recorded, and
    together the wall time within 5%; the phases, by name."""
    from orchestrator.contract.columns import PHASE_COLUMNS

    phases = {p: row[column] for p, column in PHASE_COLUMNS.items()}
    assert all(phases.values()), phases
    seconds = {p: float(v) for p, v in phases.items()}
    assert all(s >= 0 for s in seconds.values()) and seconds["training"] > 0, seconds
    assert sum(seconds.values()) == pytest.approx(float(row["wall_s"]), rel=0.05), seconds
    return seconds


def test_two_by_two_matrix_through_the_shell_script(tmp_path) -> None:
    # packing fills every row, so the tokens are known exactly (the same blocks under sft,
    # tests/e2e/test_sft.py)
    (tmp_path / "defaults.yaml").write_text(DEFAULTS + "trainer: hf\n")
    (tmp_path / "scenarios.yaml").write_text(
        scenarios(scenario("full"), scenario("lora", extra="      peft_method: lora\n      r: 4\n"))
    )
    proc = subprocess.run(
        ["bash", str(REPO / "run_benchmarks.sh"), "1 2", "results", "scenarios.yaml"],
        cwd=tmp_path,
        env={**env(), "DEVICE": "cpu"},
        capture_output=True,
        text=True,
        timeout=600,
        # a usual login umask: every file of the results must be readable by the team
        umask=0o022,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    results = tmp_path / "results"
    modes = {
        str(p.relative_to(results)): stat.S_IMODE(p.stat().st_mode)
        for p in [results, *results.rglob("*")]
        if not p.is_symlink()
    }
    assert len(modes) > 50
    wrong = {
        path: oct(mode)
        for path, mode in modes.items()
        if mode != (0o755 if (results / path).is_dir() or path.endswith(".sh") else 0o644)
    }
    assert not wrong, wrong
    table = rows(results)
    assert len(table) == 4
    assert {r["status"] for r in table} == {"ok"}
    assert sorted((r["scenario"], r["num_gpus"]) for r in table) == [
        ("full", "1"),
        ("full", "2"),
        ("lora", "1"),
        ("lora", "2"),
    ]
    zones, why = rapl_zones()
    rapl = bool(zones)
    for r in table:
        assert float(r["tokens_per_second_global"]) > 100
        assert float(r["tokens_per_second_per_device"]) == pytest.approx(
            float(r["tokens_per_second_global"]) / int(r["num_gpus"])
        )
        assert r["trainer"] == "hf" and r["task"] == "causal-lm"
        assert int(r["tokens_total"]) == 4 * 4 * 64  # packed: steps × effective batch × length
        assert r["world_size"] == r["num_gpus"]
        assert r["error"] == "" and r["memory_backend"] == "psutil"
        assert int(r["mem_tree_peak_rss_bytes"]) > int(r["mem_peak_rss_bytes"]) > 50 * 2**20
        assert r["learning_rate"] == "0.001" and r["max_steps"] == "4"
        # utilisation, always on: the CPU figure filled (a share of the allowed CPUs; 1 over
        # 100 for the kernel's 10 ms ticks), the GPU figures empty, never 0
        assert 0 < float(r["cpu_util_mean_pct"]) <= 101 and int(r["cpu_allowed"]) >= 1
        assert r["util_window"] in ("measured", "training", "job")
        assert r["gpu_util_mean_pct"] == r["gpu_util_p10_pct"] == ""
        assert r["gpu_mem_bw_util_mean_pct"] == ""
        # energy on the CPU: RAPL's package counter where this machine lets it be read,
        # else no figure and the reason (never 0)
        if rapl:
            assert float(r["energy_j"]) > 0 and r["energy_source"] == "rapl package counter"
            assert float(r["energy_per_token_j"]) > 0
        else:
            assert r["energy_j"] == r["energy_per_token_j"] == "" and r["energy_note"] == why
        assert_phases_add_up(r)
    lora = [r for r in table if r["scenario"] == "lora"]
    assert all(r["peft_method"] == "lora" and r["r"] == "4" for r in lora)

    # the report of the real run: tables, plots, the history entry
    bench = list(csv.DictReader((results / "benchmarks.csv").open()))
    assert len(bench) == 4 and {b["status"] for b in bench} == {"ok"}
    summary = (results / "summary.md").read_text()
    assert "4 experiment(s) in 4 cell(s); ok 4" in summary and "## Scaling" in summary
    assert "## Where the wall time went" in summary
    assert all(float(b["cpu_util_mean_pct"]) > 0 for b in bench) and "CPU util %" in summary
    # a CPU run speaks of processes: in its tables, notes and guide, never of GPUs
    assert "GPU" not in summary, [line for line in summary.splitlines() if "GPU" in line]
    assert "| processes |" in summary and "tokens/s/process" in summary
    energy = summary.split("## Energy\n", 1)[1]
    assert ("| `" in energy) if rapl else (f"- {why}: `" in energy)
    for plot in ("throughput", "memory", "scaling", "loss"):
        assert (results / "plots" / f"{plot}.png").stat().st_size > 10_000, plot
    from orchestrator.results import history

    (recorded,) = history.runs(history.path_for(results))
    assert recorded["experiments"] == 4 and json.loads(recorded["counts"]) == {"ok": 4}
    assert "recorded as run 1" in proc.stdout

    env_json = json.loads((results / "env.json").read_text())
    assert env_json["started_at"] and env_json["finished_at"] and env_json["interrupted"] is False
    assert env_json["versions"]["torch"] and env_json["pip_freeze"]
    assert (results / "plan.csv").exists()

    for r in table:
        run = results / "runs" / r["experiment_id"]
        for name in (
            "spec.json",
            "command.sh",
            "stdout.log",
            "stderr.log",
            "memory.csv",
            "result.json",
            "outcome.json",
            "progress.json",
        ):
            assert (run / name).exists(), name
        # the child's step counter, read by the parent (piped: plain lines, no redraws)
        progress = json.loads((run / "progress.json").read_text())
        assert (progress["step"], progress["max_steps"], progress["phase"]) == (4, 4, "done")
        assert progress["world_size"] == int(r["num_gpus"])
        assert re.search(
            rf"\] ok +{re.escape(r['experiment_id'])}  [0-9.]+s, step 4/4\n", proc.stderr
        )
        assert "\r" not in proc.stderr
        assert os.access(run / "command.sh", os.X_OK)
        assert "accelerate" in (run / "command.sh").read_text()
        # the sidecar's peak RSS of each training process, against the process's own ru_maxrss
        result = json.loads((run / "result.json").read_text())
        per_pid = json.loads((run / "outcome.json").read_text())["memory"][
            "mem_process_peak_rss_bytes"
        ]
        for rank in result["ranks"]:
            sampled = per_pid[str(rank["pid"])]
            assert sampled == pytest.approx(rank["peak_rss_bytes"], rel=0.15), (rank, sampled)


@pytest.mark.long
def test_failure_resume_and_a_second_run(tmp_path) -> None:
    (tmp_path / "defaults.yaml").write_text(DEFAULTS)
    # a fault only training finds (the check before launch reads no data)
    broken_data = tmp_path / "broken.jsonl"
    broken_data.write_text('{"instruction": "a", "output": "b"}\nnot json\n')
    (tmp_path / "scenarios.yaml").write_text(
        scenarios(
            scenario("good", num_gpus="[1]"),
            scenario("broken", extra=f"      dataset: {broken_data}\n", num_gpus="[1]"),
        )
    )
    first = tunematrix(
        tmp_path, "--scenarios", "scenarios.yaml", "--results", "results", "--device", "cpu"
    )
    assert first.returncode == 1, first.stderr[-2000:]
    results = tmp_path / "results"
    by = {r["scenario"]: r for r in rows(results)}
    assert by["good"]["status"] == "ok"
    broken = by["broken"]
    assert broken["status"] == "failed"
    assert broken["error"] == f"dataset {broken_data}:2: not valid JSON (Expecting value)"
    assert broken["log"] == f"runs/{broken['experiment_id']}/stderr.log"
    assert "failed: broken." in first.stdout and "log: runs/" in first.stdout
    good_result = results / "runs" / by["good"]["experiment_id"] / "result.json"
    stamp = good_result.stat().st_mtime_ns

    # resume: the ok experiment is skipped (its result untouched), the failed one runs again
    # (the check before launch passed the first time; it has nothing new to say)
    second = tunematrix(
        tmp_path,
        "--scenarios",
        "scenarios.yaml",
        "--results",
        "results",
        "--device",
        "cpu",
        "--resume",
        "--no-check",
    )
    assert second.returncode == 1
    by = {r["scenario"]: r for r in rows(results)}
    assert by["good"]["status"] == "skipped"
    assert float(by["good"]["tokens_per_second_global"]) > 0  # its measurements stay in the table
    assert good_result.stat().st_mtime_ns == stamp
    assert by["broken"]["status"] == "failed" and by["broken"]["attempt"] == "2"
    assert (
        results / "runs" / by["broken"]["experiment_id"] / "attempts" / "1" / "stderr.log"
    ).exists()

    # without resume the earlier run is moved aside, whole
    third = tunematrix(
        tmp_path,
        "--scenarios",
        "scenarios.yaml",
        "--results",
        "results",
        "--device",
        "cpu",
        "--filter",
        "good",
        "--no-check",
    )
    assert third.returncode == 0, third.stderr[-2000:]
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("results.")]
    assert len(aside) == 1
    assert f"the earlier run is in {aside[0].name}" in third.stdout
    assert (aside[0] / "runs" / by["good"]["experiment_id"] / "result.json").exists()
    assert {r["status"] for r in rows(aside[0])} == {"skipped", "failed"}
    assert [r["status"] for r in rows(results)] == ["ok"]


@pytest.mark.long
def test_timeout_kills_the_whole_group(tmp_path) -> None:
    (tmp_path / "defaults.yaml").write_text(DEFAULTS)
    (tmp_path / "scenarios.yaml").write_text(
        scenarios(scenario("long", extra="      max_steps: 100000\n", num_gpus="[2]"))
    )
    start = time.monotonic()
    proc = tunematrix(
        tmp_path,
        "--scenarios",
        "scenarios.yaml",
        "--results",
        "res",
        "--device",
        "cpu",
        "--num-gpus",
        "2",
        "--no-check",
        "--timeout",
        "12",
    )
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert time.monotonic() - start < 60
    (row,) = rows(tmp_path / "res")
    assert row["status"] == "timeout"
    assert row["error"] == "exceeded the time limit of 12 s; the job's process group was killed"
    spec = str(tmp_path / "res" / "runs" / row["experiment_id"] / "spec.json")
    assert processes_mentioning(spec) == []
    # how far it got, from the file the child kept while it trained (when it got to train
    # within the 12 s: on a slow machine the launch alone can take that long)
    progress = tmp_path / "res" / "runs" / row["experiment_id"] / "progress.json"
    line = re.search(rf"timeout +{re.escape(row['experiment_id'])}  [0-9.]+s(.*)\n", proc.stderr)
    assert line, proc.stderr[-2000:]
    if progress.exists():
        reached = json.loads(progress.read_text())
        assert reached["phase"] != "done" and reached["max_steps"] == 100000
        assert line.group(1).startswith(f", step {reached['step']}/100000  exceeded the time limit")
    else:
        assert line.group(1) == "  " + row["error"]


@pytest.mark.long
def test_ctrl_c_keeps_finished_rows_and_leaves_no_orphan(tmp_path) -> None:
    (tmp_path / "defaults.yaml").write_text(DEFAULTS)
    (tmp_path / "scenarios.yaml").write_text(
        scenarios(
            scenario("quick", num_gpus="[1]"),
            scenario("long", extra="      max_steps: 100000\n", num_gpus="[2]"),
        )
    )
    orchestrator = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "orchestrator",
            "run",
            "--scenarios",
            "scenarios.yaml",
            "--results",
            "res",
            "--device",
            "cpu",
            "--num-gpus",
            "1 2",
            "--no-check",
        ],
        cwd=tmp_path,
        env=env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    runs = tmp_path / "res" / "runs"
    deadline = time.monotonic() + 240
    long_spec: Path | None = None
    while time.monotonic() < deadline and long_spec is None:
        time.sleep(0.5)
        for spec in runs.glob("long.*/spec.json") if runs.exists() else []:
            long_spec = spec
    assert long_spec is not None, "the second experiment never started"
    while time.monotonic() < deadline and not processes_mentioning(str(long_spec)):
        time.sleep(0.2)
    time.sleep(3)  # let the training processes get going
    orchestrator.send_signal(signal.SIGINT)
    _stdout, stderr = orchestrator.communicate(timeout=60)
    assert orchestrator.returncode == 130, stderr[-2000:]
    by = {r["scenario"]: r for r in rows(tmp_path / "res")}
    assert by["quick"]["status"] == "ok"
    assert by["long"]["status"] == "interrupted"
    assert "interrupted; finished experiments are kept" in stderr
    time.sleep(0.5)
    assert processes_mentioning(str(long_spec)) == []
    assert json.loads((tmp_path / "res" / "env.json").read_text())["interrupted"] is True
