"""Build results folders on disk, as runs leave them, for report and compare tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_run(
    root: Path,
    experiment_id: str,
    *,
    scenario: str = "s",
    framework: str = "fsdp",
    model: str = "org/model",
    num_gpus: int = 1,
    effective_batch_size: int = 8,
    max_seq_len: int = 1024,
    peft_method: str | None = None,
    repeat: int = 0,
    cell_id: str | None = None,
    status: str = "ok",
    error: str | None = None,
    tps: float | None = 1000.0,
    step_time: float | None = 0.5,
    memory: float | None = 10 * 2**30,
    job_s: float = 100.0,
    data_tokens: int | None = 1_000_000,
    loss_history: list[list[float]] | None = None,
    extra_arguments: dict[str, Any] | None = None,
    device: str = "gpu",
    sidecar: dict[str, Any] | None = None,
    metrics: dict[str, Any] | None = None,
) -> Path:
    """One run's folder; ``sidecar``: more of the sidecar's figures (the outcome's
    ``memory``), ``metrics``: more of the child's."""
    run = root / "runs" / experiment_id
    run.mkdir(parents=True, exist_ok=True)
    pd = effective_batch_size // num_gpus
    arguments = {
        "model_name_or_path": model,
        "per_device_train_batch_size": pd,
        "gradient_accumulation_steps": 1,
        "max_seq_len": max_seq_len,
        "packing": True,
        "learning_rate": 1e-4,
        **({"peft_method": peft_method} if peft_method else {}),
        **(extra_arguments or {}),
    }
    spec = {
        "experiment_id": experiment_id,
        "cell_id": cell_id or experiment_id,
        "scenario": scenario,
        "framework_config": framework,
        "model_name_or_path": model,
        "device": device,
        "num_gpus": num_gpus,
        "effective_batch_size": effective_batch_size,
        "per_device_train_batch_size": pd,
        "gradient_accumulation_steps": 1,
        "max_seq_len": max_seq_len,
        "packing": True,
        "repeat": repeat,
        "arguments": arguments,
        "swept": {},
    }
    (run / "spec.json").write_text(json.dumps(spec))
    outcome = {
        "status": status,
        "error": error,
        "log": f"runs/{experiment_id}/stderr.log",
        "job_s": job_s,
        "wall_s": job_s + 1,
    }
    if memory is not None and device == "gpu":
        outcome["memory"] = {
            "mem_nvidia_peak_bytes_max": memory,
            "mem_nvidia_mem_reserved": memory / 2**20,
        }
    if sidecar:
        outcome["memory"] = {**outcome.get("memory", {}), **sidecar}
    (run / "outcome.json").write_text(json.dumps(outcome))
    if status == "ok":
        metrics = {
            "tokens_per_second_global": tps,
            "tokens_per_second_per_device": tps / num_gpus if tps is not None else None,
            "step_time_median_s": step_time,
            "train_tokens_per_second": tps * 1.1 / num_gpus if tps is not None else None,
            "train_loss": 1.5,
            "mem_peak_rss_bytes": 2 * 2**30,
            **(metrics or {}),
        }
        result = {
            "status": "ok",
            "metrics": metrics,
            "gpu_device_name": "NVIDIA H100 80GB HBM3" if device == "gpu" else None,
            "world_size": num_gpus,
            "data": {"tokens": data_tokens},
            "loss_history": loss_history or [[1, 2.0], [2, 1.8], [3, 1.6]],
        }
        (run / "result.json").write_text(json.dumps(result))
    elif status in ("oom", "failed"):
        (run / "result.json").write_text(json.dumps({"status": status, "error": error}))
    return run
