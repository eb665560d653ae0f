"""The analytic FLOPs formula against PyTorch's FLOP counter on real training steps."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from flopcount import counted_step
from torch.utils.flop_counter import FlopCounterMode

from trainer_entry.measure.flops import (
    PEAK_TFLOPS,
    compute_mode,
    estimate_flops,
    peak_note,
    peak_tflops,
    utilization,
)
from trainer_entry.measure.recompute import Recomputed
from trainer_entry.measure.steps import RankStats, SequenceLengths, StepRecorder
from trainer_entry.models.load import apply_peft
from trainer_entry.run.parse import PeftConfig
from trainer_entry.tasks.causal_lm import CausalLMTask

BATCH, SEQ = 4, 128


def _counted_step(model) -> float:
    ids = torch.randint(0, 1000, (BATCH, SEQ))
    with FlopCounterMode(display=False) as counter:
        model(input_ids=ids, labels=ids).loss.backward()
    return counter.get_total_flops() / (BATCH * SEQ)


def _model(tiny_path, peft: str | None, checkpointing: bool):
    from transformers import AutoModelForCausalLM

    # Eager attention: its matmuls are visible to the FLOP counter, which has no
    # formula for the CPU's fused scaled-dot-product kernel and would count 0.
    model = AutoModelForCausalLM.from_pretrained(
        tiny_path, dtype=torch.float32, attn_implementation="eager"
    )
    if peft:
        model = apply_peft(
            model,
            PeftConfig(method="lora", r=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]),
            quantized=False,
            task=CausalLMTask(),
        )
    model.train()
    if checkpointing:
        model.activation_checkpointing_enable(
            activation_checkpointing_kwargs={"use_reentrant": False}
        )
        if peft:
            model.enable_input_require_grads()
    return model


@pytest.mark.parametrize("peft", [None, "lora"])
@pytest.mark.parametrize("checkpointing", [False, True])
def test_the_figures_are_the_count_plus_only_the_known_excess(
    tiny_path, peft, checkpointing
) -> None:
    model = _model(tiny_path, peft, checkpointing)
    ids = torch.randint(0, 1000, (BATCH, SEQ))
    step = counted_step(model, ids, lambda m, x: m(input_ids=x, labels=x).loss)
    estimate = estimate_flops(model, SEQ, step.recomputed)
    # The counter sees the work actually done, recomputation included; the figure is
    # above it only by the input gradients autograd skipped (LoRA without
    # checkpointing: the first layer's input projections, which nothing below needs)
    assert step.counted <= estimate.hardware_flops_per_token
    assert estimate.hardware_flops_per_token == pytest.approx(
        step.counted + step.skipped_input_grads, rel=1e-6
    )
    assert (step.skipped_input_grads > 0) == (peft is not None and not checkpointing)
    if not checkpointing:
        assert estimate.hardware_flops_per_token == estimate.model_flops_per_token


def test_trl_fused_lm_head_reruns_the_head_in_its_backward(tiny_path) -> None:
    """The sft backend's one rerun outside module calls: TRL's fused LM head rebuilds each
    tile of logits in its backward. Counted here as the head's products with the hidden
    states: once in the forward and once again in the backward (beside its two gradient
    products, which its CPU path runs as in-place addmm_, invisible to FlopCounterMode)."""
    from trl.trainer.utils import add_fused_lm_head

    from trainer_entry.backends.sft import SFTTrainerBackend

    model = _model(tiny_path, None, False)
    assert SFTTrainerBackend().reruns(model) == {}
    add_fused_lm_head(model, outputs=("log_probs", "entropy", "is_top1"))
    head = model.get_output_embeddings()
    assert SFTTrainerBackend().reruns(model) == {id(head): 1.0}
    vocab, hidden = head.weight.shape
    ids = torch.randint(0, 1000, (BATCH, SEQ))
    with FlopCounterMode(display=False) as counter:
        loss = model(input_ids=ids, labels=ids, fused_lm_head=True).loss
        forward = counter.get_flop_counts()["Global"][torch.ops.aten.mm]
        loss.backward()
    products = counter.get_flop_counts()["Global"][torch.ops.aten.mm]
    # every position but each row's last (its label is the next token) is scored
    head_product = 2 * vocab * hidden * BATCH * (SEQ - 1)
    blocks = forward - head_product  # the blocks' forward products, before the head's
    assert forward >= head_product
    # backward: the blocks' input and weight gradients (2× their forward), and the
    # head's product once more
    assert products - forward == 2 * blocks + head_product


def test_full_fine_tuning_without_checkpointing_is_exact(tiny_path) -> None:
    model = _model(tiny_path, None, False)
    assert estimate_flops(model, SEQ, Recomputed()).model_flops_per_token == _counted_step(model)


def test_lora_costs_less_than_full(tiny_path) -> None:
    full = estimate_flops(_model(tiny_path, None, False), SEQ, Recomputed())
    lora = estimate_flops(_model(tiny_path, "lora", False), SEQ, Recomputed())
    assert lora.linear_weight_grad < 0.1 * full.linear_weight_grad
    assert lora.model_flops_per_token < full.model_flops_per_token


def test_peak_table_is_matched_on_exact_names_and_modes() -> None:
    assert peak_tflops("NVIDIA H100 80GB HBM3", "bf16") == 989.4
    assert peak_tflops("NVIDIA H100 80GB HBM3", "fp8") == 1978.9
    assert peak_tflops("NVIDIA H100 80GB HBM3", "tf32") == 494.7
    assert peak_tflops("NVIDIA H100 PCIe", "bf16") == 756.5
    assert peak_tflops("NVIDIA A100-SXM4-80GB", "fp32") == 19.5
    assert peak_tflops("NVIDIA A100-SXM4-80GB", "tf32") == 156.0
    assert peak_tflops("NVIDIA A100-SXM4-80GB", "fp8") is None  # Ampere has no FP8 cores
    assert peak_tflops("NVIDIA H100", "bf16") is None  # not a reported name
    assert peak_tflops(None, "bf16") is None
    for name in ("A100", "H100", "H200", "L4", "L40S", "MI300X"):
        assert any(name in key for key in PEAK_TFLOPS), name
    # the A10's datasheet figure is not the A10G's, and no A10G figure is published
    assert not any("A10G" in key for key in PEAK_TFLOPS)
    for peaks in PEAK_TFLOPS.values():
        assert peaks.fp32 <= (peaks.tf32 or peaks.fp32) <= peaks.bf16 <= (peaks.fp8 or peaks.bf16)


@pytest.fixture
def fp32_precision():
    """Set torch's fp32 matmul precision for a test, and put it back after."""
    matmul = torch.backends.cuda.matmul
    saved = matmul.fp32_precision

    def set_to(value: str) -> None:
        matmul.fp32_precision = value

    yield set_to
    matmul.fp32_precision = saved


def test_compute_mode_picks_the_precision_matmuls_run_in(fp32_precision) -> None:
    fp32_precision("ieee")
    assert compute_mode(dtype="float32", mixed_precision="fp8", tf32=None) == "fp8"
    assert compute_mode(dtype="float32", mixed_precision="bf16", tf32=None) == "bf16"
    assert compute_mode(dtype="bfloat16", mixed_precision="no", tf32=None) == "bf16"
    assert compute_mode(dtype="float32", mixed_precision="no", tf32=True) == "tf32"
    assert compute_mode(dtype="float32", mixed_precision="no", tf32=None) == "fp32"
    # TF32 switched on in torch (what TrainingArguments(tf32=True) and
    # torch.set_float32_matmul_precision("high") do), not by the argument
    fp32_precision("tf32")
    assert compute_mode(dtype="float32", mixed_precision="no", tf32=None) == "tf32"
    assert compute_mode(dtype="float32", mixed_precision="no", tf32=False) == "fp32"


def test_an_mfu_above_one_is_an_error_not_a_figure() -> None:
    achieved, mfu, notes = utilization(6e9, 200_000.0, 989.4)  # 1200 TFLOP/s on an H100
    assert achieved == pytest.approx(1200.0)
    assert mfu is None
    assert len(notes) == 1 and notes[0].startswith("error: MFU computed as 1.213 (> 1)")
    achieved, mfu, notes = utilization(6e9, 100_000.0, 989.4)
    assert mfu == pytest.approx(600 / 989.4) and notes == []
    assert utilization(6e9, 100_000.0, None) == (pytest.approx(600.0), None, [])
    assert utilization(None, 100_000.0, 989.4) == (None, None, [])


def test_unknown_device_says_how_to_set_a_peak() -> None:
    note = peak_note("NVIDIA A10G", "bf16", None)
    assert note is not None and "no peak is known for device 'NVIDIA A10G'" in note
    assert "peak_tflops_per_device" in note
    note = peak_note("NVIDIA A100-SXM4-80GB", "fp8", None)
    assert note is not None and "no fp8 tensor cores" in note
    assert peak_note("NVIDIA A100-SXM4-80GB", "bf16", 312.0) is None
    assert peak_note(None, "fp32", None) is None  # the CPU: no MFU, nothing to explain


def _figures(
    model,
    ranks,
    *,
    tps,
    device,
    peak=None,
    mixed_precision="bf16",
    packing=False,
    backend="hf",
    completion_only_loss=False,
):
    from trainer_entry.results.finished import flops_figures
    from trainer_entry.run.parse import DataConfig, MeasureConfig

    parsed = SimpleNamespace(
        data=DataConfig(
            max_seq_len=SEQ, packing=packing, completion_only_loss=completion_only_loss
        ),
        measure=MeasureConfig(peak_tflops_per_device=peak),
        backend=backend,
    )
    settings = SimpleNamespace(
        mixed_precision=mixed_precision, tf32=None, activation_checkpointing=False
    )
    metrics = {"warmup_steps_excluded": 1, "steps": 3, "tokens_per_second_per_device": tps}
    return flops_figures(
        model=model,
        ranks=ranks,
        metrics=metrics,
        parsed=parsed,
        settings=settings,
        dtype="float32",
        device_name=device,
    )


def test_result_figures_use_the_rows_fed_in_the_measured_steps(tiny_path) -> None:
    model = _model(tiny_path, None, False)
    # two ranks, micro-batches of 4 rows; rank 1's last step is short (1 row)
    recorder = [StepRecorder(rank=r, clock=iter(range(100)).__next__) for r in (0, 1)]
    feeds = {0: [[128] * 4, [100, 60, 30, 10], [128, 64, 32, 16]], 1: [[128] * 4, [50] * 4, [90]]}
    for r, rec in enumerate(recorder):
        rec.windows = ()
        rec.train_begin()
        for lengths in feeds[r]:
            rec.add_batch(sum(lengths), len(lengths) * max(lengths), lengths)
            rec.step_end()
    figures, record, notes = _figures(
        model, [rec.stats for rec in recorder], tps=1000.0, device="NVIDIA H100 80GB HBM3"
    )
    measured = [x for r in (0, 1) for step in feeds[r][1:] for x in step]  # warmup 1 left out
    assert record["rows"] == 13 == len(measured)
    assert record["attention_length"] == pytest.approx(sum(x * x for x in measured) / sum(measured))
    expected = estimate_flops(
        model, SequenceLengths.of(measured), Recomputed()
    ).model_flops_per_token
    assert figures["flops_per_token"] == pytest.approx(expected)
    assert figures["peak_tflops_per_device"] == 989.4 and figures["mfu_precision"] == "bf16"
    assert figures["mfu"] == pytest.approx(expected * 1000 / 1e12 / 989.4)
    assert notes == []
    # an impossible peak: the MFU is withheld with an error note
    figures, _, notes = _figures(
        model, [rec.stats for rec in recorder], tps=1000.0, device=None, peak=1e-9
    )
    assert figures["mfu"] is None and notes[0].startswith("error: MFU computed as")
    # sft with a prompt mask: TRL's fused head skips the prompt, the figure counts it: a note
    head = model.get_output_embeddings().weight.numel()
    figures, _, notes = _figures(
        model,
        [rec.stats for rec in recorder],
        tps=1000.0,
        device=None,
        backend="sft",
        completion_only_loss=True,
    )
    assert figures["flops_per_token"] == pytest.approx(expected)
    (note,) = notes
    assert "overstated" in note and f"{6 * head / expected:.1%}" in note
    # unrecorded lengths: packed rows are max_seq_len long; unpacked ones are unknown
    empty = [RankStats(0, step_times_s=[1.0] * 3, step_tokens=[0] * 3, step_padded_tokens=[0] * 3)]
    figures, _, _ = _figures(model, empty, tps=None, device=None, packing=True)
    assert (
        figures["flops_per_token"] == estimate_flops(model, SEQ, Recomputed()).model_flops_per_token
    )
    figures, _, notes = _figures(model, empty, tps=None, device="NVIDIA A10G")
    assert figures["flops_per_token"] is None and figures["mfu"] is None
    assert "sequence lengths were not recorded" in notes[0]
    assert "no peak is known for device 'NVIDIA A10G'" in notes[1]
