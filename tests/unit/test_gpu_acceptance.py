"""benchmarks/gpu_acceptance.py: without a GPU, one line and exit 0 before torch; its checks."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "gpu_acceptance.py"


def load() -> object:
    spec = importlib.util.spec_from_file_location("gpu_acceptance", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_without_a_gpu_it_says_so_in_one_line_before_importing_torch() -> None:
    probe = (
        "import runpy, sys\n"
        f"sys.argv = [{str(SCRIPT)!r}]\n"
        "try:\n"
        f"    runpy.run_path({str(SCRIPT)!r}, run_name='__main__')\n"
        "except SystemExit as e:\n"
        "    print('exit', e.code, 'torch' in sys.modules)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": ""},
    )
    lines = proc.stdout.splitlines()
    acceptance = load()
    if acceptance.gpus()[0]:  # type: ignore[attr-defined]
        return  # a GPU machine: the run itself is the check
    assert lines == [
        "gpu_acceptance: no GPU on this machine (NVML and the driver found none); nothing run",
        "exit 0 False",
    ], proc.stdout + proc.stderr


def test_the_checks_pass_and_fail_on_the_figures() -> None:
    acceptance = load()
    row = {
        "status": "ok",
        "tokens_per_second_per_device": "1000",
        "tokens_measured": "4096",
        "flops_per_token": "100",
        "hardware_flops_per_token": "130",
        "mem_nvidia_peak_bytes_max": str(10 * 2**30),
        "torch_max_memory_reserved_bytes": str(9 * 2**30),
        "time_to_first_step_s": "10",
        "steps_measured": "18",
    }
    rows = {
        "hf-full": row,
        "sft-full": {**row, "tokens_per_second_per_device": "900"},
        "steady": {**row, "tokens_per_second_per_device": "1010"},
        "fsdp-full": {**row, "time_to_first_step_s": "25"},
    }
    oom = [
        {"effective_batch_size": "128", "status": "pruned"},
        {"effective_batch_size": "64", "status": "oom"},
    ]
    plain = {
        "plain_tokens_per_second": 1000.0,
        "flop_counter_per_token": 101.0,
        "flop_counter_per_token_recompute": 140.0,
        "cuda_context_bytes": 2**30 // 2,
    }
    table = acceptance.checks(
        rows, oom, {**row, "tokens_per_second_per_device": "950"}, plain, True
    )  # type: ignore[attr-defined]
    result = {check: ok for check, _, _, ok in table}
    assert result["hf-full: tokens/s"] is True
    assert result["sft-full: tokens/s"] is False  # 900 < 0.95 x 1000
    assert result["hf-lora: tokens/s"] is None  # no row
    assert result["sft and hf: same tokens and FLOPs/token"] is True
    assert result["flops_per_token vs FlopCounterMode"] is True  # 1% off
    assert result["hardware_flops_per_token vs FlopCounterMode (recompute)"] is False  # 7% off
    assert result["NVML peak vs torch reserved peak + CUDA context"] is False  # 10 vs 9.5 GiB
    assert result["oversized cell, then the larger"] is True
    assert result["FSDP time to first step vs DDP's"] is False  # 25 > 2 x 10
    assert result["steady cell vs fixed steps: tokens/s"] is True
    assert result["MEMORY_LOGGING=hf-tracker: tokens/s cost"] is None  # reported, not judged
    text = acceptance.render(table, {"date": "2026-11-25", "device": "NVIDIA H200"})  # type: ignore[attr-defined]
    assert "| sft-full: tokens/s | 900 tok/s (ok) | >= 0.95 x plain loop 1,000 | FAIL |" in text


def test_the_shared_launch_checks_compare_each_cell_with_its_own_launch() -> None:
    acceptance = load()
    fresh = {
        "status": "ok",
        "scenario": "hf-full",
        "tokens_per_second": 1000.0,
        "peak": 10.0 * 2**30,
        "peak_name": "torch_max_memory_reserved_bytes",
        "nvml_peak": 11.0 * 2**30,
        "loss_history": [2.0, 1.5],
    }
    shared = {**fresh, "tokens_per_second": 985.0, "nvml_peak": 11.5 * 2**30}
    lora = {**fresh, "scenario": "hf-lora", "nvml_peak": None}
    table = acceptance.shared_checks(  # type: ignore[attr-defined]
        {"a": fresh, "b": lora, "c": {**fresh, "scenario": "sft-full"}},
        {"a": shared, "b": {**lora, "loss_history": [2.0, 1.4]}},
        100.0,
        60.0,
    )
    result = {check: (measured, ok) for check, measured, _, ok in table}
    wall = "the matrix: running its cells, one launch per family vs one per cell"
    assert result[wall] == ("60 vs 100 s (0.60x)", None)  # reported, not judged
    assert result["hf-full: tokens/s, shared vs own launch"][1] is True  # 1.5% off
    peak = "hf-full: peak (torch_max_memory_reserved_bytes), shared vs own launch"
    assert result[peak][1] is True
    assert result["hf-full: NVML peak, shared vs own launch"][1] is False  # 4.5% off
    assert result["hf-full: loss curve, shared vs own launch"][1] is True
    assert result["hf-lora: NVML peak, shared vs own launch"][1] is None  # not measured
    assert result["hf-lora: loss curve, shared vs own launch"][1] is False
    assert result["sft-full: shared launch"] == ("missing", False)
