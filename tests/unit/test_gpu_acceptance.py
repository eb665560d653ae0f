"""benchmarks/gpu_acceptance.py: without a GPU, one line and exit 0 before torch; its checks,
on the run folders a real ``--cpu-smoke`` run left (tests/fixtures/acceptance-cpu: their
spec, outcome and result files, read through the project's own readers), changed the way
real runs fail: a row missing, a status not ok, a figure missing, an out-of-memory cell
and the one pruned behind it written by the project's own outcome writer."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from orchestrator.contract.gpumemory import MemoryPrediction
from orchestrator.contract.layout import RunPaths
from orchestrator.contract.outcome import (
    Outcome,
    Skip,
    read_outcome,
    write_outcome,
)

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "gpu_acceptance.py"
FIXTURE = REPO / "tests" / "fixtures" / "acceptance-cpu"


def load() -> Any:
    spec = importlib.util.spec_from_file_location("gpu_acceptance", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


acceptance = load()


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
    if acceptance.gpus()[0]:
        return  # a GPU machine: the run itself is the check
    assert lines == [
        "gpu_acceptance: no GPU on this machine (NVML and the driver found none); nothing run",
        "exit 0 False",
    ], proc.stdout + proc.stderr


@pytest.fixture
def folders(tmp_path: Path) -> Path:
    """A copy of the real --cpu-smoke run's folders, to change."""
    shutil.copytree(FIXTURE, tmp_path / "run")
    return tmp_path / "run"


def _checks(root: Path, *, on_gpu: bool = False, parts: int = 5) -> dict[str, Any]:
    independent = json.loads((root / "independent.json").read_text())
    names = ("matrix", "fresh", "tracker", "families")
    runs = [
        acceptance.Runs.read(root / name, 0, asked=sorted(acceptance.FAMILIES) if i == 3 else ())
        for i, name in enumerate(names)
    ]
    table = acceptance.checks(
        independent,
        *(runs[i] if i < parts - 1 else None for i in range(4)),
        on_gpu=on_gpu,
    )
    return {c.name: c for c in table}


def _run(root: Path, part: str, scenario: str) -> Path:
    (found,) = [p for p in (root / part / "runs").iterdir() if p.name.startswith(f"{scenario}.")]
    return found


def test_the_real_cpu_run_passes_its_judged_checks(folders: Path) -> None:
    checks = _checks(folders)
    judged = {name: c.result for name, c in checks.items() if c.result != "reported"}
    assert judged and set(judged.values()) == {"pass"}, judged
    # what the CPU run judges: FLOPs against the counter, its rows' phases, each fresh
    # launch against its shared one (peak RSS, loss curve), sft against hf
    for name in (
        "flops_per_token vs FlopCounterMode",
        "hardware_flops_per_token vs FlopCounterMode (recompute)",
        "sft and hf: same tokens and FLOPs/token",
        "hf-full: training phase vs its step times",
        "hf-lora: mem_peak_rss_bytes, shared vs own launch",
        "sft-lora: loss curve, shared vs own launch",
        "independent: plain loop, plain PEFT loop, FlopCounterMode",
    ):
        assert checks[name].result == "pass", name
    # its speed comparisons are shown, not judged (6 steps of the tiny model on a CPU)
    assert checks["hf-full: tokens/s"].result == "reported"
    assert checks["MEMORY_LOGGING=hf-tracker: tokens/s cost"].result == "reported"
    # and no GPU-only check is in its table
    assert not any("NVML" in name or "MFU" in name or "oversized" in name for name in checks)


def test_a_missing_row_a_failed_status_or_a_missing_figure_fails(folders: Path) -> None:
    shutil.rmtree(_run(folders, "matrix", "sft-full"))
    failed = _run(folders, "matrix", "hf-lora")
    outcome = read_outcome(RunPaths(failed))
    assert outcome is not None
    outcome.status, outcome.error = "failed", "RuntimeError: boom"
    write_outcome(RunPaths(failed), outcome)
    result_path = _run(folders, "matrix", "hf-full") / "result.json"
    result = json.loads(result_path.read_text())
    result["metrics"]["hardware_flops_per_token"] = None
    result_path.write_text(json.dumps(result))
    checks = _checks(folders)
    assert checks["sft-full: tokens/s"].result == "FAIL"  # a shown figure, but no row
    assert checks["sft-full: tokens/s"].measured == "sft-full: missing"
    assert checks["sft and hf: same tokens and FLOPs/token"].result == "FAIL"
    assert checks["hf-lora: tokens/s"].result == "FAIL"
    assert checks["hf-lora: tokens/s"].measured.startswith("hf-lora: failed: RuntimeError")
    hardware = checks["hardware_flops_per_token vs FlopCounterMode (recompute)"]
    assert (hardware.result, hardware.measured) == ("FAIL", "hf-full: no hardware_flops_per_token")
    # a shared run that failed: its comparison with its own launch fails too
    assert checks["hf-lora: loss curve, shared vs own launch"].result == "FAIL"


def test_a_figure_off_by_more_than_its_tolerance_fails(folders: Path) -> None:
    independent = json.loads((folders / "independent.json").read_text())
    independent["flop_counter_per_token_recompute"] *= 1.054  # the H100's gap
    (folders / "independent.json").write_text(json.dumps(independent))
    result_path = _run(folders, "matrix", "hf-full") / "result.json"
    result = json.loads(result_path.read_text())
    result["activation_checkpointing_mode"] = "reentrant"
    result_path.write_text(json.dumps(result))
    checks = _checks(folders)
    hardware = checks["hardware_flops_per_token vs FlopCounterMode (recompute)"]
    assert hardware.result == "FAIL" and "(0.949x)" in hardware.measured
    # within tolerance but in another mode than the counter's: no comparison
    independent["flop_counter_per_token_recompute"] /= 1.054
    (folders / "independent.json").write_text(json.dumps(independent))
    hardware = _checks(folders)["hardware_flops_per_token vs FlopCounterMode (recompute)"]
    assert hardware.result == "FAIL" and "checkpointed reentrant" in hardware.measured


def test_each_task_family_is_judged_and_a_missing_figure_or_cell_fails(folders: Path) -> None:
    checks = _checks(folders)
    names = [f"{name}: trains, counts and FLOPs" for name in acceptance.FAMILIES]
    assert [checks[n].result for n in names] == ["pass"] * len(acceptance.FAMILIES) == ["pass"] * 4
    # without the part (a run cut off before it), no family check
    assert not any(n in _checks(folders, parts=4) for n in names)
    result_path = _run(folders, "families", "seq2seq-t5") / "result.json"
    result = json.loads(result_path.read_text())
    result["metrics"]["source_tokens_per_second_global"] = None
    result_path.write_text(json.dumps(result))
    shutil.rmtree(_run(folders, "families", "speech-whisper"))
    checks = _checks(folders)
    seq2seq = checks["seq2seq-t5: trains, counts and FLOPs"]
    assert seq2seq.result == "FAIL" and "source_tokens_per_second_global" in seq2seq.measured
    speech = checks["speech-whisper: trains, counts and FLOPs"]
    assert speech.result == "FAIL" and "speech-whisper: missing" in speech.measured
    assert checks["masked-lm-bert: trains, counts and FLOPs"].result == "pass"


def test_independent_figures_missing_fail_and_survive_a_cut_off(folders: Path) -> None:
    independent = json.loads((folders / "independent.json").read_text())
    del independent["plain_lora_tokens_per_second"]
    (folders / "independent.json").write_text(json.dumps(independent))
    # cut off after the first part: only the independent figures are in the table
    checks = _checks(folders, parts=1)
    assert list(checks) == ["independent: plain loop, plain PEFT loop, FlopCounterMode"]
    (check,) = checks.values()
    assert check.result == "FAIL" and "plain_lora_tokens_per_second" in check.measured
    # the LoRA rows, once there, have nothing to be held to
    assert _checks(folders)["hf-lora: tokens/s"].result == "FAIL"


def _as_gpu(root: Path) -> None:
    """The real CPU rows, given the figures a GPU run adds (a device, its memory and
    utilisation), so that the GPU-only checks are made of them."""
    hf = json.loads((_run(root, "matrix", "hf-full") / "result.json").read_text())
    independent = json.loads((root / "independent.json").read_text())
    independent.update(
        cuda_context_bytes=2**29,
        plain_reserved_peak_bytes=40 * 2**30,
        # on the H100 the trainers ran within 1.2% of the plain loop (GPU.md)
        plain_tokens_per_second=hf["metrics"]["tokens_per_second_per_device"] * 1.01,
    )
    (root / "independent.json").write_text(json.dumps(independent))
    for part in ("matrix", "fresh", "tracker"):
        for run in (root / part / "runs").iterdir():
            result = json.loads((run / "result.json").read_text())
            result["gpu_device_name"] = "NVIDIA H100 80GB HBM3"
            metrics = result["metrics"]
            metrics["torch_max_memory_reserved_bytes"] = 40 * 2**30
            metrics["torch_max_memory_allocated_bytes"] = 34 * 2**30
            # what the project's MFU would be at the H100's peak (989.4 TFLOP/s, bf16)
            metrics["mfu"] = (
                metrics["flops_per_token"] * metrics["tokens_per_second_per_device"] / 989.4e12
            )
            metrics["mfu_precision"] = "bf16"
            (run / "result.json").write_text(json.dumps(result))
            outcome = read_outcome(RunPaths(run))
            assert outcome is not None
            outcome.memory = {
                **outcome.memory,
                "mem_nvidia_peak_bytes_max": 40.5 * 2**30,
                "gpu_util_mean_pct": 97.0,
            }
            write_outcome(RunPaths(run), outcome)


def _oversized(root: Path, statuses: list[Outcome]) -> None:
    """The oversized cells as a run leaves them: copies of a real run folder, with the
    outcomes the runner writes (an OOM, and the larger cell pruned behind it)."""
    source = _run(root, "matrix", "hf-full")
    for batch, outcome in zip((64, 128), statuses, strict=True):
        run = root / "matrix" / "runs" / f"oversized.tiny-llama.ddp.g1.eb{batch}-0000000{batch}"
        shutil.copytree(source, run)
        spec = json.loads((run / "spec.json").read_text())
        spec.update(
            experiment_id=run.name,
            cell_id=run.name,
            scenario="oversized",
            effective_batch_size=batch,
        )
        (run / "spec.json").write_text(json.dumps(spec))
        (run / "result.json").unlink()
        write_outcome(RunPaths(run), outcome)


def _predicted_over(batch: int) -> Outcome:
    prediction = MemoryPrediction(peak_bytes=batch * 13 * 10**9, terms={"activations": 1})
    return Outcome(
        status="skipped",
        error=Skip(cause="predicted_over", detail=prediction.pruned_reason(80 * 2**30)).error,
    )


def test_the_gpu_checks_read_statuses_as_the_tables_show_them(folders: Path) -> None:
    _as_gpu(folders)
    _oversized(folders, [_predicted_over(64), _predicted_over(128)])
    checks = _checks(folders, on_gpu=True)
    name = "oversized cell, then the larger: pruned before launch"
    assert (checks[name].result, checks[name].measured) == ("pass", "pruned then pruned")
    assert checks["MFU vs counted FLOPs x plain loop tokens/s / peak"].result == "pass"
    assert checks["torch reserved peak vs the plain loop's"].result == "pass"
    assert checks["hf-full: NVML peak vs torch reserved peak + CUDA context"].result == "pass"
    assert checks["hf-full: GPU utilisation"].result == "pass"
    # no FSDP row in a CPU run's folders: its checks fail, they do not read n/a
    assert checks["fsdp-full: NVML peak vs torch reserved peak + CUDA context"].result == "FAIL"
    assert checks["FSDP time to first step vs DDP's"].result == "FAIL"
    # an OOM, then pruned behind it: the prediction did not prune the first; a failure
    shutil.rmtree(folders / "matrix" / "runs" / "oversized.tiny-llama.ddp.g1.eb64-000000064")
    shutil.rmtree(folders / "matrix" / "runs" / "oversized.tiny-llama.ddp.g1.eb128-0000000128")
    oom = Outcome(status="oom", error="CUDA out of memory. Tried to allocate 4.00 GiB")
    _oversized(
        folders,
        [
            oom,
            Outcome(
                status="skipped", error=Skip(cause="out_of_memory", follows="oversized…eb64").error
            ),
        ],
    )
    check = _checks(folders, on_gpu=True)[name]
    assert (check.result, check.measured) == ("FAIL", "oom then pruned")


def test_each_trained_cell_is_held_to_its_prediction(folders: Path) -> None:
    _as_gpu(folders)
    name = "hf-full: predicted torch peak vs measured"
    # a run without predictions in its plan.csv (a CPU matrix's): the checks fail
    assert _checks(folders, on_gpu=True)[name].result == "FAIL"
    assert _checks(folders, on_gpu=True)[name].measured == "no prediction in plan.csv"
    rows = acceptance.Runs.read(folders / "matrix", 0).rows
    cells = {str(r["scenario"]): str(r["cell_id"]) for r in rows}
    allocated = {
        str(r["scenario"]): float(r["torch_max_memory_allocated_bytes"])
        for r in rows
        if r.get("torch_max_memory_allocated_bytes") not in (None, "")
    }
    assert "hf-full" in allocated

    def plan_csv(scale: float) -> None:
        lines = ["cell_id,predicted_peak_bytes"] + [
            f"{cells[s]},{int(v * scale)}" for s, v in allocated.items()
        ]
        (folders / "matrix" / "plan.csv").write_text("\n".join(lines) + "\n")

    plan_csv(1.1)
    assert _checks(folders, on_gpu=True)[name].result == "pass"
    plan_csv(1.2)
    failed = _checks(folders, on_gpu=True)[name]
    assert failed.result == "FAIL" and "(1.200x)" in failed.measured


def test_the_whole_runs_wall_is_held_to_its_window() -> None:
    table = acceptance.checks(None, None, None, None, on_gpu=True, wall_s=400.0, limit_s=360.0)
    (check,) = table
    assert (check.name, check.result) == ("the whole acceptance run: wall time", "FAIL")


def test_every_cell_failing_is_every_check_failing(folders: Path) -> None:
    for part in ("matrix", "fresh", "tracker", "families"):
        for run in (folders / part / "runs").iterdir():
            write_outcome(RunPaths(run), Outcome(status="failed", error="SpecError: no model"))
            (run / "result.json").unlink()
    (folders / "independent.json").write_text(json.dumps({"error": "failed (exit 1)"}))
    checks = _checks(folders)
    judged = [c for c in checks.values() if c.result != "reported"]
    assert judged and all(c.result == "FAIL" for c in judged)
    # the shown speed comparisons have nothing to show: they fail too
    assert checks["hf-full: tokens/s"].result == "FAIL"
    text = acceptance.render(list(checks.values()), {"date": "2026-11-27", "device": "cpu"})
    assert f"{len(checks)} checks: {len(judged)} failed" in text


def test_a_fresh_cell_asked_for_and_missing_fails_and_a_phase_must_match_its_steps(
    folders: Path,
) -> None:
    shutil.rmtree(_run(folders, "fresh", "sft-lora"))
    independent = json.loads((folders / "independent.json").read_text())
    matrix, fresh = (acceptance.Runs.read(folders / n, 0) for n in ("matrix", "fresh"))
    fresh.asked = ("hf-lora", "sft-lora")
    checks = {c.name: c for c in acceptance.checks(independent, matrix, fresh, None, on_gpu=False)}
    assert checks["sft-lora: its own launch"].result == "FAIL"
    assert checks["hf-lora: loss curve, shared vs own launch"].result == "pass"
    # a training phase its step clock does not bear out (instants from another clock)
    outcome_path = _run(folders, "matrix", "hf-full") / "outcome.json"
    outcome = json.loads(outcome_path.read_text())
    outcome["phases"]["training_s"] += 1.0
    outcome_path.write_text(json.dumps(outcome))
    check = _checks(folders)["hf-full: training phase vs its step times"]
    assert check.result == "FAIL", check


def test_the_energy_check_holds_the_counter_to_the_power_samples() -> None:
    row = {"experiment_id": "e1", "scenario": "hf-full", "status": "ok", "energy_j": 2000.0}

    def check(energies: list[tuple[float | None, float | None]], **more: Any) -> Any:
        runs = acceptance.Runs(rows=[{**row, **more}], energies={"e1": energies})
        return acceptance._energy_check(runs, "hf-full")

    # two GPUs: 1000 + 1050 J by the counter, 1020 + 1040 by the power samples
    ok = check([(1000.0, 1020.0), (1050.0, 1040.0)])
    assert ok.result == "pass" and ok.measured.startswith("2,050 J vs 2,060 J (0.995x, 2 GPU(s))")
    assert check([(1000.0, 1250.0)]).result == "FAIL"  # 20% apart
    # a figure missing is a failure, never n/a
    missing = check([(1000.0, None)])
    assert missing.result == "FAIL" and "without both" in missing.measured
    assert check([]).result == "FAIL"
    assert check([(1000.0, 1000.0)], energy_j=None).result == "FAIL"
    assert acceptance._energy_check(acceptance.Runs(), "hf-full").result == "FAIL"


def test_the_plugin_cell_passes_running_its_plugin_or_refused_and_fails_as_a_baseline() -> None:
    plugin = acceptance.FOAK_PLUGIN

    def result(rows: list[dict[str, Any]], code: int, line: str = "") -> str:
        runs = acceptance.Runs(rows=rows, returncode=code)
        (check, *_) = acceptance._plugin_checks(runs, line)
        return check.result

    row = {"scenario": "foak-lora", "status": "ok", "tokens_per_second_per_device": "100"}
    refusal = "tunematrix: error: CONTENTS.yaml: fms-acceleration configuration ... asks for"
    assert result([], 2, refusal) == "pass"  # refused before launch, nothing launched
    # refused for another reason (a model that is nowhere): not the plugin's verdict
    assert result([], 2, "tunematrix: error: model 'nowhere' is neither ...") == "FAIL"
    assert result([], 1) == "FAIL"  # no row and no refusal: a crash, not a verdict
    assert result([{**row, "acceleration_plugins": plugin}], 0) == "pass"
    # ok without its plugin: the plain baseline under the plugin's name
    assert result([{**row, "acceleration_plugins": ""}], 0) == "FAIL"
    failed = {**row, "status": "failed", "error": "its plugins run CUDA kernels"}
    assert result([failed], 1) == "FAIL"
