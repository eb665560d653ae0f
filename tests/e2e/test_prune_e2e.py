"""OOM pruning, the counterbalanced order, loss against the baseline, the recommendation
and the plan's estimate, for real: one run under a cgroup memory limit.

Two frameworks (two ladders: the baseline and an overlay with a 1000× learning
rate) × three per-device batches × two repeats of the tiny Llama on the CPU, in
a 2 GiB memory cgroup. Batch 1 fits; batch 128 (its fp32 logits alone are 128 ×
1024 × 1024 × 4 bytes = 512 MiB, several copies in the loss and its backward)
is killed by the kernel's OOM killer; its second repeat and every batch-256
experiment must then be pruned without a launch, each naming the OOM of its own
ladder. The small cell's variants run A B B A. The overlay's loss departs from
the baseline's, so summary.md, which opens with the recommendation, recommends
the baseline; ``plan`` then estimates the matrix from this run's history, and
``compare`` of the folder with itself finds no loss change.
"""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import memcgroup
import pytest

# a real kernel OOM kill in a memory cgroup (root): tox -e faults
pytestmark = [pytest.mark.e2e, pytest.mark.faults]

REPO = Path(__file__).resolve().parents[2]
LIMIT_BYTES = 2048 * 1024 * 1024

DEFAULTS = "max_steps: 4\nlogging_steps: 1\nreport_to: none\nsave_strategy: 'no'\nseed: 42\n"


def _scenarios(dataset: Path) -> str:
    return (
        f"accelerate_config: {REPO / 'accelerate-ddp.yaml'}\n"
        "frameworks:\n"
        "  hot: {arguments: {learning_rate: 1.0}}\n"
        "matrix:\n"
        "  effective_batch_size: [1, 128, 256]\n"
        "  max_seq_len: [1024]\n"
        "  repeats: 2\n"
        "scenarios:\n"
        "  - name: prune\n"
        "    device: cpu\n"
        "    framework_config: [null, hot]\n"
        "    num_gpus: [1]\n"
        "    arguments:\n"
        "      model_name_or_path: tiny-llama\n"
        "      torch_dtype: float32\n"
        "      learning_rate: 1e-3\n"
        "      warmup_steps: 0\n"
        f"      dataset: {dataset}\n"
    )


def _table(path: Path) -> list[dict[str, str]]:
    with path.open() as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def pruned_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    """The run's results folder and its stdout; the cgroup removed afterwards."""
    work = tmp_path_factory.mktemp("prune")
    with memcgroup.memory_cgroup("prune-test", LIMIT_BYTES) as folder:
        # enough packed 1024-token sequences for a batch of 128: the shipped records ×20
        shipped = (REPO / "trainer_entry" / "assets" / "instructions.jsonl").read_text()
        (work / "long.jsonl").write_text(shipped * 20)
        (work / "defaults.yaml").write_text(DEFAULTS)
        (work / "scenarios.yaml").write_text(_scenarios(work / "long.jsonl"))
        proc = subprocess.run(
            [
                sys.executable,
                *("-m", "orchestrator", "run", "--device", "cpu", "--no-check"),
                *("--scenarios", "scenarios.yaml", "--defaults", "defaults.yaml"),
                *("--results", "res"),
            ],
            cwd=work,
            env={
                **os.environ,
                "PYTHONPATH": str(REPO),
                "HF_HUB_OFFLINE": "1",
                "OMP_NUM_THREADS": "1",
            },
            capture_output=True,
            text=True,
            preexec_fn=memcgroup.joining(folder),
            timeout=400,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]  # oom and pruned are answers
        assert memcgroup.left_in(folder) == []
        yield work / "res", proc.stdout


def test_an_oom_prunes_the_larger_cells_of_its_ladder(pruned_run) -> None:
    results, stdout = pruned_run
    rows = {
        (r["framework_config"], r["per_device_train_batch_size"], r["repeat"]): r
        for r in _table(results / "raw_summary.csv")
    }
    assert len(rows) == 12
    for framework in ("none", "hot"):
        assert [rows[(framework, "1", r)]["status"] for r in "01"] == ["ok", "ok"]
        oom = rows[(framework, "128", "0")]
        assert oom["status"] == "oom", oom["error"]
        assert "out-of-memory killer" in oom["error"]
        expected = f"pruned: {oom['experiment_id']} ran out of memory"
        for key in ((framework, "128", "1"), (framework, "256", "0"), (framework, "256", "1")):
            row = rows[key]
            # pruned by the OOM of its own ladder (its framework), never the other's
            assert (row["status"], row["error"]) == ("skipped", expected), key
            assert row["tokens_per_second_global"] == ""
            # never launched: no spec, no log, only the outcome
            assert [p.name for p in (results / "runs" / row["experiment_id"]).iterdir()] == [
                "outcome.json"
            ]
            assert (
                f"pruned: {row['experiment_id']} ({oom['experiment_id']} ran out of memory)"
                in stdout
            )


def test_pruned_cells_show_as_pruned_in_every_table(pruned_run) -> None:
    results, _ = pruned_run
    cells = {
        (c["framework_config"], c["per_device_train_batch_size"]): c
        for c in _table(results / "benchmarks.csv")
    }
    for framework in ("none", "hot"):
        assert cells[(framework, "256")]["status"] == "pruned"
        assert cells[(framework, "256")]["repeats_ok"] == "0"
        assert cells[(framework, "256")]["tokens_per_second_global"] == ""
        assert cells[(framework, "128")]["status"] == "oom×1 pruned×1"
    summary = (results / "summary.md").read_text()
    table_rows = [line for line in summary.splitlines() if line.startswith("| tiny-llama |")]
    assert (
        sum(line.rstrip().endswith("| pruned |") and "| 256 × 1 |" in line for line in table_rows)
        == 2
    )
    assert "ok 4, oom 2, pruned 6" in summary
    # the recommendation comes first after the reading guide and names a cell that
    # fitted, never one that ran out of memory or was pruned
    sections = [line for line in summary.splitlines() if line.startswith("## ")]
    assert sections[:2] == ["## Reading this summary", "## Recommendation"]
    section = summary.split("## Recommendation", 1)[1].split("\n## ", 1)[0]
    (row,) = [line for line in section.splitlines() if "| tiny-llama | 1 |" in line]
    fastest = row.split("`")[1]
    assert cells[("none", "1")]["cell_id"] == fastest or cells[("hot", "1")]["cell_id"] == fastest


def test_the_variants_of_a_size_run_counterbalanced(pruned_run) -> None:
    results, _ = pruned_run
    plan = _table(results / "plan.csv")
    order = [(r["framework_config"], r["per_device_train_batch_size"], r["repeat"]) for r in plan]
    assert [r["position"] for r in plan] == [str(i) for i in range(1, 13)]
    # smallest first; within a size the two frameworks A B B A
    assert order[:4] == [
        ("none", "1", "0"),
        ("hot", "1", "0"),
        ("hot", "1", "1"),
        ("none", "1", "1"),
    ]
    assert [size for _, size, _ in order] == ["1"] * 4 + ["128"] * 4 + ["256"] * 4
    raw = {r["experiment_id"]: r["position"] for r in _table(results / "raw_summary.csv")}
    assert raw == {r["experiment_id"]: r["position"] for r in plan}


def _command(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", *args],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_overlay_trains_differently_and_the_baseline_is_recommended(pruned_run) -> None:
    results, _ = pruned_run
    cells = {
        (c["framework_config"], c["per_device_train_batch_size"]): c
        for c in _table(results / "benchmarks.csv")
    }
    base, hot = cells[("none", "1")], cells[("hot", "1")]
    assert base["loss_vs_baseline"] == "baseline"
    assert hot["loss_baseline"] == base["cell_id"]
    assert hot["loss_vs_baseline"] in ("different", "fast but different")
    assert float(hot["loss_gap_pct"]) > 5.0 and hot["loss_steps_compared"] == "4"
    summary = (results / "summary.md").read_text().splitlines()
    sections = [line for line in summary if line.startswith("## ")]
    assert sections[:2] == ["## Reading this summary", "## Recommendation"]
    # the baseline is defined before the first table uses the word
    guide = summary[: summary.index("## Recommendation")]
    assert any(line.startswith("- **baseline**:") for line in guide)
    start = summary.index("## Recommendation")
    end = next(i for i in range(start + 1, len(summary)) if summary[i].startswith("## "))
    (row,) = [line for line in summary[start:end] if "| tiny-llama | 1 |" in line]
    # the baseline whichever is faster: the overlay trains differently
    assert f"`{base['cell_id']}`" in row
    if hot["loss_vs_baseline"] == "fast but different":
        assert any(line.startswith(f"- **warning**: `{hot['cell_id']}`") for line in summary)
    start = summary.index("## Loss against the baseline")
    end = next((i for i in range(start + 1, len(summary)) if summary[i].startswith("## ")), None)
    (variant,) = [line for line in summary[start:end] if hot["cell_id"] in line]
    assert variant.endswith(f"**{hot['loss_vs_baseline']}** |")


def test_plan_estimates_from_the_history_and_compare_finds_no_loss_change(pruned_run) -> None:
    results, _ = pruned_run
    root = results.parent
    plan = _command(
        root,
        *("plan", "--scenarios", "scenarios.yaml", "--defaults", "defaults.yaml"),
        *("--device", "cpu", "--results", "res", "--usd-per-gpu-hour", "3"),
    )
    assert plan.returncode == 0, plan.stderr[-2000:]
    (estimate,) = [line for line in plan.stdout.splitlines() if line.startswith("estimate:")]
    assert "process-hours for 12 of 12 experiment(s)" in estimate
    assert "at $3 per GPU-hour" in estimate
    # the batch-1 experiments from their own cells; the others, which never finished,
    # from those similar cells
    assert "4 experiment(s) from their own earlier runs, 8 from similar cells" in plan.stdout
    assert "0 with no history" in plan.stdout

    compare = _command(root, "compare", "res", "res", "--no-plots")
    assert compare.returncode == 0, compare.stdout[-2000:] + compare.stderr[-2000:]
    assert "loss curves: 2 matched cell(s) compared, 0 loss change(s)" in compare.stdout
