"""The real training child on the tiny model, one process and two (gloo DDP on the CPU)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from orchestrator.contract import columns as registry
from orchestrator.contract.result import ChildResult
from orchestrator.job.execute import free_port

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
ACCELERATE = [sys.executable, "-m", "accelerate.commands.launch"]


def child_env() -> dict[str, str]:
    return {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": str(REPO),
        "CUDA_VISIBLE_DEVICES": "",
    }


def run_in_own_group(
    argv: list[str], *, env: dict[str, str], cwd: Path, timeout: float
) -> subprocess.CompletedProcess[str]:
    """Run argv in its own process group; on a timeout, kill the whole group, so
    no rank outlives a hung test."""
    with subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=cwd,
        start_new_session=True,
    ) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def child_argv(specs: list[Path], *, processes: int) -> list[str]:
    """The child's command on ``specs`` (one launch); ``processes`` 0 runs it bare, else
    under accelerate launch (1: ``--cpu``; more: gloo DDP) on a port free now (tests
    run side by side: no fixed port)."""
    flags = [arg for spec in specs for arg in ("--spec", str(spec))]
    if processes == 0:
        return [sys.executable, "-m", "trainer_entry", *flags]
    flag = "--cpu" if processes == 1 else "--multi_gpu"
    return [
        *ACCELERATE,
        "--num_processes",
        str(processes),
        "--num_machines",
        "1",
        "--main_process_port",
        str(free_port()),
        flag,
        "-m",
        "trainer_entry",
        *flags,
    ]


def run_child(
    tmp: Path, arguments: dict, *, processes: int = 0, **spec: object
) -> tuple[subprocess.CompletedProcess[str], dict]:
    """Run the child on a spec; ``processes`` 0 runs it bare, else under accelerate launch."""
    spec_path = tmp / "spec.json"
    spec_path.write_text(json.dumps({"arguments": arguments, "device": "cpu", **spec}))
    argv = child_argv([spec_path], processes=processes)
    proc = run_in_own_group(argv, env=child_env(), cwd=tmp, timeout=300)
    result_path = tmp / "result.json"
    result = json.loads(result_path.read_text()) if result_path.exists() else {}
    if result:
        # every key the child wrote is a declared field of the typed record, and a
        # record read back writes the same keys and values
        assert ChildResult.model_validate(result).record() == result
    return proc, result


def write_records(path: Path, n: int) -> Path:
    """n instruction records of clearly different lengths (so padding happens)."""
    with path.open("w") as f:
        for i in range(n):
            f.write(
                json.dumps(
                    {
                        "instruction": f"Repeat the word {i}.",
                        "input": "",
                        "output": " ".join(["word"] * (1 + 3 * i)),
                    }
                )
                + "\n"
            )
    return path


def prepared_lengths(result: dict) -> list[int]:
    with np.load(Path(result["data"]["cache_path"]) / "tokens.npz") as npz:
        return npz["lengths"].tolist()


@pytest.mark.parametrize(
    ("processes", "peft"),
    [(0, None), (1, "lora"), (2, None), (2, "lora")],
    ids=["1proc-full-bare", "1proc-lora-accelerate", "2proc-full", "2proc-lora"],
)
def test_every_record_once_gives_the_exact_token_count(tmp_path, processes, peft) -> None:
    world = max(1, processes)
    n, pd, ga = 24, 2, 2
    steps = n // (world * pd * ga)
    arguments = {
        "model_name_or_path": "tiny-llama",
        "trainer": "hf",  # the sft backend's count: tests/e2e/test_sft.py
        "dataset": str(write_records(tmp_path / "d.jsonl", n)),
        "max_seq_len": 256,
        "packing": False,
        "per_device_train_batch_size": pd,
        "gradient_accumulation_steps": ga,
        "max_steps": steps,
        "logging_steps": 1,
        "learning_rate": 1e-3,
        "warmup_steps_excluded": 1,
    }
    if peft:
        arguments.update(
            peft_method="lora",
            r=4,
            target_modules=["q_proj", "v_proj"],
            activation_checkpointing=True,
        )
    proc, result = run_child(tmp_path, arguments, processes=processes)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert result["status"] == "ok" and result["error"] is None
    m = result["metrics"]
    # every figure the child reports is declared (else the tables would leave it out),
    # and every figure declared as the child's is reported
    assert registry.undeclared_metrics(m) == []
    assert {c.name for c in registry.child_metrics()} <= set(m)

    # Each record is fed exactly once over the run, whatever the order and the
    # split across ranks: the real tokens are the prepared sequences' lengths.
    assert m["tokens_total"] == sum(prepared_lengths(result))
    assert m["padded_tokens_total"] > m["tokens_total"]  # lengths differ, so batches pad
    assert m["steps"] == steps and m["steps_measured"] == steps - 1
    assert result["world_size"] == world and len(result["ranks"]) == world
    assert sorted(r["rank"] for r in result["ranks"]) == list(range(world))
    for rank in result["ranks"]:
        assert len(rank["step_times_s"]) == steps
        assert all(t > 0 for t in rank["step_times_s"])
        assert rank["peak_rss_bytes"] > 50 * 2**20
    # throughput is the measured steps' tokens over their time
    measured = sum(sum(r["step_tokens"][1:]) for r in result["ranks"])
    window = max(sum(r["step_times_s"][1:]) for r in result["ranks"])
    assert m["tokens_measured"] == measured
    assert m["tokens_per_second_global"] == pytest.approx(measured / window)
    assert m["tokens_per_second_per_device"] == pytest.approx(measured / window / world)
    assert result["effective_batch_size"] == pd * ga * world
    assert result["peft_method"] == peft
    assert (result["model"]["trainable_params"] < result["model"]["total_params"]) == (
        peft is not None
    )
    assert m["flops_per_token"] > 0 and m["mfu"] is None  # no peak for a CPU
    assert m["loss_first"] is not None and len(result["loss_history"]) == steps
    for key in ("import_s", "model_load_s", "data_prep_s", "first_step_s", "time_to_first_step_s"):
        assert result["timings"][key] > 0, key
    # the step counter rank 0 kept for the parent, beside the spec; no temporary file left
    progress = json.loads((tmp_path / "progress.json").read_text())
    assert (progress["step"], progress["max_steps"], progress["phase"]) == (steps, steps, "done")
    assert progress["world_size"] == world and progress["tokens_per_second_rank0"] > 0
    assert not list(tmp_path.glob(".progress.json*"))


def test_packed_run_counts_full_blocks_and_reuses_the_prepared_data(tmp_path) -> None:
    arguments = {
        "model_name_or_path": "tiny-llama",
        "trainer": "hf",  # our packing: fixed blocks of max_seq_len
        "max_seq_len": 64,
        "packing": True,
        "per_device_train_batch_size": 3,
        "max_steps": 6,
        "logging_steps": 1,
    }
    proc, first = run_child(tmp_path, arguments)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert first["metrics"]["tokens_total"] == 6 * 3 * 64
    assert first["metrics"]["padding_fraction"] == 0.0
    assert first["metrics"]["steps_measured"] == 6 - 3
    assert first["data"]["cache_hit"] is False
    made = _files_written(Path(first["data"]["cache_path"]))
    (tmp_path / "result.json").unlink()
    proc, second = run_child(tmp_path, arguments)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert second["data"]["cache_hit"] is True
    assert second["data"]["cache_key"] == first["data"]["cache_key"]
    # read, not made again: the same folder, none of its files written since
    assert second["data"]["cache_path"] == first["data"]["cache_path"]
    assert made and _files_written(Path(second["data"]["cache_path"])) == made


def _files_written(folder: Path) -> dict[str, int]:
    """Each file under ``folder``, with when it was last written (ns)."""
    return {str(p): p.stat().st_mtime_ns for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (
            {"model_name_or_path": "no-such-org/no-such-model"},
            "model 'no-such-org/no-such-model' is neither a local folder nor in the hub cache, and the hub is offline",
        ),
        ({"dataset": "/no/such/data.jsonl"}, "dataset file not found: /no/such/data.jsonl"),
        (
            {"dataset": "FIELDS"},
            "dataset field 'instruction' not found in record 0; its fields: prompt, reply",
        ),
        (
            {"peft_method": "lora", "target_modules": ["nope_proj"]},
            "target_modules ['nope_proj'] match no module of the model; its linear layers: down_proj, gate_proj, k_proj, lm_head, o_proj, q_proj, up_proj, v_proj",
        ),
        ({"max_seq_len": 0}, "max_seq_len must be a positive integer, got 0"),
        (
            {"peft_method": "qlora"},
            "peft_method qlora needs a CUDA GPU (4-bit bitsandbytes); this run is on the CPU",
        ),
    ],
    ids=[
        "unknown-model",
        "missing-dataset",
        "missing-field",
        "no-target-module",
        "max-seq-len-0",
        "qlora-on-cpu",
    ],
)
def test_bad_input_is_one_line_in_the_result_and_stderr(tmp_path, arguments, message) -> None:
    if arguments.get("dataset") == "FIELDS":
        path = tmp_path / "other.jsonl"
        path.write_text(json.dumps({"prompt": "a", "reply": "b"}) + "\n")
        arguments = {**arguments, "dataset": str(path)}
    proc, result = run_child(
        tmp_path, {"model_name_or_path": "tiny-llama", "max_steps": 2, **arguments}
    )
    assert proc.returncode == 1
    last = proc.stderr.rstrip("\n").splitlines()[-1]
    assert last.startswith(f"trainer_entry: error: {message}")
    assert "Traceback" not in proc.stderr
    assert result["status"] == "failed"
    assert result["error"] == last.removeprefix("trainer_entry: error: ")
    assert "\n" not in result["error"]


def test_failure_under_two_processes_is_reported_once(tmp_path) -> None:
    proc, result = run_child(
        tmp_path,
        {
            "model_name_or_path": "tiny-llama",
            "max_steps": 2,
            "peft_method": "lora",
            "target_modules": ["nope_proj"],
        },
        processes=2,
    )
    assert proc.returncode != 0
    assert result["status"] == "failed"
    assert result["error"].startswith("target_modules ['nope_proj'] match no module")
    assert result["world_size"] == 2


def test_help_and_a_bad_spec(tmp_path) -> None:
    env = child_env()
    help_text = subprocess.run(
        [sys.executable, "-m", "trainer_entry", "--help"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    ).stdout
    assert "--spec" in help_text and "Examples:" in help_text
    bad = tmp_path / "spec.json"
    bad.write_text('{"arguments": [1]}')
    proc = subprocess.run(
        [sys.executable, "-m", "trainer_entry", "--spec", str(bad)],
        capture_output=True,
        text=True,
        env=env,
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith("trainer_entry: error: ") and proc.stderr.count("\n") == 1
    assert "arguments: Input should be a valid dictionary" in proc.stderr
