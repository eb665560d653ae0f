"""raw_summary.csv rows: the plan, the parent's outcome and the child's figures joined."""

from __future__ import annotations

import csv
import io

from orchestrator.results.rows import build_row, to_csv
from orchestrator.running.progress import Progress

TEXT = """
scenarios:
  - name: a
    arguments: {model_name_or_path: org/m, learning_rate: 1e-4, peft_method: lora, r: 8}
"""


def test_row_of_an_ok_run(plan) -> None:
    (e,) = plan(TEXT, num_gpus=(2,), effective_batch_size=(8,)).experiments
    result = {
        "status": "ok",
        "gpu_device_name": "NVIDIA H100 80GB HBM3",
        "world_size": 2,
        "metrics": {
            "tokens_per_second_global": 2000.0,
            "tokens_per_second_per_device": 1000.0,
            "mfu": 0.41,
            "steps": 20,
        },
        "model": {"trainable_params": 10, "total_params": 100},
        "timings": {"time_to_first_step_s": 30.5},
        "data": {"cache_hit": True},
    }
    outcome = {
        "status": "ok",
        "log": "runs/x/stderr.log",
        "wall_s": 80.0,
        "memory": {"mem_nvidia_mem_reserved": 1234.5},
    }
    row = build_row(e.spec(), outcome, result)
    assert (
        row["experiment_id"] == e.experiment_id and row["status"] == "ok" and row["error"] is None
    )
    assert row["num_gpus"] == 2 and row["per_device_train_batch_size"] == 4
    assert row["tokens_per_second_global"] == 2000.0 and row["mfu"] == 0.41
    assert row["mem_nvidia_mem_reserved"] == 1234.5
    assert row["gpu_device_name"] == "NVIDIA H100 80GB HBM3"
    assert row["learning_rate"] == 1e-4 and row["r"] == 8  # every scenario argument
    assert row["peft_method"] == "lora" and row["time_to_first_step_s"] == 30.5


def test_row_of_a_run_that_left_nothing(plan) -> None:
    (e,) = plan(TEXT, num_gpus=(1,), effective_batch_size=(4,)).experiments
    row = build_row(
        e.spec(), {"status": "interrupted", "error": "not run: the run was interrupted"}, None
    )
    assert row["status"] == "interrupted" and row["error"] == "not run: the run was interrupted"
    assert row["scenario"] == "a" and row["num_gpus"] == 1
    assert row.get("tokens_per_second_global") is None


def test_csv_has_the_design_columns_first(plan) -> None:
    experiments = plan(TEXT, num_gpus=(1, 2), effective_batch_size=(4,)).experiments
    text = to_csv(
        build_row(e.spec(), {"status": "failed", "error": "boom"}, None) for e in experiments
    )
    reader = csv.DictReader(io.StringIO(text))
    columns = reader.fieldnames or []
    for name in (
        "experiment_id",
        "scenario",
        "framework_config",
        "model_name_or_path",
        "num_gpus",
        "per_device_train_batch_size",
        "gradient_accumulation_steps",
        "effective_batch_size",
        "max_seq_len",
        "peft_method",
        "torch_dtype",
        "status",
        "error",
        "repeat",
        "train_runtime",
        "train_samples_per_second",
        "train_steps_per_second",
        "train_tokens_per_second",
        "tokens_per_second_global",
        "tokens_per_second_per_device",
        "step_time_median_s",
        "step_time_cv",
        "train_loss",
        "mem_nvidia_mem_reserved",
        "mem_peak_torch_mem_alloc_in_bytes",
        "mem_torch_mem_alloc_in_bytes",
        "mem_peak_rss_bytes",
        "flops_per_token",
        "mfu",
        "cost_per_1m_tokens_usd",
        "gpu_device_name",
        "learning_rate",
    ):
        assert name in columns, name
    assert (
        columns.index("status")
        < columns.index("tokens_per_second_global")
        < columns.index("learning_rate")
    )
    assert [r["status"] for r in reader] == ["failed", "failed"]


class _Stream(io.StringIO):
    def isatty(self) -> bool:
        return False


def test_progress_without_a_terminal_is_plain_lines() -> None:
    stream = _Stream()
    progress = Progress(2, stream)
    progress.begin("a")
    progress.tick()  # no live line to redraw
    progress.finish("a", "ok", 12.34)
    progress.finish("b", "skipped", 0.0, "already ok", counted=False)
    assert stream.getvalue().splitlines() == [
        "[1/2] start a",
        "[1/2] ok          a  12.3s",
        "[2/2] skipped     b  0.0s  already ok",
    ]
    assert "\r" not in stream.getvalue()
