"""The real training child on ``masked-lm``: the tiny BERT, full fine-tuning, one process.

Every review of the shipped set is fed once with no step left out, so the
row's tokens are checked against the reviews tokenized here, and its FLOPs
against PyTorch's FLOP counter run here on every review (eager attention).
"""

from __future__ import annotations

import json
import math
from collections import Counter

import pytest
from countedcheck import counted_step, real
from test_child import run_child

from trainer_entry.models.tiny_bert import REVIEWS, ensure_tiny_bert
from trainer_entry.tasks.masked_lm import MaskedLMTask

pytestmark = [pytest.mark.e2e, pytest.mark.long]

MAX_SEQ_LEN = 64


def test_every_review_once_gives_the_counts_and_the_flops(tmp_path) -> None:
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    texts = [json.loads(line)["text"] for line in REVIEWS.read_text().splitlines()]
    n, pd = len(texts), 40
    assert n % pd == 0
    arguments = {
        "task": "masked-lm",
        "model_name_or_path": "tiny-bert",
        "max_seq_len": MAX_SEQ_LEN,
        "per_device_train_batch_size": pd,
        "max_steps": n // pd,
        "logging_steps": 1,
        "learning_rate": 1e-3,
        "warmup_steps_excluded": 0,
    }
    proc, result = run_child(tmp_path, arguments, processes=1)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert result["status"] == "ok", result.get("error")
    assert (result["task"], result["sample_unit"]) == ("masked-lm", "texts")
    assert result["model"]["architecture"] == "BertForMaskedLM"
    tokenizer = AutoTokenizer.from_pretrained(ensure_tiny_bert())
    lengths = [min(len(tokenizer(t)["input_ids"]), MAX_SEQ_LEN) for t in texts]
    m = result["metrics"]
    assert m["tokens_total"] == m["tokens_measured"] == sum(lengths)
    assert m["samples_measured"] == n
    # about 15% of each text's words are masked: the loss's tokens
    assert 0.10 * sum(lengths) < result["data"]["label_tokens"] < 0.20 * sum(lengths)
    model = AutoModelForMaskedLM.from_pretrained(ensure_tiny_bert(), attn_implementation="eager")
    model.train()
    task, reference = MaskedLMTask(), 0
    # a step's FLOPs depend on the length alone: counted once per length, times its texts
    for length, texts in Counter(lengths).items():
        reference += texts * counted_step(model, real(task.probe_batch(None, {"tokens": length})))
    assert m["flops_per_token"] == pytest.approx(reference / sum(lengths), rel=0.10)
    assert result["flops"]["method"] == "counted"
    assert all(math.isfinite(v) for _, v in result["loss_history"])
