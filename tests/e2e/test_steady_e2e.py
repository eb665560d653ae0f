"""Steady-state measuring for real: two gloo DDP processes on the CPU stop together.

One ``tunematrix run`` of two cells: one whose loose precision is reached long
before its step cap, and one whose tiny precision never is.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.long]

REPO = Path(__file__).resolve().parents[2]

DEFAULTS = """\
max_steps: 6
logging_steps: 1
learning_rate: 1e-3
report_to: none
save_strategy: "no"
"""

SCENARIOS = f"""\
frameworks:
  ddp: {{accelerate_config: {REPO / "accelerate-ddp.yaml"}}}
matrix:
  effective_batch_size: [4]
  max_seq_len: [32]
  packing: [true]
scenarios:
  - name: settles
    device: cpu
    framework_config: [ddp]
    num_gpus: [2]
    measure: {{until: steady, precision: 0.8, min_steps: 9, max_steps: 40}}
    arguments:
      model_name_or_path: tiny-llama
  - name: never
    device: cpu
    framework_config: [ddp]
    num_gpus: [2]
    measure: {{until: steady, precision: 0.0001, min_steps: 3, max_steps: 28}}
    arguments:
      model_name_or_path: tiny-llama
"""


@pytest.fixture(scope="module")
def steady(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One run of both cells: each one's row, result and outcome, by scenario."""
    work = tmp_path_factory.mktemp("steady")
    (work / "scenarios.yaml").write_text(SCENARIOS)
    (work / "defaults.yaml").write_text(DEFAULTS)
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [
            *(sys.executable, "-m", "orchestrator", "run", "--no-check"),
            *("--scenarios", "scenarios.yaml"),
            *("--device", "cpu", "--num-gpus", "2", "--results", "results"),
        ],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    results = work / "results"
    with (results / "raw_summary.csv").open() as f:
        rows = {row["scenario"]: row for row in csv.DictReader(f)}
    out: dict[str, Any] = {"summary": (results / "summary.md").read_text()}
    for scenario, row in rows.items():
        run = results / "runs" / row["experiment_id"]
        out[scenario] = {
            "row": row,
            "result": json.loads((run / "result.json").read_text()),
            "outcome": json.loads((run / "outcome.json").read_text()),
        }
    return out


def _coherent(cell: dict[str, Any]) -> int:
    """The run's steps, checked against its tokens, loss log and both ranks' records."""
    row, result = cell["row"], cell["result"]
    steps = int(row["steps"])
    # both ranks ran every step and left cleanly
    assert cell["outcome"]["status"] == "ok" and cell["outcome"]["returncode"] == 0
    assert [len(r["step_times_s"]) for r in result["ranks"]] == [steps, steps]
    # packed rows of 32 tokens, 4 a step over the two ranks: every step's tokens counted once
    assert int(row["tokens_total"]) == steps * 4 * 32
    assert [sum(r["step_tokens"]) for r in result["ranks"]] == [steps * 2 * 32] * 2
    # the loss log ends at the last step run, and the window ends there too
    assert result["loss_history"][-1][0] == steps
    assert int(row["steps_measured"]) == steps - int(row["warmup_steps_excluded"])
    return steps


def test_a_loose_precision_stops_early_on_every_rank(steady: dict[str, Any]) -> None:
    cell = steady["settles"]
    steps = _coherent(cell)
    row = cell["row"]
    assert row["measure_until"] == "steady" and row["measure_stopped"] == "steady"
    assert steps < 40 and int(row["max_steps"]) == 40
    assert int(row["steps_measured"]) >= 25  # a stop needs 5 batches
    assert 0 < float(row["step_time_ci_pct"]) <= 80
    assert not any("did not settle" in n for n in cell["result"]["notes"])


def test_a_cell_that_cannot_settle_stops_at_max_steps_with_a_note(
    steady: dict[str, Any],
) -> None:
    cell = steady["never"]
    assert _coherent(cell) == 28
    row = cell["row"]
    assert row["measure_until"] == "steady" and row["measure_stopped"] == "max_steps"
    assert float(row["step_time_ci_pct"]) > 0.01
    (note,) = [n for n in cell["result"]["notes"] if n.startswith("did not settle")]
    assert "after 28 steps (25 measured)" in note and "stopped at max_steps 28" in note
    assert row["experiment_id"] in steady["summary"]
    assert "1 did not settle" in steady["summary"]
