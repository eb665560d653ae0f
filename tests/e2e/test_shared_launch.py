"""Several runs in one launch of the child: the same figures as each run launched alone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_child import child_argv, child_env, run_in_own_group

pytestmark = [pytest.mark.e2e, pytest.mark.long]

TINY = {"model_name_or_path": "tiny-llama", "max_seq_len": 64, "max_steps": 4, "logging_steps": 1}


def _spec(folder: Path, **arguments: object) -> Path:
    folder.mkdir(parents=True)
    path = folder / "spec.json"
    path.write_text(json.dumps({"arguments": {**TINY, **arguments}, "device": "cpu"}))
    return path


def _launch(cwd: Path, specs: list[Path], *, processes: int):
    argv = child_argv(specs, processes=processes)
    return run_in_own_group(argv, env=child_env(), cwd=cwd, timeout=600)


def _result(spec: Path) -> dict | None:
    path = spec.parent / "result.json"
    return json.loads(path.read_text()) if path.exists() else None


def test_a_run_after_another_in_one_launch_trains_as_it_would_alone(tmp_path) -> None:
    """Two ranks (gloo DDP): a LoRA run, then a full one, in one launch; the full
    one also alone. Same seed, so the same losses, steps and tokens."""
    first = _spec(tmp_path / "shared" / "lora", peft_method="lora", per_device_train_batch_size=2)
    second = _spec(tmp_path / "shared" / "full", per_device_train_batch_size=4)
    alone = _spec(tmp_path / "alone" / "full", per_device_train_batch_size=4)
    fresh = _launch(tmp_path, [alone], processes=2)
    assert fresh.returncode == 0, fresh.stderr[-2000:]
    shared = _launch(tmp_path, [first, second], processes=2)
    assert shared.returncode == 0, shared.stderr[-2000:]
    lora, full, full_alone = _result(first), _result(second), _result(alone)
    assert lora and full and full_alone
    assert lora["status"] == full["status"] == full_alone["status"] == "ok"
    assert lora["peft_method"] == "lora" and full["peft_method"] is None
    # nothing of the first run leaks into the second: its own model, optimizer, data
    assert len(full_alone["loss_history"]) == 4  # a loss every step
    assert full["loss_history"] == full_alone["loss_history"]
    assert full["metrics"]["steps"] == full_alone["metrics"]["steps"] == 4
    assert [_counts(r) for r in full["ranks"]] == [_counts(r) for r in full_alone["ranks"]]
    assert full["flops"] == full_alone["flops"]
    # the imports are the first run's: the second's clock starts with it
    assert lora["timings"]["import_s"] > 0 and full_alone["timings"]["import_s"] > 0
    assert full["timings"].get("import_s") is None
    assert full["timings"].get("interpreter_start_s") is None
    assert full["timings"]["run_start_unix"] >= lora["timings"]["train_end_unix"]
    assert full["timings"]["time_to_first_step_s"] == pytest.approx(
        full["timings"]["first_step_unix"] - full["timings"]["run_start_unix"]
    )


def _counts(rank: dict) -> dict:
    """A rank record's counts (rows, tokens, sequence lengths): no times, memory, page
    faults (how the process's heap behaved, not the work) or pid."""
    return {
        k: v
        for k, v in rank.items()
        if k not in ("pid", "step_page_faults") and not k.endswith(("_s", "_unix", "_bytes"))
    }


def test_a_run_that_fails_ends_the_launch_and_leaves_the_rest_unrun(tmp_path) -> None:
    ok = _spec(tmp_path / "a", per_device_train_batch_size=2)
    bad = _spec(tmp_path / "b", dataset=str(tmp_path / "missing.jsonl"))
    after = _spec(tmp_path / "c", per_device_train_batch_size=2)
    proc = _launch(tmp_path, [ok, bad, after], processes=0)
    assert proc.returncode == 1
    first, failed = _result(ok), _result(bad)
    assert first and first["status"] == "ok"
    assert failed and failed["status"] == "failed"
    assert failed["error"] == f"dataset file not found: {tmp_path / 'missing.jsonl'}"
    assert _result(after) is None  # to be launched afresh by the parent
    assert "trainer_entry: error: dataset file not found" in proc.stderr
