"""Packing for real on the CPU: two tiny jobs on two slots, against one at a time."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.long]

REPO = Path(__file__).resolve().parents[2]

SCENARIOS = f"""\
frameworks:
  ddp: {{accelerate_config: {REPO / "accelerate-ddp.yaml"}}}
matrix:
  effective_batch_size: [4]
scenarios:
  - name: packed
    device: cpu
    framework_config: [ddp]
    arguments:
      model_name_or_path: tiny-llama
      max_seq_len: 64
      max_steps: 4
    sweep:
      learning_rate: [1e-4, 2e-4]
"""


def _run(tmp: Path, results: str, *extra: str) -> list[dict[str, str]]:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "orchestrator",
            "run",
            "--no-check",  # only the launches are timed against each other
            "--scenarios",
            "scenarios.yaml",
            "--defaults",
            str(REPO / "defaults.yaml"),
            "--results",
            results,
            "--device",
            "cpu",
            *extra,
        ],
        cwd=tmp,
        env={**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    with (tmp / results / "raw_summary.csv").open() as f:
        return list(csv.DictReader(f))


def _overlap(results: Path, rows: list[dict[str, str]]) -> float:
    """Seconds the two runs' windows (their outcomes' start and finish) share; negative
    for the gap between them."""
    windows = []
    for row in rows:
        outcome = json.loads((results / "runs" / row["experiment_id"] / "outcome.json").read_text())
        windows.append(
            (
                datetime.fromisoformat(outcome["started_at"]),
                datetime.fromisoformat(outcome["finished_at"]),
            )
        )
    (a_start, a_end), (b_start, b_end) = windows
    return (min(a_end, b_end) - max(a_start, b_start)).total_seconds()


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="two slots side by side need two cores")
def test_two_jobs_on_two_slots_run_side_by_side(tmp_path) -> None:
    (tmp_path / "scenarios.yaml").write_text(SCENARIOS)
    packed = _run(tmp_path, "packed", "--pack", "--slots", "2")
    exclusive = _run(tmp_path, "exclusive")
    assert [r["status"] for r in packed] == ["ok"] * 2
    assert [r["status"] for r in exclusive] == ["ok"] * 2
    # packed, the two ran at the same time; alone, one after the other (what it gains is
    # benchmarks/bench_slurm.py --no-slurm times, against its target: a wall compared here
    # would read the machine's load)
    assert _overlap(tmp_path / "packed", packed) > 0
    assert _overlap(tmp_path / "exclusive", exclusive) <= 0
    # each packed job says it was packed, and with whom
    ids = {r["experiment_id"] for r in packed}
    for row in packed:
        outcome = json.loads(
            (tmp_path / "packed" / "runs" / row["experiment_id"] / "outcome.json").read_text()
        )
        assert outcome["run_mode"] == "packed"
        assert outcome["packed_with"] and set(outcome["packed_with"]) <= ids - {
            row["experiment_id"]
        }
    for row in exclusive:
        outcome = json.loads(
            (tmp_path / "exclusive" / "runs" / row["experiment_id"] / "outcome.json").read_text()
        )
        assert outcome["run_mode"] == "alone" and outcome["packed_with"] == []
    # no two jobs share a port, so none failed to rendezvous
    ports = set()
    for row in packed:
        command = (tmp_path / "packed" / "runs" / row["experiment_id"] / "command.sh").read_text()
        ports.add(command.split("--main_process_port ")[1].split()[0])
    assert len(ports) == 2
    env = json.loads((tmp_path / "packed" / "env.json").read_text())
    assert env["mode"] == "packed"
    # summary.md says so too; the exclusive run's does not
    assert "**Packed**: 2 of 2 experiment(s)" in (tmp_path / "packed" / "summary.md").read_text()
    assert "**Packed**" not in (tmp_path / "exclusive" / "summary.md").read_text()
