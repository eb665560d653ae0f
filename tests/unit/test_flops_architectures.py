"""The FLOPs formula against PyTorch's FLOP counter, across the architectures users run.

Every shipped ``config:`` architecture is shrunk to a tiny size (same
``model_type`` and structural flags: tied embeddings, explicit head_dim, grouped
query attention, sliding window), plus other common families, each trained for
one step with full fine-tuning, LoRA, and LoRA with ``modules_to_save``.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest
import torch
from flopcount import counted_step
from torch.utils.flop_counter import FlopCounterMode

from trainer_entry.measure.flops import (
    FlopsUnavailable,
    attention_windows,
    estimate_flops,
)
from trainer_entry.measure.recompute import Recomputed, checkpointing_mode
from trainer_entry.measure.steps import SequenceLengths
from trainer_entry.models.load import ARCHITECTURES, apply_peft, shipped_architectures
from trainer_entry.run.parse import PeftConfig
from trainer_entry.tasks.causal_lm import CausalLMTask

BATCH, SEQ, WINDOW, VOCAB = 2, 64, 16, 512
TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "vocab_size": VOCAB}


def _shipped(name: str) -> dict:
    """A shipped architecture at a tiny size, its structure kept."""
    config = {
        k: v
        for k, v in json.loads((ARCHITECTURES / f"{name}.json").read_text()).items()
        if not k.startswith("_")
    }
    grouped = config["num_key_value_heads"] < config["num_attention_heads"]
    config.update(TINY, num_attention_heads=4, num_key_value_heads=2 if grouped else 4)
    if "head_dim" in config:
        # kept explicit, and made unlike hidden / heads so the formula must read it
        config["head_dim"] = 32
    if config.get("sliding_window"):
        config["sliding_window"] = WINDOW
    return config


def _config(name: str, window: int = WINDOW):
    from transformers import AutoConfig

    if name.startswith("config:"):
        shipped = _shipped(name.removeprefix("config:"))
        if "sliding_window" in shipped:
            shipped["sliding_window"] = window
        return AutoConfig.for_model(**shipped)
    common = {**TINY, "num_attention_heads": 4}
    configs = {
        "gpt_bigcode": {
            "model_type": "gpt_bigcode",
            "n_embd": 64,
            "n_layer": 2,
            "n_head": 4,
            "n_inner": 128,
            "vocab_size": VOCAB,
            "n_positions": 128,
            "multi_query": True,
        },
        "gpt2": {
            "model_type": "gpt2",
            "n_embd": 64,
            "n_layer": 2,
            "n_head": 4,
            "n_inner": 128,
            "vocab_size": VOCAB,
            "n_positions": 128,
        },
        "qwen2-tied": {
            "model_type": "qwen2",
            **common,
            "num_key_value_heads": 2,
            "tie_word_embeddings": True,
        },
        "gemma2": {
            "model_type": "gemma2",
            **common,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "sliding_window": window,
        },
        "gemma3": {
            "model_type": "gemma3_text",
            **common,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "sliding_window": window,
            "layer_types": ["sliding_attention", "full_attention"],
        },
        "phi3": {
            "model_type": "phi3",
            **common,
            "num_key_value_heads": 2,
            "sliding_window": window,
            "pad_token_id": 0,
            "bos_token_id": 1,
            "eos_token_id": 2,
        },
        "bert": {"model_type": "bert", **common, "max_position_embeddings": 128},
    }
    return AutoConfig.for_model(**configs[name])


#: Shipped architectures checked by a task's tests, by model_type: an encoder
#: or a ViT is no causal LM. Every other shipped architecture is checked here.
CHECKED_BY_TASK = {
    "bert": "seq-classification",
    "roberta": "seq-classification",
    "vit": "image-classification",
    "t5": "seq2seq-lm",
    "bart": "seq2seq-lm",
    "whisper": "speech-recognition",
    "wav2vec2": "speech-recognition",
    "llava": "vision-language",
    "qwen2_vl": "vision-language",
}


def _model_type(name: str) -> str:
    return json.loads((ARCHITECTURES / f"{name}.json").read_text())["model_type"]


# every shipped causal architecture (a new one is checked as soon as its file is there)
SHIPPED = [
    f"config:{name}" for name in shipped_architectures() if _model_type(name) not in CHECKED_BY_TASK
]
ARCHS = [
    *SHIPPED,
    "gpt_bigcode",
    "gpt2",
    "qwen2-tied",
    "gemma2",
    "gemma3",
    "phi3",
    "bert",
]


# ---------------------------------------------------------------------------
# An attention kernel that skips what a sliding window excludes, for the counter
# ---------------------------------------------------------------------------


def _banded_attention(module, query, key, value, attention_mask, **kwargs):
    """Sliding-window layers computed on each query's band of ``w`` keys only.

    Eager attention computes the whole ``s × s`` square and masks it, so the
    FLOP counter would see a window's layers as full ones; a windowed kernel
    (flash-attention's ``window_size``) does only the band. This one does the
    same work in plain matmuls the counter sees. Full layers go to the model's
    own eager function.
    """
    window = kwargs.get("sliding_window")
    seq = query.shape[2]
    if not window or window >= seq:
        eager = importlib.import_module(type(module).__module__).eager_attention_forward
        return eager(module, query, key, value, attention_mask, **kwargs)
    groups = query.shape[1] // key.shape[1]
    key = key.repeat_interleave(groups, dim=1)
    value = value.repeat_interleave(groups, dim=1)
    # each query's w keys, ending at itself: pad w-1 in front, then slide (no FLOPs)
    pad = (0, 0, window - 1, 0)
    keys = torch.nn.functional.pad(key, pad).unfold(2, window, 1)  # b h s d w
    values = torch.nn.functional.pad(value, pad).unfold(2, window, 1)
    scaling = kwargs.get("scaling") or query.shape[-1] ** -0.5
    scores = torch.einsum("bhqd,bhqdw->bhqw", query, keys) * scaling
    softcap = kwargs.get("softcap")
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    position = torch.arange(seq)[:, None] - window + 1 + torch.arange(window)[None, :]
    scores = scores.masked_fill(position < 0, float("-inf"))
    probs = torch.softmax(scores.float(), dim=-1).to(query.dtype)
    out = torch.einsum("bhqw,bhqdw->bhqd", probs, values)
    return out.transpose(1, 2).contiguous(), probs


@pytest.fixture(scope="module", autouse=True)
def _register_banded():
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, eager_mask

    AttentionInterface.register("banded", _banded_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register("banded", eager_mask)


# ---------------------------------------------------------------------------


def _model(name: str, mode: str, attn: str = "eager", window: int = WINDOW):
    from transformers import AutoModelForCausalLM, AutoModelForMaskedLM

    torch.manual_seed(0)
    auto = AutoModelForMaskedLM if name == "bert" else AutoModelForCausalLM
    config = _config(name, window)
    model = auto.from_config(config, dtype=torch.float32, attn_implementation=attn)
    if mode != "full" and name == "bert":
        # an encoder is not a CAUSAL_LM task, which apply_peft sets: a plain PeftModel
        from peft import LoraConfig, get_peft_model

        save = ["cls"] if mode == "lora+save" else None
        model = get_peft_model(
            model, LoraConfig(r=8, target_modules="all-linear", modules_to_save=save)
        )
    elif mode != "full":
        model = apply_peft(
            model,
            PeftConfig(
                method="lora",
                r=8,
                target_modules="all-linear",
                modules_to_save=["lm_head"] if mode == "lora+save" else None,
            ),
            quantized=False,
            task=CausalLMTask(),
        )
    model.train()
    return model


def _loss(model, ids) -> torch.Tensor:
    return model(input_ids=ids, labels=ids).loss


def _counted(model, ids) -> float:
    with FlopCounterMode(display=False) as counter:
        _loss(model, ids).backward()
    return counter.get_total_flops() / ids.numel()


@pytest.mark.parametrize("mode", ["full", "lora", "lora+save"])
@pytest.mark.parametrize("name", ARCHS)
def test_formula_matches_the_flop_counter(name, mode) -> None:
    windowed = any(w is not None and w < SEQ for w in attention_windows(_model(name, "full")))
    # windowed models run the banded kernel so the counter sees a windowed kernel's work
    model = _model(name, mode, attn="banded" if windowed else "eager")
    step = counted_step(model, torch.randint(3, VOCAB, (BATCH, SEQ)), _loss)
    estimate = estimate_flops(model, SEQ, step.recomputed)
    # above the count by the input gradients autograd skipped (LoRA: the first layer's
    # input projections, which nothing below needs), and by nothing else
    assert step.counted <= estimate.model_flops_per_token
    assert estimate.model_flops_per_token == pytest.approx(
        step.counted + step.skipped_input_grads, rel=1e-6
    )
    if mode == "full":
        # nothing upstream of the first layer is skipped: the formula is exact
        assert step.skipped_input_grads == 0
    else:
        assert 0 < step.skipped_input_grads < 0.05 * step.counted


@pytest.mark.parametrize(
    ("name", "windows"),
    [
        ("config:mistral-7b", [WINDOW, WINDOW]),  # a model-wide window, on every layer
        ("phi3", [WINDOW, WINDOW]),
        ("gemma2", [WINDOW, None]),  # sliding and full layers alternate
        ("gemma3", [WINDOW, None]),
    ],
)
def test_sliding_windows_are_applied_and_capped(name, windows) -> None:
    eager = _model(name, "full")
    assert attention_windows(eager) == windows
    ids = torch.randint(3, VOCAB, (BATCH, SEQ))
    # the eager model really windows: a kernel that cannot see past the window
    # gives its loss, and the same weights without a window give another
    banded = _model(name, "full", attn="banded")
    unwindowed = _model(name, "full", window=4 * SEQ)
    banded.load_state_dict(eager.state_dict())
    unwindowed.load_state_dict(eager.state_dict())
    with torch.no_grad():
        loss = _loss(eager, ids).item()
        assert _loss(banded, ids).item() == pytest.approx(loss, rel=1e-5)
        assert _loss(unwindowed, ids).item() != pytest.approx(loss, rel=1e-5)
    # and the window caps attention: a windowed layer counts w keys per token, not s
    width = eager.config.num_attention_heads * (
        getattr(eager.config, "head_dim", None) or eager.config.hidden_size // 4
    )
    expected = sum(12.0 * width * (SEQ if w is None else w) for w in windows)
    assert estimate_flops(eager, SEQ, Recomputed()).attention == pytest.approx(expected)
    assert estimate_flops(unwindowed, SEQ, Recomputed()).attention == pytest.approx(
        12.0 * width * SEQ * len(windows)
    )


def test_shrunk_architectures_keep_their_structure() -> None:
    mistral, small = _shipped("mistral-7b"), _shipped("llama-3.2-1b")
    assert mistral["model_type"] == "mistral" and mistral["sliding_window"] == WINDOW
    assert small["tie_word_embeddings"] is True and small["head_dim"] == 32
    assert _shipped("qwen2.5-7b")["num_key_value_heads"] == 2  # grouped-query attention kept


def test_unpacked_attention_is_per_real_token() -> None:
    """Σr²/Σr: two real sequences trained alone cost what the formula says per real token."""
    model = _model("config:llama-3.1-8b", "full")
    short, long = torch.randint(3, VOCAB, (1, 10)), torch.randint(3, VOCAB, (1, 50))
    counted = _counted(model, short) * 10 + _counted(model, long) * 50
    fed = SequenceLengths.of([10, 50])
    estimate = estimate_flops(model, fed, Recomputed())
    assert estimate.model_flops_per_token == pytest.approx(counted / 60, rel=1e-6)
    # the mean padded width (50) overstates attention; the mean length (30) understates it
    assert estimate_flops(model, 50, Recomputed()).attention > estimate.attention
    assert estimate_flops(model, 30, Recomputed()).attention < estimate.attention


def test_sliding_window_on_unpacked_lengths() -> None:
    model = _model("gemma3", "full", attn="banded")
    fed = SequenceLengths.of([8, 40], windows=(WINDOW,))
    counted = sum(_counted(model, torch.randint(3, VOCAB, (1, n))) * n for n in (8, 40))
    estimate = estimate_flops(model, fed, Recomputed())
    assert estimate.model_flops_per_token == pytest.approx(counted / 48, rel=1e-6)
    with pytest.raises(FlopsUnavailable, match="not recorded for sliding window 16"):
        estimate_flops(model, SequenceLengths.of([8, 40]), Recomputed())


# ---------------------------------------------------------------------------
# Mixture of experts
# ---------------------------------------------------------------------------


def _mixtral(experts: str = "eager"):
    from transformers import AutoModelForCausalLM, MixtralConfig

    config = MixtralConfig(
        **TINY,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_local_experts=8,
        num_experts_per_tok=2,
        max_position_embeddings=256,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(
        config, dtype=torch.float32, attn_implementation="eager", experts_implementation=experts
    )
    return model.train()


@pytest.mark.parametrize("peft", [None, "lora"])
def test_mixture_of_experts_counts_active_experts_and_router(peft) -> None:
    model = _mixtral()
    if peft:
        model = apply_peft(
            model,
            PeftConfig(method="lora", r=8, target_modules=["q_proj", "v_proj"]),
            quantized=False,
            task=CausalLMTask(),
        )
    estimate = estimate_flops(model, SEQ, Recomputed())
    # Checked analytically: transformers runs the experts as grouped matmuls
    # (grouped_mm, its default where it can dispatch), which FlopCounterMode has
    # no formula for and counts as 0, so the counter is no reference for MoE.
    h, inter, vocab, layers, top_k, experts = 64, 128, VOCAB, 2, 2, 8
    d_kv = 2 * 16
    attn_proj = 2 * (h * h + 2 * h * d_kv + h * h)  # q, k, v, o
    per_token_experts = top_k * 2 * (3 * h * inter)  # gate, up and down of k experts
    router = 2 * h * experts
    forward = layers * (attn_proj + per_token_experts + router) + 2 * h * vocab
    attention = layers * 12.0 * h * SEQ
    if peft is None:
        assert estimate.model_flops_per_token == pytest.approx(3 * forward + attention)
    else:
        # forward of A (h -> 8) and B (8 -> out) on q_proj and v_proj; only they train
        lora = layers * 2 * 8 * (h + h + h + d_kv)
        assert estimate.linear_weight_grad == pytest.approx(lora)
        assert estimate.model_flops_per_token == pytest.approx(2 * forward + 3 * lora + attention)


def test_the_flop_counter_misses_grouped_experts_but_sees_the_eager_loop() -> None:
    eager, grouped = _mixtral("eager"), _mixtral("grouped_mm")
    grouped.load_state_dict(eager.state_dict())
    ids = torch.randint(3, VOCAB, (BATCH, SEQ))
    with torch.no_grad():  # the same computation either way
        assert _loss(grouped, ids).item() == pytest.approx(_loss(eager, ids).item(), rel=1e-4)
    estimate = estimate_flops(eager, SEQ, Recomputed()).model_flops_per_token
    # the eager loop is one plain matmul per expert, which the counter sees: exact
    assert estimate == pytest.approx(_counted(eager, ids), rel=1e-6)
    # grouped matmuls are invisible to it: most of the step goes uncounted
    assert _counted(grouped, ids) < 0.5 * estimate


# ---------------------------------------------------------------------------
# Activation checkpointing under FSDP2
# ---------------------------------------------------------------------------


@pytest.fixture
def gloo_group(tmp_path):
    """A one-process gloo group, for FSDP2 on the CPU."""
    import torch.distributed as dist

    if not dist.is_available() or dist.is_initialized():
        pytest.skip("needs torch.distributed, and no process group already in use")
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("name", ["config:llama-3.1-8b", "moe"])
def test_the_recompute_of_fully_sharded_blocks_is_seen_as_it_runs(name, gloo_group) -> None:
    from torch.distributed.fsdp import fully_shard

    ids = torch.randint(3, VOCAB, (BATCH, SEQ))
    plain = _model(name, "full") if name != "moe" else _mixtral()
    _checkpoint(plain, reentrant=False)
    counted, watched = _watched_step(plain, ids)
    before = estimate_flops(plain, SEQ, watched)
    model = _mixtral() if name == "moe" else _model(name, "full")
    _checkpoint(model, reentrant=False)
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    # fully_shard swaps each block's class for a subclass named FSDP<Name>
    assert type(model.model.layers[0]).__name__.startswith("FSDP")
    _, sharded = _watched_step(model, ids)
    after = estimate_flops(model, SEQ, sharded)
    assert after.recompute == before.recompute > after.attention / 3
    assert after.hardware_flops_per_token == pytest.approx(counted, rel=1e-6)


# ---------------------------------------------------------------------------
# What activation checkpointing recomputes, as the run's first step shows it
# ---------------------------------------------------------------------------


def _checkpoint(model, *, reentrant: bool) -> None:
    """Checkpointing as the trainers set it up: every block, inputs requiring grad."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    base.activation_checkpointing_enable(
        activation_checkpointing_kwargs={"use_reentrant": reentrant}
    )
    base.enable_input_require_grads()


def _watched_step(model, ids) -> tuple[float, Recomputed]:
    """(FLOPs the counter saw per token, what the watch saw run again) of one step."""
    step = counted_step(model, ids, _loss)
    return step.counted, step.recomputed


#: the dense families the GPU acceptance trains, and a mixture of experts
RECOMPUTE_ARCHS = ["config:llama-3.2-1b", "config:qwen2.5-7b", "config:mistral-7b", "gpt_bigcode"]


@pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])
@pytest.mark.parametrize("mode", ["full", "lora"])
@pytest.mark.parametrize("name", [*RECOMPUTE_ARCHS, "moe"])
def test_hardware_flops_are_what_the_counter_sees_under_checkpointing(
    name, mode, reentrant
) -> None:
    if name == "moe":
        # the eager expert loop: one plain matmul per expert, which the counter sees
        model = _mixtral("eager")
        if mode == "lora":
            model = apply_peft(
                model,
                PeftConfig(method="lora", r=8, target_modules=["q_proj", "v_proj"]),
                quantized=False,
                task=CausalLMTask(),
            )
    else:
        windowed = any(w is not None and w < SEQ for w in attention_windows(_model(name, "full")))
        model = _model(name, mode, attn="banded" if windowed else "eager")
    _checkpoint(model, reentrant=reentrant)
    assert checkpointing_mode(model) == ("reentrant" if reentrant else "non-reentrant")
    step = counted_step(model, torch.randint(3, VOCAB, (BATCH, SEQ)), _loss)
    estimate = estimate_flops(model, SEQ, step.recomputed)
    # the count ≤ the figure ≤ the count + what autograd skipped, which is nothing
    # here: checkpointing makes the blocks' inputs require grad (enable_input_require_grads)
    assert step.skipped_input_grads == 0
    assert estimate.hardware_flops_per_token == pytest.approx(step.counted, rel=1e-6)
    assert estimate.recompute > 0


def test_non_reentrant_checkpointing_skips_a_blocks_last_product_and_reentrant_does_not() -> None:
    """What the GPU showed (the H100's +5.4%): non-reentrant checkpointing stops once the
    last tensor saved for the backward is rebuilt, so Llama's down_proj is never rerun."""
    ids = torch.randint(3, VOCAB, (BATCH, SEQ))
    seen = {}
    for reentrant in (False, True):
        model = _model("config:llama-3.2-1b", "full")
        _checkpoint(model, reentrant=reentrant)
        _, watched = _watched_step(model, ids)
        seen[reentrant] = {
            name.split(".", 3)[-1]: watched.share(module)
            for name, module in model.named_modules()
            if name.startswith("model.layers.0.") and isinstance(module, torch.nn.Linear)
        }
        assert watched.attention == (1.0, 1.0)
    assert seen[True] == dict.fromkeys(seen[True], 1.0)
    assert seen[False] == {**seen[True], "mlp.down_proj": 0.0}
    # the gap is down_proj's forward in every layer: 2 · hidden · intermediate per token
    a, b = _model("config:llama-3.2-1b", "full"), _model("config:llama-3.2-1b", "full")
    _checkpoint(a, reentrant=False)
    _checkpoint(b, reentrant=True)
    gap = estimate_flops(b, SEQ, _watched_step(b, ids)[1]).hardware_flops_per_token - (
        estimate_flops(a, SEQ, _watched_step(a, ids)[1]).hardware_flops_per_token
    )
    assert gap == pytest.approx(2 * 2 * TINY["hidden_size"] * TINY["intermediate_size"])


def test_no_checkpointing_reruns_nothing_and_an_unseen_recompute_gives_no_figure() -> None:
    model = _model("config:llama-3.2-1b", "lora")
    _, watched = _watched_step(model, torch.randint(3, VOCAB, (BATCH, SEQ)))
    assert checkpointing_mode(model) is None
    assert watched.attention == (0.0, 0.0) and not any(watched.shares.values())
    estimate = estimate_flops(model, SEQ, watched)
    assert estimate.recompute == 0 and estimate.hardware_flops_per_token == (
        estimate.model_flops_per_token
    )
    unseen = estimate_flops(model, SEQ, None)
    assert unseen.hardware_flops_per_token is None and "not seen" in unseen.hardware_note
    assert unseen.model_flops_per_token == estimate.model_flops_per_token


def test_the_shipped_architectures_are_all_checked() -> None:
    """Causal ones here; the others by their task's tests, whose file must exist.

    bert and roberta: ``tests/unit/test_task_seq_classification.py``; vit:
    ``tests/unit/test_task_image_classification.py``. Each of those picks the
    shipped architectures of its model types itself.
    """
    assert {"config:llama-3.1-8b", "config:llama-3.2-1b", "config:mistral-7b"} <= set(SHIPPED)
    assert "config:qwen2.5-7b" in SHIPPED
    here = Path(__file__).parent
    for name in shipped_architectures():
        task = CHECKED_BY_TASK.get(_model_type(name))
        if task is None:
            assert f"config:{name}" in SHIPPED
        else:
            assert f"config:{name}" not in SHIPPED
            test_file = here / f"test_task_{task.replace('-', '_')}.py"
            assert test_file.is_file(), f"{name} ({task}) needs its checks in {test_file.name}"


def test_attention_modules_that_are_not_the_layers_give_no_hardware_figure() -> None:
    """A model whose attention modules do not map one to one onto its text layers (a
    vision tower's, cross-attention) leaves the recompute of attention unknown: no
    hardware figure, with a note, rather than a mean share that a frozen tower dilutes."""
    model = _model("config:llama-3.2-1b", "full")
    _checkpoint(model, reentrant=False)
    _, watched = _watched_step(model, torch.randint(3, VOCAB, (BATCH, SEQ)))
    extra = Recomputed(watched.shares, watched.started, (*watched.attention, 0.0))
    estimate = estimate_flops(model, SEQ, extra)
    assert estimate.hardware_flops_per_token is None
    assert (
        "3 attention module(s)" in estimate.hardware_note and "2 layers" in estimate.hardware_note
    )
    assert (
        estimate.model_flops_per_token == estimate_flops(model, SEQ, watched).model_flops_per_token
    )


def test_a_trainers_own_rerun_without_checkpointing_keeps_the_hardware_figure() -> None:
    """TRL's fused head reruns the head with no checkpointing and no attention modules
    seen: the figure is the model's plus the head's forward, not withheld."""
    model = _model("config:llama-3.2-1b", "full")
    head = model.get_output_embeddings()
    rerun = Recomputed().with_reruns({id(head): 1.0})
    estimate = estimate_flops(model, SEQ, rerun)
    assert estimate.hardware_note is None
    assert estimate.recompute == pytest.approx(2.0 * head.weight.numel())


def test_a_checkpoint_wrapper_says_its_mode() -> None:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl,
        checkpoint_wrapper,
    )

    model = _model("config:llama-3.2-1b", "full")
    assert checkpointing_mode(model) is None
    model.model.layers[0] = checkpoint_wrapper(
        model.model.layers[0], checkpoint_impl=CheckpointImpl.NO_REENTRANT
    )
    assert checkpointing_mode(model) == "non-reentrant"
