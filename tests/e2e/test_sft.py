"""The ``sft`` backend (TRL's SFTTrainer) in the real child: every token it fed is counted."""

from __future__ import annotations

import pytest
from test_child import prepared_lengths, run_child, write_records

pytestmark = [pytest.mark.e2e, pytest.mark.long]
pytest.importorskip("trl")


def check_sft_result(proc, result: dict) -> dict:
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert result["status"] == "ok" and result["trainer"] == "sft"
    assert result["versions"]["trl"]
    m = result["metrics"]
    assert m["samples_per_second_global"] > 0 and m["tokens_per_second_global"] > 0
    assert m["loss_first"] is not None and m["loss_last"] is not None
    return m


def test_two_processes_unpacked_feed_every_cut_record_once(tmp_path) -> None:
    """TRL cuts to max_length and masks prompts; each record is fed once across two ranks."""
    n, pd, ga, world, cut = 24, 2, 2, 2, 48
    steps = n // (world * pd * ga)
    arguments = {
        "model_name_or_path": "tiny-llama",
        "dataset": str(write_records(tmp_path / "d.jsonl", n)),
        "max_seq_len": cut,
        "completion_only_loss": True,
        "per_device_train_batch_size": pd,
        "gradient_accumulation_steps": ga,
        "max_steps": steps,
        "logging_steps": 1,
        "warmup_steps_excluded": 1,
        "peft_method": "lora",
        "r": 4,
        "target_modules": ["q_proj", "v_proj"],
    }
    proc, result = run_child(tmp_path, arguments, processes=world)
    m = check_sft_result(proc, result)
    whole = prepared_lengths(result)  # the cache holds the sequences whole: TRL cuts them
    assert len(whole) == n and max(whole) > cut
    assert m["tokens_total"] == sum(min(length, cut) for length in whole)
    assert m["padded_tokens_total"] > m["tokens_total"]
    assert m["steps"] == steps and len(result["ranks"]) == world
    assert sum(sum(r["step_rows"]) for r in result["ranks"]) == n
    data = result["data"]
    assert data["examples_truncated"] == sum(length > cut for length in whole)
    assert (data["sequences"], data["examples_dropped"]) == (n, 0)
    assert len(result["loss_history"]) == steps


def test_packed_blocks_train_alike_under_sft_and_hf(tmp_path) -> None:
    """packing: true feeds both trainers the same blocks: the same tokens, FLOPs per token
    and losses; the sft row says what TRL's per-step metrics cost."""
    arguments = {
        "model_name_or_path": "tiny-llama",
        "max_seq_len": 256,
        "packing": True,
        "per_device_train_batch_size": 2,
        "max_steps": 4,
        "logging_steps": 1,
        "warmup_steps_excluded": 1,
    }
    rows = {}
    for trainer in ("sft", "hf"):
        (tmp_path / trainer).mkdir()
        proc, result = run_child(tmp_path / trainer, {**arguments, "trainer": trainer})
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert result["status"] == "ok" and result["trainer"] == trainer
        rows[trainer] = result
    sft, hf = rows["sft"], rows["hf"]
    for key in ("tokens_total", "tokens_measured", "padded_tokens_total", "flops_per_token"):
        assert sft["metrics"][key] == hf["metrics"][key], key
    assert sft["metrics"]["tokens_total"] == 4 * 2 * 256
    assert sft["metrics"]["loss_first"] == pytest.approx(hf["metrics"]["loss_first"], rel=1e-4)
    assert sft["data"]["sequences"] == hf["data"]["sequences"]
    cost = [n for n in sft["notes"] if n.startswith("TRL's per-step entropy and token accuracy")]
    assert len(cost) == 1 and "fused LM head timed after training on 512 positions" in cost[0]
    assert not any(n.startswith("TRL's per-step") for n in hf["notes"])
    # the same blocks, the same speed class, not the same memory: the rows say why
    assert hf["loss_implementation"] == "transformers ForCausalLMLoss (full fp32 logits)"
    assert sft["loss_implementation"] == "trl fused LM head (chunked nll)"
    for row in (sft, hf):
        assert (row["weights_dtype"], row["gradients_dtype"]) == ("float32", "float32")
        assert row["optimizer_states_dtype"] == "float32 (exp_avg, exp_avg_sq)"
        assert "(AdamW" in row["optimizer"]


def test_packed_with_trls_bfd_strategy_feeds_every_document_once(tmp_path) -> None:
    """One epoch over TRL's bfd-packed rows: each record once, cut to max_length; the row
    says its per-document attention ran through masks."""
    n, cut = 24, 100
    arguments = {
        "model_name_or_path": "tiny-llama",
        "dataset": str(write_records(tmp_path / "d.jsonl", n)),
        "max_seq_len": cut,
        "packing": True,
        "packing_strategy": "bfd",
        "per_device_train_batch_size": 2,
        "num_train_epochs": 1,
        "logging_steps": 1,
        "warmup_steps_excluded": 1,
    }
    proc, result = run_child(tmp_path, arguments)
    m = check_sft_result(proc, result)
    whole = prepared_lengths(result)
    assert len(whole) == n and max(whole) > cut
    # bfd keeps each record whole up to max_length, and drops the rest of it
    assert m["tokens_total"] == sum(min(length, cut) for length in whole)
    assert result["data"]["tokens_dropped"] == sum(whole) - m["tokens_total"] > 0
    assert result["packing"] is True and result["data"]["packing"] is True
    # padding-free batches: every document is one sequence of its own, rows hold several
    rows = result["data"]["sequences"]
    assert sum(result["ranks"][0]["step_rows"]) == n > rows
    assert m["padding_fraction"] == 0.0
    assert m["steps"] == -(-rows // 2) and len(result["loss_history"]) == m["steps"]
    assert any("packing_strategy bfd keeps documents apart" in n for n in result["notes"])
