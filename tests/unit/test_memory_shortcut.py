"""The memory prediction's shortcuts agree with the whole model's step within 1%.

A decoder of many alike blocks is stepped with two and three of them, and each
term of each phase's peak extended to the model's count
(``trainer_entry.run.memoryplan.SHORT_LAYERS``); cells that differ only in how
they shard share one step. Both are held here against ``Predictor(shortcut=False)``,
which steps the whole model, on a dense decoder, a mixture of experts and
GPT-BigCode (learned positions, multi-query attention), full and LoRA, with and
without activation checkpointing, on the CPU and as a GPU cell.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")

LAYERS = 6
CONFIGS: dict[str, dict[str, Any]] = {
    "dense": {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 160,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_hidden_layers": LAYERS,
        "vocab_size": 512,
        "max_position_embeddings": 512,
    },
    "moe": {
        "architectures": ["MixtralForCausalLM"],
        "model_type": "mixtral",
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_hidden_layers": LAYERS,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "vocab_size": 512,
        "max_position_embeddings": 512,
    },
    "bigcode": {
        "architectures": ["GPTBigCodeForCausalLM"],
        "model_type": "gpt_bigcode",
        "n_embd": 64,
        "n_head": 4,
        "n_layer": LAYERS,
        "n_positions": 256,
        "vocab_size": 512,
        "multi_query": True,
    },
}
LORA = {"peft_method": "lora", "r": 8, "lora_alpha": 16}
TARGETS = {"dense": ["q_proj", "v_proj"], "moe": ["q_proj", "v_proj"], "bigcode": ["c_attn"]}


@pytest.fixture(scope="module")
def folders() -> Any:
    with tempfile.TemporaryDirectory() as root:
        out = {}
        for name, config in CONFIGS.items():
            folder = Path(root) / name
            folder.mkdir()
            (folder / "config.json").write_text(json.dumps(config))
            out[name] = folder
        yield out


def _spec(folder: Path, scratch: Path, **arguments: Any) -> Any:
    from orchestrator.contract.spec import RunSpec

    device = arguments.pop("device", "cpu")
    spec = {
        "device": device,
        "num_gpus": arguments.pop("num_gpus", 1),
        "accelerate_config": arguments.pop("accelerate_config", None),
        "arguments": {
            "model_name_or_path": str(folder),
            "max_seq_len": 128,
            "torch_dtype": "bfloat16",
            "per_device_train_batch_size": 2,
            **arguments,
        },
    }
    return RunSpec(**spec).resolve(scratch)


def _both(spec: Any) -> tuple[Any, Any]:
    """(the prediction by the shortcut, by the whole model's step)."""
    from trainer_entry.run.memoryplan import Predictor, predict

    predictor = Predictor()
    short = predict(spec, predictor)
    # the shortcut was taken: the model's blocks were found alike and counted
    assert [shape.layers for shape in predictor._shapes.values()] == [LAYERS]
    return short, predict(spec, Predictor(shortcut=False))


@pytest.mark.parametrize("model", sorted(CONFIGS))
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "checkpointed"])
def test_a_few_blocks_extended_agree_with_the_whole_step(
    folders: dict[str, Path], tmp_path: Path, model: str, lora: bool, checkpointing: bool
) -> None:
    arguments: dict[str, Any] = {"gradient_checkpointing": checkpointing}
    if lora:
        arguments.update(LORA, target_modules=TARGETS[model])
    short, whole = _both(_spec(folders[model], tmp_path, **arguments))
    assert abs(short.peak_bytes / whole.peak_bytes - 1) < 0.01, (short.terms, whole.terms)
    for term, value in whole.terms.items():
        # each term within 1% of the whole peak
        assert abs(short.terms[term] - value) <= 0.01 * whole.peak_bytes, term


def test_a_gpu_cell_with_accumulation_agrees_too(folders: dict[str, Path], tmp_path: Path) -> None:
    spec = _spec(
        folders["dense"],
        tmp_path,
        device="gpu",
        bf16=True,
        gradient_accumulation_steps=2,
        gradient_checkpointing=True,
    )
    short, whole = _both(spec)
    assert abs(short.peak_bytes / whole.peak_bytes - 1) < 0.01, (short.terms, whole.terms)


def test_cells_that_differ_only_in_sharding_share_one_step(
    folders: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trainer_entry.run import memoryplan

    fsdp = Path(__file__).resolve().parents[2] / "accelerate.yaml"
    runs: list[int | None] = []
    original = memoryplan.Predictor._run

    def counted(self: Any, cell: Any, layers: int | None) -> Any:
        runs.append(layers)
        return original(self, cell, layers)

    monkeypatch.setattr(memoryplan.Predictor, "_run", counted)
    predictor = memoryplan.Predictor()
    one = memoryplan.predict(
        _spec(folders["dense"], tmp_path, device="gpu", accelerate_config=str(fsdp)), predictor
    )
    two = memoryplan.predict(
        _spec(folders["dense"], tmp_path, device="gpu", num_gpus=2, accelerate_config=str(fsdp)),
        predictor,
    )
    assert runs == list(memoryplan.SHORT_LAYERS)  # two short steps, for both cells
    assert two.terms["optimizer states"] == one.terms["optimizer states"] // 2
    # and the shared step is the whole model's, sharded
    whole = memoryplan.predict(
        _spec(folders["dense"], tmp_path, device="gpu", num_gpus=2, accelerate_config=str(fsdp)),
        memoryplan.Predictor(shortcut=False),
    )
    assert abs(two.peak_bytes / whole.peak_bytes - 1) < 0.01
