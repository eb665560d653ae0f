"""Loss equivalence, the recommendation and the plan's estimate, for real: one tiny-llama
matrix (a baseline and an overlay with a 100× learning rate) through ``tunematrix run``,
then ``plan`` on its history and ``compare`` of the folder with itself."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest
from test_run import REPO, env, tunematrix

pytestmark = pytest.mark.e2e

SCENARIOS = f"""\
accelerate_config: {REPO / "accelerate-ddp.yaml"}
frameworks:
  hot-lr:
    description: the learning rate 100 times the baseline's, so the loss departs
    arguments: {{learning_rate: 0.1}}
matrix:
  effective_batch_size: [4]
  max_seq_len: [32]
  packing: [true]
scenarios:
  - name: eq
    device: cpu
    framework_config: [null, hot-lr]
    num_gpus: [1]
    arguments:
      model_name_or_path: tiny-llama
      max_steps: 5
      logging_steps: 1
      learning_rate: 1e-3
      warmup_steps: 0
      warmup_steps_excluded: 1
"""


def _command(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", *args],
        cwd=cwd,
        env=env(),
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("recommend")
    (root / "scenarios.yaml").write_text(SCENARIOS)
    proc = tunematrix(root, "--scenarios", "scenarios.yaml", "--device", "cpu", "--results", "res")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return root / "res"


def _cells(results: Path) -> dict[str, dict[str, str]]:
    with (results / "benchmarks.csv").open() as f:
        return {row["framework_config"]: row for row in csv.DictReader(f)}


def test_summary_opens_with_the_recommendation_and_flags_the_variant(results: Path) -> None:
    cells = _cells(results)
    base, hot = cells["none"], cells["hot-lr"]
    assert base["loss_vs_baseline"] == "baseline"
    assert hot["loss_baseline"] == base["cell_id"]
    assert hot["loss_vs_baseline"] in ("different", "fast but different")
    assert float(hot["loss_gap_pct"]) > 5.0
    assert hot["loss_steps_compared"] == "5"

    summary = (results / "summary.md").read_text().splitlines()
    assert summary[:3] == ["# Benchmark summary", "", "## Recommendation"]
    (row,) = [line for line in summary if line.startswith("| tiny-llama | 1 |")]
    # the baseline is recommended whichever is faster: the other one trains differently
    assert f"`{base['cell_id']}`" in row
    if hot["loss_vs_baseline"] == "fast but different":
        assert any(line.startswith(f"- **warning**: `{hot['cell_id']}`") for line in summary)
    start = summary.index("## Loss against the baseline")
    (variant,) = [line for line in summary[start:] if hot["cell_id"] in line]
    assert variant.endswith(f"**{hot['loss_vs_baseline']}** |")


def test_plan_estimates_from_the_history_and_compare_finds_no_loss_change(
    results: Path,
) -> None:
    root = results.parent
    plan = _command(
        root,
        "plan",
        "--scenarios",
        "scenarios.yaml",
        "--device",
        "cpu",
        "--results",
        "res",
        "--usd-per-gpu-hour",
        "3",
    )
    assert plan.returncode == 0, plan.stderr[-2000:]
    (estimate,) = [line for line in plan.stdout.splitlines() if line.startswith("estimate:")]
    assert "process-hours for 2 of 2 experiment(s)" in estimate and "at $3 per GPU-hour" in estimate
    assert "2 experiment(s) from their own earlier runs, 0 from similar cells" in plan.stdout
    assert "0 with no history" in plan.stdout

    compare = _command(root, "compare", "res", "res", "--no-plots")
    assert compare.returncode == 0, compare.stdout[-2000:] + compare.stderr[-2000:]
    assert "loss curves: 2 matched cell(s) compared, 0 loss change(s)" in compare.stdout
    assert "**0 loss change(s)** in 2 matched cell(s)" in (results / "compare.md").read_text()
