"""The real training child on ``seq2seq-lm``: the tiny BART under gloo DDP, with LoRA.

A user's JSONL of source/target pairs of clearly different lengths, every pair
fed exactly once with no step left out of the window, so the row's counts are
checked against the pairs tokenized here, and its FLOPs against PyTorch's FLOP
counter run here on every pair (eager attention, one pair at a time).
"""

from __future__ import annotations

import json

import pytest
import torch
from countedcheck import counted_step, real
from test_child import run_child

from trainer_entry.models.tiny_bart import ensure_tiny_bart
from trainer_entry.tasks.seq2seq_lm import Seq2SeqLMTask

pytestmark = [pytest.mark.e2e, pytest.mark.long]

PAIRS = 48


def _write_pairs(path) -> list[dict]:
    records = [
        {
            "question": "Translate: " + " ".join(f"w{i}" for i in range(1 + i % 11)),
            "answer": " ".join(["ok"] * (1 + (7 * i) % 13)),
        }
        for i in range(PAIRS)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return records


def _reference_flops(pairs: list[tuple[int, int]], lora_modules: list[str]) -> float:
    """FLOPs of one training step per pair, summed: the tiny BART with the run's LoRA."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForSeq2SeqLM

    model = AutoModelForSeq2SeqLM.from_pretrained(ensure_tiny_bart(), attn_implementation="eager")
    model = get_peft_model(
        model, LoraConfig(r=4, target_modules=lora_modules, task_type="SEQ_2_SEQ_LM")
    ).train()
    task = Seq2SeqLMTask()
    total = 0
    for source, target in pairs:
        total += counted_step(
            model, real(task.probe_batch(None, {"source": source, "target": target}))
        )
    return float(total)


def test_every_pair_once_under_ddp_gives_the_counts_and_the_flops(tmp_path) -> None:
    from transformers import AutoTokenizer

    records = _write_pairs(tmp_path / "pairs.jsonl")
    processes, pd = 2, 4
    steps = PAIRS // (processes * pd)
    arguments = {
        "task": "seq2seq-lm",
        "model_name_or_path": "tiny-bart",
        "dataset": str(tmp_path / "pairs.jsonl"),
        "source_field": "question",
        "target_field": "answer",
        "max_seq_len": 64,
        "per_device_train_batch_size": pd,
        "gradient_accumulation_steps": 1,
        "max_steps": steps,
        "logging_steps": 1,
        "learning_rate": 1e-3,
        "warmup_steps_excluded": 0,
        "peft_method": "lora",
        "r": 4,
        "target_modules": ["q_proj", "v_proj"],
    }
    proc, result = run_child(tmp_path, arguments, processes=processes)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert result["status"] == "ok", result.get("error")
    assert (result["task"], result["trainer"], result["sample_unit"]) == (
        "seq2seq-lm",
        "hf",
        "pairs",
    )
    assert result["model"]["architecture"] == "BartForConditionalGeneration"
    tokenizer = AutoTokenizer.from_pretrained(ensure_tiny_bart())
    pairs = [
        (len(tokenizer(r["question"])["input_ids"]), len(tokenizer(r["answer"])["input_ids"]))
        for r in records
    ]
    m = result["metrics"]
    source, target = sum(s for s, _ in pairs), sum(t for _, t in pairs)
    # every pair fed once, every step measured: the counts are the pairs tokenized here
    assert m["tokens_total"] == m["tokens_measured"] == source + target
    assert m["padded_tokens_total"] > m["tokens_total"]
    assert m["samples_measured"] == PAIRS
    time = m["measured_time_s"]
    assert m["source_tokens_per_second_global"] == pytest.approx(source / time)
    assert m["target_tokens_per_second_global"] == pytest.approx(target / time)
    assert m["tokens_per_second_global"] == pytest.approx((source + target) / time)
    assert result["data"]["counts"] == {"source_tokens": source, "target_tokens": target}
    # FLOPs: the counted figure against the counter, pair by pair
    flops = result["flops"]
    assert flops["method"] == "counted"
    reference = _reference_flops(pairs, ["q_proj", "v_proj"])
    assert m["flops_per_token"] == pytest.approx(reference / (source + target), rel=0.10)
    assert m["flops_per_sample"] == pytest.approx(reference / PAIRS, rel=0.10)
    assert {"model.encoder", "model.decoder", "lm_head"} <= set(flops["components"])
    # the loss is a number and the memory was measured
    assert all(torch.isfinite(torch.tensor(v)) for _, v in result["loss_history"])
    assert m["mem_peak_rss_bytes"] > 0
