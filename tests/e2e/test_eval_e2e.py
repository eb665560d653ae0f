"""``eval: true`` for real: a tiny-llama cell through ``tunematrix run`` (accelerate launch,
the sidecar, the report), and a tiny-bert classification child with its accuracy."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest
from test_child import run_child
from test_run import REPO, tunematrix

pytestmark = [pytest.mark.e2e, pytest.mark.long]

MAX_STEPS = 5
BATCH = 4
SEQ = 64
HOLDOUT = 12


def test_eval_after_training_through_run(tmp_path: Path) -> None:
    (tmp_path / "scenarios.yaml").write_text(
        "frameworks:\n"
        f"  ddp: {{accelerate_config: {REPO / 'accelerate-ddp.yaml'}}}\n"
        f"matrix:\n  effective_batch_size: [{BATCH}]\n  max_seq_len: [{SEQ}]\n"
        "  packing: [true]\n"
        "scenarios:\n"
        "  - name: ev\n"
        "    device: cpu\n"
        "    framework_config: [ddp]\n"
        "    num_gpus: [1]\n"
        "    arguments:\n"
        "      model_name_or_path: tiny-llama\n"
        "      trainer: hf\n"
        f"      max_steps: {MAX_STEPS}\n"
        "      logging_steps: 1\n"
        "      learning_rate: 1e-3\n"
        "      warmup_steps_excluded: 1\n"
        "      eval: true\n"
        f"      holdout: {HOLDOUT}\n"
    )
    proc = tunematrix(
        tmp_path, "--scenarios", "scenarios.yaml", "--device", "cpu", "--results", "res"
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = tmp_path / "res"
    (run,) = list((results / "runs").iterdir())
    result = json.loads((run / "result.json").read_text())
    m = result["metrics"]
    assert result["status"] == "ok"
    # the eval figures: the loss on the held-out rows, its exp, the time eval took
    assert math.isfinite(m["eval_loss"]) and m["eval_loss"] > 0
    assert m["perplexity"] == pytest.approx(math.exp(m["eval_loss"]), rel=1e-9)
    assert m["eval_runtime"] > 0 and m["eval_accuracy"] is None
    assert result["data"]["heldout_sequences"] == HOLDOUT
    assert m["eval_samples"] >= 1  # the held-out documents, packed into rows of SEQ
    # training is measured as without eval: every step recorded once, none of eval's,
    # and packed rows make the measured tokens exact
    assert len(result["ranks"][0]["step_times_s"]) == MAX_STEPS == m["steps"]
    assert m["steps_measured"] == MAX_STEPS - 1
    assert m["tokens_measured"] == m["steps_measured"] * BATCH * SEQ
    assert m["tokens_total"] == MAX_STEPS * BATCH * SEQ
    progress = json.loads((run / "progress.json").read_text())
    assert progress["step"] == MAX_STEPS
    # the loss trend over the measured steps, from the logged losses
    assert isinstance(m["loss_slope_per_step"], float) and m["loss_nonfinite_steps"] == 0
    # the tables and the report
    with (results / "benchmarks.csv").open() as f:
        (cell,) = list(csv.DictReader(f))
    assert float(cell["eval_loss"]) == pytest.approx(m["eval_loss"])
    assert float(cell["perplexity"]) == pytest.approx(m["perplexity"])
    summary = (results / "summary.md").read_text()
    # the scenario's table (after the recommendation, which opens summary.md)
    tables = [line for line in summary.splitlines() if line.startswith("| model")]
    assert any("| quality |" in header and "| status |" in header for header in tables)
    assert f"ppl {m['perplexity']:.4g}; {m['loss_slope_per_step']:+.3g}/step" in summary


def test_classification_eval_reports_accuracy(tmp_path: Path) -> None:
    arguments = {
        "task": "seq-classification",
        "model_name_or_path": "tiny-bert",
        "max_seq_len": 48,
        "per_device_train_batch_size": 8,
        "max_steps": 3,
        "logging_steps": 1,
        "learning_rate": 1e-3,
        "eval": True,
        "holdout": 10,
    }
    proc, result = run_child(tmp_path, arguments)
    assert proc.returncode == 0, proc.stderr[-3000:]
    m = result["metrics"]
    assert result["status"] == "ok" and m["steps"] == 3
    assert math.isfinite(m["eval_loss"]) and m["perplexity"] is None
    assert m["eval_samples"] == 10 and m["eval_runtime"] > 0
    # a share of 10 samples classified right
    assert 0 <= m["eval_accuracy"] <= 1 and round(m["eval_accuracy"] * 10, 6).is_integer()
    data = result["data"]
    assert data["heldout_sequences"] == 10 and data["sequences"] == data["examples"] - 10
