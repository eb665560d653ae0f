"""``tunematrix plan --memory`` for real, on a machine without a GPU: the child predicts
each GPU cell's step on fake tensors in a subprocess, the plan sets it against the
memory it is told, writes the ``predicted_*`` columns, and keeps the predictions for the
next plan (which asks the child nothing).
"""

from __future__ import annotations

import csv
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.long]

REPO = Path(__file__).resolve().parents[2]
SCENARIOS = """\
matrix:
  effective_batch_size: [2, 4096]
  max_seq_len: [64]
scenarios:
  - name: s
    device: gpu
    arguments:
      model_name_or_path: tiny-llama
      trainer: hf
"""


def _plan(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", "plan", "--scenarios", "scenarios.yaml", *args],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_plan_memory_predicts_sets_against_the_device_and_keeps(tmp_path: Path) -> None:
    (tmp_path / "scenarios.yaml").write_text(SCENARIOS)
    args = ("--device", "gpu", "--num-gpus", "1", "--memory", "--gpu-memory-gib", "2")
    started = time.monotonic()
    done = _plan(tmp_path, *args, "--output", "plan.csv")
    first_s = time.monotonic() - started
    assert done.returncode == 0, done.stderr[-3000:]
    table = done.stdout[done.stdout.index("memory, predicted before launch") :].splitlines()
    assert "device: 2 GiB per GPU (--gpu-memory-gib 2)" in table[0]
    small = next(line for line in table if ".eb2-" in line)
    big = next(line for line in table if ".eb4096-" in line)
    assert small.rstrip().endswith("fits") and "OVER: pruned before launch" in big
    with open(tmp_path / "plan.csv", newline="") as f:
        rows = {int(r["effective_batch_size"]): r for r in csv.DictReader(f)}
    assert rows[2]["memory_verdict"] == "fits" and rows[4096]["memory_verdict"] == "over"
    small_peak, big_peak = (int(rows[b]["predicted_peak_bytes"]) for b in (2, 4096))
    # the larger batch holds more activations and logits, the weights being the same
    assert 0 < small_peak < big_peak
    assert int(rows[2]["predicted_nvml_bytes"]) > small_peak
    # kept: the next plan asks the child nothing and finds the same
    started = time.monotonic()
    again = _plan(tmp_path, *args, "--output", "again.csv")
    again_s = time.monotonic() - started
    assert again.returncode == 0, again.stderr[-3000:]
    assert "all kept from an earlier check" in again.stderr, again.stderr
    with open(tmp_path / "again.csv", newline="") as f:
        kept = {int(r["effective_batch_size"]): r for r in csv.DictReader(f)}
    assert [kept[b]["predicted_peak_bytes"] for b in (2, 4096)] == [str(small_peak), str(big_peak)]
    print(f"plan --memory: {first_s:.1f} s, kept: {again_s:.1f} s")
    # plain plan stays free of the training stack: no memory columns, no check
    plain = _plan(tmp_path, "--device", "gpu", "--num-gpus", "1", "--output", "-")
    assert plain.returncode == 0 and "predicted_peak_bytes" not in plain.stdout
    refused = _plan(tmp_path, "--device", "gpu", "--gpu-memory-gib", "80")
    assert refused.returncode == 2 and "--memory only" in refused.stderr


def test_run_prunes_a_cell_predicted_over_its_gpu_before_launch(tmp_path: Path) -> None:
    """The run's own check predicts, and the cell over the device's memory is never
    launched: pruned, with the prediction as its reason, in the outcome and summary.md.
    (Here, without a GPU, the cell that fits is refused for want of one.)"""
    (tmp_path / "scenarios.yaml").write_text(SCENARIOS)
    done = subprocess.run(
        [
            *(sys.executable, "-m", "orchestrator", "run", "--scenarios", "scenarios.yaml"),
            *("--device", "gpu", "--num-gpus", "1", "--gpu-memory-gib", "2"),
            *("--results", "results"),
        ],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert "over, pruned before launch" in done.stdout, done.stdout[-3000:] + done.stderr[-3000:]
    runs = {p.name: p for p in (tmp_path / "results" / "runs").iterdir()}
    (big,) = [p for name, p in runs.items() if ".eb4096-" in name]
    outcome = (big / "outcome.json").read_text()
    assert '"status": "skipped"' in outcome and "pruned: predicted to need" in outcome
    assert not (big / "stderr.log").exists()  # never launched
    (small,) = [p for name, p in runs.items() if ".eb2-" in name]
    assert "needs 1 GPU(s)" in (small / "outcome.json").read_text()
    with open(tmp_path / "results" / "plan.csv", newline="") as f:
        verdicts = {r["effective_batch_size"]: r["memory_verdict"] for r in csv.DictReader(f)}
    assert verdicts == {"2": "fits", "4096": "over"}
    summary = (tmp_path / "results" / "summary.md").read_text()
    assert "## Memory: predicted before launch, and measured" in summary
    assert f"- {big.name}: pruned before launch, predicted" in summary
