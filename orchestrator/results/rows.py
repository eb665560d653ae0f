"""``raw_summary.csv``: one row per planned experiment (and repeat), every status.

A row joins three records: the experiment as planned, the parent's outcome
(status, error, log, wall time, the sidecar's memory figures) and the child's
``result.json`` (the measurements). Every planned experiment gets a row,
including those that failed, ran out of memory, timed out or never started.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from orchestrator.contract.layout import write_atomic
from orchestrator.matrix.table import KEY_COLUMNS

#: DESIGN.md's columns, in its order, after the key columns.
METRIC_COLUMNS = (
    "error",
    "log",
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
)

#: Further figures of the result's ``metrics``, after the ones above.
EXTRA_METRICS = (
    "step_time_mean_s",
    "step_time_min_s",
    "step_time_max_s",
    "steps",
    "steps_measured",
    "warmup_steps_excluded",
    "tokens_measured",
    "tokens_total",
    "padded_tokens_total",
    "padding_fraction",
    "measured_time_s",
    "loss_first",
    "loss_last",
    "loss_mean_last10pct",
    "hardware_flops_per_token",
    "achieved_tflops_per_device",
    "peak_tflops_per_device",
    "torch_max_memory_allocated_bytes",
    "torch_max_memory_reserved_bytes",
    "mem_load_peak_bytes",
    "mem_stage_source",
    "mfu_precision",
)

OUTCOME_COLUMNS = (
    "wall_s",
    "job_s",
    "returncode",
    "started_at",
    "finished_at",
    "world_size",
    "trainable_params",
    "total_params",
    "time_to_first_step_s",
    "data_cache_hit",
    "data_tokens",
    "mem_tree_peak_pss_bytes",
    "mem_tree_peak_measure",
    "mem_tree_peak_rss_bytes",
    "mem_nvidia_peak_bytes_mean",
    "mem_nvidia_peak_bytes_max",
    "memory_backend",
    "devices",
    "attempt",
    "run_mode",
    "packed_with",
    "executor",
    "slurm_job_id",
)


def build_row(
    spec: Mapping[str, Any], outcome: Mapping[str, Any], result: Mapping[str, Any] | None
) -> dict[str, Any]:
    """One row: the planned experiment (``Experiment.spec()`` or a run's ``spec.json``),
    the parent's outcome and the child's figures."""
    arguments = dict(spec.get("arguments") or {})
    row: dict[str, Any] = {
        "experiment_id": spec.get("experiment_id"),
        "scenario": spec.get("scenario"),
        "framework_config": spec.get("framework_config"),
        "model_name_or_path": spec.get("model_name_or_path"),
        "num_gpus": spec.get("num_gpus"),
        "per_device_train_batch_size": spec.get("per_device_train_batch_size"),
        "gradient_accumulation_steps": spec.get("gradient_accumulation_steps"),
        "effective_batch_size": spec.get("effective_batch_size"),
        "max_seq_len": spec.get("max_seq_len"),
        "packing": spec.get("packing"),
        "peft_method": arguments.get("peft_method"),
        "torch_dtype": arguments.get("torch_dtype"),
        "device": spec.get("device"),
        "repeat": spec.get("repeat"),
        "cell_id": spec.get("cell_id"),
        "status": outcome.get("status"),
        "error": outcome.get("error"),
        "log": outcome.get("log"),
    }
    for key, value in (spec.get("swept") or {}).items():
        row.setdefault(key, value)
    metrics = dict((result or {}).get("metrics") or {})
    for key in (*METRIC_COLUMNS, *EXTRA_METRICS):
        if key in metrics and key not in row:
            row[key] = metrics[key]
    memory = outcome.get("memory") or {}
    row["mem_nvidia_mem_reserved"] = memory.get("mem_nvidia_mem_reserved")
    # the job's tree: PSS (shared pages split between the processes that map them), and
    # whether RSS stood in for a process; the summed RSS counts shared pages once per process
    row["mem_tree_peak_pss_bytes"] = memory.get("mem_tree_peak_pss_bytes")
    row["mem_tree_peak_measure"] = memory.get("mem_tree_peak_measure")
    row["mem_tree_peak_rss_bytes"] = memory.get("mem_tree_peak_rss_bytes")
    row["mem_nvidia_peak_bytes_mean"] = memory.get("mem_nvidia_peak_bytes_mean")
    row["mem_nvidia_peak_bytes_max"] = memory.get("mem_nvidia_peak_bytes_max")
    row["gpu_device_name"] = (result or {}).get("gpu_device_name") or outcome.get("gpu_device_name")
    if result:
        row["world_size"] = result.get("world_size")
        model = result.get("model") or {}
        row["trainable_params"] = model.get("trainable_params")
        row["total_params"] = model.get("total_params")
        row["time_to_first_step_s"] = (result.get("timings") or {}).get("time_to_first_step_s")
        row["data_cache_hit"] = (result.get("data") or {}).get("cache_hit")
        row["data_tokens"] = (result.get("data") or {}).get("tokens")
    for key in (
        "wall_s",
        "job_s",
        "returncode",
        "started_at",
        "finished_at",
        "memory_backend",
        "devices",
        "attempt",
        "run_mode",
        "packed_with",
        "executor",
        "slurm_job_id",
    ):
        row[key] = outcome.get(key)
    # every scenario argument, by its own name (those already shown above are not repeated)
    for key, value in arguments.items():
        row.setdefault(key, value)
    return row


def column_order(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    fixed = [*KEY_COLUMNS, *METRIC_COLUMNS, *EXTRA_METRICS, *OUTCOME_COLUMNS]
    seen = dict.fromkeys(fixed)
    for row in rows:
        for key in row:
            seen.setdefault(key)
    return list(seen)


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, (list, tuple, dict)):
        return json.dumps(value, sort_keys=True)
    if isinstance(value, float):
        return repr(value)
    return str(value)


def to_csv(rows: Iterable[Mapping[str, Any]]) -> str:
    rows = list(rows)
    columns = column_order(rows)
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(columns)
    for row in rows:
        writer.writerow([_cell(row.get(c)) for c in columns])
    return buf.getvalue()


def write_raw_summary(rows: Iterable[Mapping[str, Any]], path: Path) -> None:
    write_atomic(path, to_csv(rows))
