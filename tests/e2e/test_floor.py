"""The tiny CPU matrix at the lowest versions pyproject.toml allows (``tox -e floor``).

The floor env installs exactly pyproject's lower bounds of torch, transformers, trl,
peft, accelerate and datasets; this test checks that they are what runs, and runs the
tiny model end to end through ``run_benchmarks.sh`` as a user would: both trainers,
full fine-tuning and LoRA, one and two processes, with activation checkpointing (the
shipped defaults.yaml's) and eval on. On transformers 5.17 activation checkpointing
goes under its old name, ``gradient_checkpointing``, decided from TrainingArguments'
fields; the rows spell it one way and say it was on because the model said so.

Only the floor env selects it (``-m floor``): elsewhere the versions are newer.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest
from floors import FLOORED, floors, release

pytestmark = [pytest.mark.e2e, pytest.mark.floor]

REPO = Path(__file__).resolve().parents[2]

SCENARIOS = f"""\
frameworks:
  ddp: {{accelerate_config: {REPO / "accelerate-ddp.yaml"}}}
matrix:
  effective_batch_size: [4]
  max_seq_len: [128]
  packing: [true]
scenarios:
  - name: floor
    device: cpu
    framework_config: [ddp]
    num_gpus: [1, 2]
    arguments:
      model_name_or_path: tiny-llama
      torch_dtype: float32
      learning_rate: 1e-3
      max_steps: 6
      eval: true
      r: 8
      lora_alpha: 16
      target_modules: [q_proj, k_proj, v_proj, o_proj]
    sweep:
      trainer: [sft, hf]
      peft_method: [none, lora]
"""


def test_the_floors_are_what_is_installed() -> None:
    wanted = floors()
    assert sorted(wanted) == sorted(FLOORED)
    installed = {name: version(name) for name in FLOORED}
    assert {n: release(v) for n, v in installed.items()} == {
        n: release(v) for n, v in wanted.items()
    }, installed


def _run_matrix(
    tmp_path: Path, scenarios: str, *, timeout: int, **env: str
) -> tuple[subprocess.CompletedProcess[str], list[dict[str, str]]]:
    """``scenarios`` run through ``run_benchmarks.sh`` on 1 and 2 processes, as a user runs
    it (``env``: its settings): the finished process (exit 0) and raw_summary.csv's rows."""
    (tmp_path / "scenarios.yaml").write_text(scenarios)
    done = subprocess.run(
        ["bash", str(REPO / "run_benchmarks.sh"), "1 2", "results", "scenarios.yaml"],
        cwd=tmp_path,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHON": sys.executable, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    with (tmp_path / "results" / "raw_summary.csv").open() as f:
        return done, list(csv.DictReader(f))


def test_the_tiny_matrix_runs_end_to_end_at_the_floors(tmp_path: Path) -> None:
    done, rows = _run_matrix(tmp_path, SCENARIOS, timeout=1200)
    # the check before launch ran, against the floors
    assert "checked 8 cell(s) against" in done.stdout
    assert len(rows) == 8
    cells = {(r["trainer"], r["peft_method"] or "none", r["num_gpus"]) for r in rows}
    assert cells == {(t, p, n) for t in ("sft", "hf") for p in ("none", "lora") for n in ("1", "2")}
    assert {r["status"] for r in rows} == {"ok"}, [(r["experiment_id"], r["error"]) for r in rows]
    # one spelling in the rows, whatever the installed transformers calls it
    assert "gradient_checkpointing" not in rows[0]
    # what shapes memory, read from each run's trained objects: every setting filled, and
    # the loss told apart by trainer (TRL's fused head never builds the full logits)
    from orchestrator.contract.columns import MEMORY_SHAPE

    for row in rows:
        assert all(row[column] for column in MEMORY_SHAPE), {c: row[c] for c in MEMORY_SHAPE}
    assert {(r["trainer"], r["loss_implementation"]) for r in rows} == {
        ("hf", "transformers ForCausalLMLoss (full fp32 logits)"),
        ("sft", "trl fused LM head (chunked nll)"),
    }
    summary = (tmp_path / "results" / "summary.md").read_text()
    assert "## What shapes memory" in summary and "| loss implementation |" in summary
    for row in rows:
        assert row["activation_checkpointing"] == "True"
        assert float(row["eval_loss"]) > 0 and float(row["tokens_per_second_global"]) > 0
        result = json.loads(
            (tmp_path / "results" / "runs" / row["experiment_id"] / "result.json").read_text()
        )
        assert result["activation_checkpointing"] is True
        assert {k: result["versions"][k] for k in ("transformers", "trl", "peft")} == {
            k: version(k) for k in ("transformers", "trl", "peft")
        }
        # the model said it recomputed (no note that it did not), and where the installed
        # TrainingArguments has only the old name, the row says the setting went under it
        notes = " ".join(result["notes"])
        assert "did not recompute" not in notes
        from transformers import TrainingArguments

        from trainer_entry.settings.installed import init_fields

        if "activation_checkpointing" not in init_fields(TrainingArguments):
            assert "activation_checkpointing is passed as gradient_checkpointing" in notes


def _family(
    name: str,
    task: str,
    models: str,
    target_modules: str,
    processes: str,
    extra: str = "",
    length: int = 64,
) -> str:
    return f"""\
  - name: {name}
    device: cpu
    framework_config: [ddp]
    num_gpus: {processes}
    arguments:
      task: {task}
      model_name_or_path: {models}
      torch_dtype: float32
      learning_rate: 1e-3
      max_steps: 6
      max_seq_len: {length}
      eval: true
      target_modules: {target_modules}{extra}
    sweep:
      peft_method: [none, lora]
"""


FAMILIES = (
    f"frameworks:\n  ddp: {{accelerate_config: {REPO / 'accelerate-ddp.yaml'}}}\n"
    "matrix:\n  effective_batch_size: [4]\nscenarios:\n"
    + _family("seq2seq", "seq2seq-lm", "tiny-t5", "[q, v]", "[1, 2]")
    + _family("masked", "masked-lm", "tiny-bert", "[query, value]", "[1]")
    + _family(
        "speech",
        "speech-recognition",
        "[tiny-whisper, tiny-wav2vec2]",
        "[q_proj, v_proj]",
        "[1]",
        "\n      dataset_kwargs: {num_clips: 48}",
    )
    # its default trainer, TRL's, with its vision collator; 64 image positions a picture
    + _family(
        "vision",
        "vision-language",
        "tiny-vlm",
        "[q_proj, v_proj]",
        "[1]",
        "\n      dataset_kwargs: {num_images: 48, size: 32}",
        length=160,
    )
)
#: what each family's rows must have beside tokens/s
FAMILY_COUNTS = {
    "seq2seq-lm": ("source_tokens_per_second_global", "target_tokens_per_second_global"),
    "masked-lm": (),
    "speech-recognition": ("audio_seconds_per_second_global",),
    "vision-language": ("image_tokens_per_second_global", "text_tokens_per_second_global"),
}


@pytest.mark.timeout(1800)  # twelve cells: longer than a test's default
def test_the_task_families_run_end_to_end_at_the_floors(tmp_path: Path) -> None:
    """seq2seq-lm (1 and 2 processes), masked-lm, speech-recognition (Whisper and CTC) and
    vision-language (TRL's trainer), full and LoRA, with eval on, through
    run_benchmarks.sh: every cell ok with its counts, counted FLOPs and an eval loss.

    In shared launches (``LAUNCH=family``: a model's full and LoRA cells one after the
    other in one process, 6 launches for 12 cells), so the floors run that path too; the
    tiny matrix above keeps a launch per cell."""
    _, rows = _run_matrix(tmp_path, FAMILIES, timeout=1800, LAUNCH="family")
    assert len(rows) == 12
    assert len({r["launch_id"] for r in rows}) == 6 and {r["run_mode"] for r in rows} == {"shared"}
    assert {r["status"] for r in rows} == {"ok"}, [(r["experiment_id"], r["error"]) for r in rows]
    for row in rows:
        for column in ("tokens_per_second_global", "flops_per_token", "flops_per_sample"):
            assert float(row[column]) > 0, (row["experiment_id"], column)
        for column in FAMILY_COUNTS[row["task"]]:
            assert float(row[column]) > 0, (row["experiment_id"], column)
        assert float(row["eval_loss"]) > 0, row["experiment_id"]
