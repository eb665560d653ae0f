"""A profiled cell for real: two gloo DDP processes on the CPU, traces, communication columns."""

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
scenarios:
  - name: profiled
    device: cpu
    framework_config: [ddp]
    num_gpus: [2]
    profile: true
    profile_steps: 2
    arguments:
      model_name_or_path: tiny-llama
      max_seq_len: 64
      warmup_steps_excluded: 2
"""


@pytest.fixture(scope="module")
def profiled(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One run of the profiled cell: the results folder, its row and its result."""
    work = tmp_path_factory.mktemp("profile")
    (work / "scenarios.yaml").write_text(SCENARIOS)
    (work / "defaults.yaml").write_text(DEFAULTS)
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
    }
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
        (row,) = list(csv.DictReader(f))
    (run,) = [p for p in (results / "runs").iterdir() if p.is_dir()]
    result = json.loads((run / "result.json").read_text())
    return {"results": results, "run": run, "row": row, "result": result}


def test_a_trace_per_rank(profiled: dict[str, Any]) -> None:
    for rank in (0, 1):
        trace = profiled["run"] / "profile" / f"rank{rank}.json"
        events = json.loads(trace.read_text())["traceEvents"]
        names = [e.get("name", "") for e in events]
        assert sorted(n for n in names if n.startswith("ProfilerStep#")) == [
            "ProfilerStep#0",
            "ProfilerStep#1",
        ]
        # gloo's collectives are in the trace, and operators of the model
        assert any(n.startswith("gloo:") for n in names)
        assert any(n == "aten::mm" or n == "aten::addmm" for n in names)


def test_the_communication_columns(profiled: dict[str, Any]) -> None:
    row = profiled["row"]
    assert row["status"] == "ok"
    assert 0 < float(row["comm_time_pct"]) < 100
    assert 0 < float(row["compute_time_pct"]) <= 100
    assert 0 <= float(row["comm_exposed_time_pct"]) <= float(row["comm_time_pct"])
    assert float(row["comm_time_per_step_ms"]) > 0
    top = row["top_ops"].split(", ")
    assert len(top) == 5 and all(op.rsplit(" ", 1)[1].endswith("%") for op in top)


def test_the_profiled_steps_are_not_measured(profiled: dict[str, Any]) -> None:
    metrics = profiled["result"]["metrics"]
    assert metrics["steps"] == 6 and metrics["warmup_steps_excluded"] == 2
    assert metrics["profiled_steps"] == 2 and metrics["steps_measured"] == 2
    # the measured time is the slowest rank's last two steps: not the profiled ones
    ranks = profiled["result"]["ranks"]
    assert metrics["measured_time_s"] == pytest.approx(
        max(sum(r["step_times_s"][4:6]) for r in ranks)
    )
    assert metrics["profile_export_s"] > 0


def test_the_summary_has_a_communication_section(profiled: dict[str, Any]) -> None:
    summary = (profiled["results"] / "summary.md").read_text()
    section = summary.split("## Communication", 1)[1]
    assert "| profiled | tiny-llama | ddp | 2 |" in section
