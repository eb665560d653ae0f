"""The image-classification task end to end: the real child on the tiny ViT and generated images.

One process with full fine-tuning, and two (gloo DDP on the CPU, under
``accelerate launch --multi_gpu``) with LoRA. The images fed and the tokens
they count are checked against what the steps and batch sizes imply, the
positions per image against the tiny ViT's own config.
"""

from __future__ import annotations

import json

import pytest
from test_child import run_child

from orchestrator.contract import columns as registry

pytestmark = [pytest.mark.e2e, pytest.mark.long]


def _positions() -> int:
    """Positions per image of the tiny ViT: its patches and the class token, from its config."""
    from trainer_entry.models.tiny_vit import ensure_tiny_vit

    config = json.loads((ensure_tiny_vit() / "config.json").read_text())
    return (config["image_size"] // config["patch_size"]) ** 2 + 1


@pytest.mark.parametrize(
    ("processes", "peft"),
    [(1, None), (2, "lora")],
    ids=["1proc-full", "2proc-lora"],
)
def test_tiny_vit_trains_on_generated_images(tmp_path, processes, peft) -> None:
    world, pd, ga, steps, images = processes, 4, 2, 4, 96
    arguments = {
        "task": "image-classification",
        "model_name_or_path": "tiny-vit",
        "dataset": "synthetic-shapes",
        "dataset_kwargs": {"num_images": images},
        "per_device_train_batch_size": pd,
        "gradient_accumulation_steps": ga,
        "max_steps": steps,
        "logging_steps": 1,
        "learning_rate": 1e-3,
        "warmup_steps_excluded": 1,
    }
    if peft:
        arguments.update(peft_method="lora", r=4, target_modules=["q_proj", "v_proj"])
    proc, result = run_child(tmp_path, arguments, processes=processes)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert result["status"] == "ok" and result["error"] is None
    assert (result["task"], result["trainer"], result["sample_unit"]) == (
        "image-classification",
        "hf",
        "images",
    )
    m = result["metrics"]
    assert registry.undeclared_metrics(m) == []

    # every step fed pd × ga images on each rank (fewer than the set holds: no short batch)
    positions = _positions()
    fed = steps * pd * ga * world
    assert fed <= images
    assert m["tokens_total"] == fed * positions
    assert m["padded_tokens_total"] == m["tokens_total"]  # no image is padded
    measured = (steps - 1) * pd * ga * world
    assert m["samples_measured"] == measured
    for rank in result["ranks"]:
        assert rank["step_rows"] == [pd * ga] * steps
    window = max(sum(r["step_times_s"][1:]) for r in result["ranks"])
    assert m["samples_per_second_global"] == pytest.approx(measured / window)
    assert m["samples_per_second_per_device"] == pytest.approx(measured / window / world)
    assert m["tokens_per_second_global"] == pytest.approx(measured * positions / window)
    assert m["samples_per_second_global"] > 0

    assert m["flops_per_token"] > 0 and m["mfu"] is None  # no peak for a CPU
    assert result["flops"]["rows"] == measured
    assert result["flops"]["attention_length"] == positions
    assert m["mem_peak_rss_bytes"] > 50 * 2**20
    assert m["loss_first"] is not None and len(result["loss_history"]) == steps

    data = result["data"]
    assert data["source"]["name"] == "synthetic-shapes"
    assert (data["examples"], data["sequences"], data["tokens"], data["label_tokens"]) == (
        images,
        images,
        images * positions,
        images,
    )
    assert result["world_size"] == world and result["peft_method"] == peft
    assert result["model"]["architecture"] == "ViTForImageClassification"
    assert (result["model"]["trainable_params"] < result["model"]["total_params"]) == (
        peft is not None
    )
