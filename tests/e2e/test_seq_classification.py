"""The real training child on the ``seq-classification`` task: the tiny encoder on the shipped reviews.

One process with full fine-tuning and two (gloo DDP on the CPU) with LoRA on
the encoder's query and value, each feeding every record exactly once, so the
real tokens are an independent count of the tokenized review set; and
``config:bert-base-uncased`` (random weights, full size) for two short steps.
"""

from __future__ import annotations

import json
import math

import pytest
from test_child import run_child

from trainer_entry.models.tiny_bert import REVIEWS, ensure_tiny_bert

pytestmark = [pytest.mark.e2e, pytest.mark.long]

MAX_SEQ_LEN = 96


def _texts() -> list[str]:
    return [json.loads(line)["text"] for line in REVIEWS.read_text().splitlines()]


def _real_tokens(max_seq_len: int) -> int:
    """The review set's tokens as the tiny encoder's tokenizer cuts them, counted here."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(ensure_tiny_bert())
    return sum(min(len(tokenizer(t)["input_ids"]), max_seq_len) for t in _texts())


@pytest.mark.parametrize(
    ("processes", "peft"), [(1, None), (2, "lora")], ids=["1proc-full", "2proc-lora"]
)
def test_every_review_once_gives_the_exact_counts(tmp_path, processes, peft) -> None:
    n = len(_texts())
    pd, ga = 20, 3 - processes  # 40 reviews per step either way
    steps = n // (processes * pd * ga)
    assert steps * processes * pd * ga == n
    arguments = {
        "task": "seq-classification",
        "model_name_or_path": "tiny-bert",
        "max_seq_len": MAX_SEQ_LEN,
        "per_device_train_batch_size": pd,
        "gradient_accumulation_steps": ga,
        "max_steps": steps,
        "logging_steps": 1,
        "learning_rate": 1e-3,
        "warmup_steps_excluded": 1,
    }
    if peft:
        arguments.update(peft_method="lora", r=4, target_modules=["query", "value"])
    proc, result = run_child(tmp_path, arguments, processes=processes)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert result["status"] == "ok" and result["error"] is None
    assert (result["task"], result["trainer"], result["sample_unit"]) == (
        "seq-classification",
        "hf",
        "sequences",
    )
    assert result["model"]["architecture"] == "BertForSequenceClassification"
    assert (result["model"]["trainable_params"] < result["model"]["total_params"]) == (
        peft is not None
    )
    m = result["metrics"]
    # every review fed once: the real tokens are the tokenized set, counted independently
    assert m["tokens_total"] == _real_tokens(MAX_SEQ_LEN)
    assert m["padded_tokens_total"] > m["tokens_total"]  # reviews differ in length
    assert sum(sum(r["step_rows"]) for r in result["ranks"]) == n
    data = result["data"]
    assert data["examples"] == data["sequences"] == data["label_tokens"] == n
    assert data["tokens"] == m["tokens_total"] and data["examples_truncated"] > 0
    # samples/s and tokens/s over the same measured steps
    measured_rows = sum(sum(r["step_rows"][1:]) for r in result["ranks"])
    assert m["samples_measured"] == measured_rows
    assert m["samples_per_second_global"] > 0 and m["tokens_per_second_global"] > 0
    assert m["samples_per_second_global"] / m["tokens_per_second_global"] == pytest.approx(
        measured_rows / m["tokens_measured"]
    )
    assert m["flops_per_token"] > 0 and m["mfu"] is None  # no peak for a CPU
    assert m["mem_peak_rss_bytes"] > 0
    assert len(result["loss_history"]) == steps
    # a new head's logits are near zero: the loss starts at ln 3 for three classes, not a
    # multiple of it (accumulation steps and processes must not scale a per-sample mean)
    assert m["loss_first"] == pytest.approx(math.log(3), abs=0.1)
    assert result["world_size"] == processes and result["peft_method"] == peft


def test_bert_base_architecture_trains_two_short_steps(tmp_path) -> None:
    arguments = {
        "task": "seq-classification",
        "model_name_or_path": "config:bert-base-uncased",
        "max_seq_len": 16,
        "per_device_train_batch_size": 2,
        "max_steps": 2,
        "logging_steps": 1,
        "warmup_steps_excluded": 1,
    }
    # the child bare (python -m trainer_entry): accelerate's start-up is covered above
    proc, result = run_child(tmp_path, arguments)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert result["status"] == "ok"
    assert result["model"]["kind"] == "config"
    assert 100e6 < result["model"]["total_params"] < 120e6
    m = result["metrics"]
    assert m["tokens_total"] <= 2 * 2 * 16 and m["samples_measured"] == 2
    # the encoder layers' 84.9M weights trained in full (6 FLOPs each), a little attention and head
    assert 6 * 84.9e6 < m["flops_per_token"] < 6 * 90e6
    assert m["loss_first"] is not None
