"""The real training child on ``vision-language``: the tiny LLaVA-style model.

``hf`` under gloo DDP with LoRA on a user's JSONL of PNG images of different
sizes and conversations, every conversation fed once with no step left out, so
the row's image and text positions are checked against the processor's own
output over the same conversations, and its FLOPs against PyTorch's FLOP
counter run here conversation by conversation. ``sft`` (TRL's vision collator)
in full with activation checkpointing, one process, on the generated set, with
eval.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from countedcheck import counted_step, real
from test_child import run_child

from trainer_entry.models.tiny_vlm import ensure_tiny_vlm
from trainer_entry.tasks.vision_language import VisionLanguageTask

pytestmark = [pytest.mark.e2e, pytest.mark.long]

CONVERSATIONS = 16


def _write(folder) -> list[dict]:
    """CONVERSATIONS PNG images of different sizes, each with a conversation of its own
    length; the records as written."""
    from PIL import Image

    rng = np.random.default_rng(0)
    records = []
    for i in range(CONVERSATIONS):
        pixels = rng.integers(0, 256, (16 + 3 * i, 40, 3), dtype=np.uint8)
        Image.fromarray(pixels, mode="RGB").save(folder / f"pic{i}.png")
        records.append(
            {
                "image": f"pic{i}.png",
                "messages": [
                    {"role": "user", "content": "What does it show?"},
                    {"role": "assistant", "content": " ".join(["noise"] * (1 + i % 6))},
                ],
            }
        )
    (folder / "vl.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return records


def test_hf_under_ddp_counts_image_and_text_positions(tmp_path) -> None:
    from peft import LoraConfig, get_peft_model
    from PIL import Image
    from transformers import AutoModelForImageTextToText, AutoProcessor

    records = _write(tmp_path)
    processes, pd = 2, 4
    arguments = {
        "task": "vision-language",
        "model_name_or_path": "tiny-vlm",
        "dataset": str(tmp_path / "vl.jsonl"),
        "trainer": "hf",
        "per_device_train_batch_size": pd,
        "max_steps": CONVERSATIONS // (processes * pd),
        "max_seq_len": 256,
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
    assert (result["task"], result["sample_unit"]) == ("vision-language", "conversations")
    assert result["model"]["architecture"] == "LlavaForConditionalGeneration"
    # the processor's own count of each conversation's positions, the image part written
    # here as a user of the processor writes it (not through the task's code)
    processor = AutoProcessor.from_pretrained(ensure_tiny_vlm())
    rows = []
    for i, r in enumerate(records):
        (question, answer) = r["messages"]
        messages = [
            {
                "role": "user",
                "content": [{"type": "image"}, {"type": "text", "text": question["content"]}],
            },
            {"role": "assistant", "content": [{"type": "text", "text": answer["content"]}]},
        ]
        text = processor.apply_chat_template(messages, tokenize=False)
        with Image.open(tmp_path / r["image"]) as image:
            batch = processor(
                images=[image.convert("RGB")],
                text=[text],
                add_special_tokens=False,
                return_tensors="pt",
            )
        total = int(batch["attention_mask"].sum())
        images = int((batch["input_ids"] == processor.image_token_id).sum())
        rows.append({"images": 1, "text": total - images, "image_positions": images, "i": i})
    image_tokens = sum(r["image_positions"] for r in rows)
    text_tokens = sum(r["text"] for r in rows)
    m = result["metrics"]
    assert m["tokens_total"] == m["tokens_measured"] == image_tokens + text_tokens
    assert m["samples_measured"] == CONVERSATIONS
    time = m["measured_time_s"]
    assert m["image_tokens_per_second_global"] == pytest.approx(image_tokens / time)
    assert m["text_tokens_per_second_global"] == pytest.approx(text_tokens / time)
    assert result["data"]["counts"] == {"image_tokens": image_tokens, "text_tokens": text_tokens}
    # FLOPs against the counter, conversation by conversation
    model = AutoModelForImageTextToText.from_pretrained(
        ensure_tiny_vlm(), attn_implementation="eager"
    )
    model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"])).train()
    task, reference = VisionLanguageTask(), 0.0
    token = model.config.image_token_id
    for r in rows:
        probe = task.probe_batch(model.config, {"images": 1, "text": r["text"]})
        reference += counted_step(model, real(probe, {"input_ids": (r["image_positions"], token)}))
    assert m["flops_per_token"] == pytest.approx(reference / (image_tokens + text_tokens), rel=0.10)
    parts = set(result["flops"]["components"])
    assert {"model.vision_tower", "model.multi_modal_projector", "model.language_model"} <= parts
    assert all(math.isfinite(v) for _, v in result["loss_history"])


def test_sft_trains_on_the_generated_set_with_checkpointing_and_eval(tmp_path) -> None:
    arguments = {
        "task": "vision-language",
        "model_name_or_path": "tiny-vlm",
        "trainer": "sft",
        "dataset_kwargs": {"num_images": 24, "size": 32},
        "per_device_train_batch_size": 4,
        "max_steps": 4,
        "max_seq_len": 192,
        "logging_steps": 1,
        "learning_rate": 1e-3,
        "warmup_steps_excluded": 0,
        "activation_checkpointing": True,
        "eval": True,
    }
    proc, result = run_child(tmp_path, arguments, processes=1)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert result["status"] == "ok", result.get("error")
    assert result["trainer"] == "sft"
    m = result["metrics"]
    counts = result["data"]["counts"]
    assert result["data"]["examples_dropped"] == 0
    assert counts["image_tokens"] == 64 * result["data"]["sequences"]
    assert m["image_tokens_per_second_global"] > 0 and m["text_tokens_per_second_global"] > 0
    assert m["image_tokens_per_second_global"] + m["text_tokens_per_second_global"] == (
        pytest.approx(m["tokens_per_second_global"])
    )
    assert result["flops"]["method"] == "counted" and m["flops_per_token"] > 0
    # TRL's fused LM head runs again in the backward, which the count does not run
    assert m["hardware_flops_per_token"] is None
    assert any("LM head runs its product again" in n for n in result["notes"])
    assert math.isfinite(m["eval_loss"])
    assert all(math.isfinite(v) for _, v in result["loss_history"])
