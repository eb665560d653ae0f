"""Analytic FLOPs per token of a training step, and MFU against a peak table.

Definitions (all per real token, i.e. padding excluded, of one optimizer step):

- **Weight matrices.** Every linear layer (``in × out`` weight; GPT-2's
  ``Conv1D`` is one, transposed) costs forward ``2·in·out``; backward
  ``2·in·out`` for the input gradient, plus ``2·in·out`` for the weight
  gradient only when the weight is trained. So full fine-tuning costs
  ``6·N`` and LoRA ``4·N`` for the frozen weights plus ``6·N`` for the
  adapters. With PEFT's ``modules_to_save`` only the copy that runs (the
  trainable one) is counted, not the frozen original it keeps beside it.
  The input gradient of the first layer's projections is counted although
  nothing below them needs it when the embeddings are frozen (LoRA): the
  estimate is up to ~5% above PyTorch's FLOP counter on tiny models, less
  on real ones.
- **Once per sample.** A module the task runs on one position per sample
  (a classifier head after pooling: ``trainer_entry.tasks``) costs its
  ``2·in·out`` once per sequence, not once per token; per token that is the
  cost times rows over tokens.
- **Convolutions** (a ViT's patch embedding) cost ``2·numel(weight)`` per
  output position, one position per token (a patch is a token; the class
  token, which has none, is counted too: 1/197 of the convolution on
  ViT-B/16). A 2-D convolution reads pixels: no input gradient, and it is not
  recomputed under activation checkpointing.
- **Mixture of experts.** Experts stored as 3-D weights (``gate_up_proj``,
  ``down_proj``: one matrix per expert) are counted for the experts a token
  is routed to: ``num_experts_per_tok`` times each expert's matrices. The
  router (``hidden × num_experts``) is counted for every token. Shared
  experts are ordinary linear layers and counted as such. A 3-D weight the
  formula does not recognise, or an attention layer type other than full or
  sliding, gives no FLOPs figure (``FlopsUnavailable``) rather than a wrong one.
- **Attention.** Scores and mixing cost forward ``4·d_attn·L`` per token and
  layer (QKᵀ and AV; ``d_attn`` = query heads × head dim), backward twice
  that, where ``L`` is the number of keys a token's row of the score matrix
  spans: for a sequence of ``r`` real tokens ``L = r`` (the full ``r × r``
  square, as PyTorch's FLOP counter and most MFU reports count it, although
  a causal kernel may skip the masked half), capped at the window ``w`` on
  sliding-window layers (``L = min(r, w)``). Averaged over the real tokens of
  the run, ``L = Σ r·min(r, w) / Σ r``, which is ``Σ r² / Σ r`` without a
  window — not the padded batch width. Packed data (``trainer_entry.data.tokenize``)
  keeps no document boundaries (no per-document position ids or
  ``cu_seqlens``), so a packed row attends across its documents and ``r``
  is the row length.
- Embeddings, norms, activations, softmax, the loss and the optimizer are
  left out (memory-bound, small next to the matrix products).

This is the model FLOPs figure MFU is based on. With activation
checkpointing the hardware also reruns part of each checkpointed block's
forward inside the backward; that is reported separately
(``hardware_flops_per_token``) and not counted as useful work. What was rerun
is not assumed: the run watched its first step (``trainer_entry.measure.recompute``),
and the recompute is the forward FLOPs above of each weight matrix, and each
layer's attention core, in the share of their forwards that ran again.

MFU is achieved model FLOP/s per device over the device's dense peak for the
precision the matrix products run in: FP8 when FP8 training is on
(accelerate ``mixed_precision: fp8``), bf16/fp16 when the weights or the
autocast are half precision, TF32 when fp32 matrix products are allowed to
run in TF32 (``tf32: true``, or ``torch.backends.cuda.matmul.fp32_precision``
is ``tf32``), plain fp32 otherwise. A device or precision without a known
peak gets no MFU (``peak_tflops_per_device`` in the scenario's arguments sets
one), and an MFU above 1 is reported as an error, not a number.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

# one table of devices, their peaks and memory (orchestrator/contract/devices.py)
from orchestrator.contract.devices import PEAK_TFLOPS, ComputeMode, DevicePeaks
from trainer_entry.measure.recompute import Recomputed
from trainer_entry.measure.steps import SequenceLengths

__all__ = ["PEAK_TFLOPS", "ComputeMode", "DevicePeaks"]


class FlopsUnavailable(ValueError):
    """The model has a part the formula does not understand; no figure rather than a wrong one."""


@dataclass(frozen=True)
class FlopsEstimate:
    #: useful model FLOPs per token of a training step (forward + backward)
    model_flops_per_token: float
    #: including the forward rerun by activation checkpointing; None: what was rerun
    #: was not seen
    hardware_flops_per_token: float | None
    linear_forward: float
    linear_input_grad: float
    linear_weight_grad: float
    attention: float
    recompute: float | None
    #: why there is no hardware figure
    hardware_note: str | None = None


@dataclass(frozen=True)
class _Matmul:
    """One weight matrix product, per token."""

    module: torch.nn.Module
    forward: float
    trained: bool
    #: runs once per sample (a pooled classifier head), not once per token
    per_sample: bool = False
    #: its input needs a gradient (not so for a convolution over pixels)
    input_grad: bool = True
    #: can be rerun by activation checkpointing (a convolution over pixels is
    #: outside the blocks)
    recomputed: bool = True
    #: one product per call (a linear layer), not several (a module of experts)
    single: bool = True


def _config_field(config: Any, name: str) -> Any:
    """A field the attention formula reads; a config of a model's own may lack it."""
    value = getattr(config, name, None)
    if value is None:
        raise FlopsUnavailable(
            f"the model's config ({type(config).__name__}) has no {name}, "
            "which the attention formula reads"
        )
    return value


def _text_config(config: Any) -> Any:
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def _idle_copies(model: Any) -> set[int]:
    """ids of modules PEFT keeps but does not run: the other side of ``modules_to_save``.

    A ``ModulesToSaveWrapper`` holds the frozen ``original_module`` and a trainable
    copy per adapter; the forward runs the active adapter's copy (or the original
    when adapters are disabled), never both.
    """
    idle: set[int] = set()
    for module in model.modules():
        copies = getattr(module, "modules_to_save", None)
        original = getattr(module, "original_module", None)
        if not isinstance(copies, torch.nn.ModuleDict) or not isinstance(original, torch.nn.Module):
            continue
        active = [] if getattr(module, "disable_adapters", False) else module.active_adapters
        running = next((copies[a] for a in active if a in copies), original)
        for candidate in [original, *copies.values()]:
            if candidate is not running:
                idle.update(id(m) for m in candidate.modules())
    return idle


def _experts_per_token(model: Any) -> int | None:
    value = getattr(_text_config(model.config), "num_experts_per_tok", None)
    if value:
        return int(value)
    for module in model.modules():
        if isinstance(getattr(module, "top_k", None), int) and hasattr(module, "num_experts"):
            return int(module.top_k)
    return None


def _matmuls(model: Any, per_sample: set[int] | frozenset[int] = frozenset()) -> list[_Matmul]:
    """Every weight matrix product of a forward pass, with its FLOPs per token
    (per sample for the modules in ``per_sample``, and those inside them)."""
    from transformers.pytorch_utils import Conv1D

    idle = _idle_copies(model)
    once: set[int] = set()
    for module in model.modules():
        if id(module) in per_sample:
            once.update(id(inner) for inner in module.modules())
    top_k: int | None = None
    out: list[_Matmul] = []
    for name, module in model.named_modules():
        if id(module) in idle:
            continue
        if isinstance(module, torch.nn.Linear):
            f = 2.0 * module.in_features * module.out_features
            out.append(_Matmul(module, f, module.weight.requires_grad, id(module) in once))
            continue
        if isinstance(module, Conv1D):  # GPT-2's linear layer, its weight transposed
            out.append(
                _Matmul(
                    module,
                    2.0 * module.weight.numel(),
                    module.weight.requires_grad,
                    id(module) in once,
                )
            )
            continue
        if isinstance(module, torch.nn.modules.conv._ConvNd):
            # one output position per token: a ViT's patch embedding (a patch is a token).
            # A 2-D convolution reads pixels, which need no gradient; it is not in the
            # checkpointed blocks either
            pixels = module.weight.ndim == 4
            out.append(
                _Matmul(
                    module,
                    2.0 * module.weight.numel(),
                    module.weight.requires_grad,
                    input_grad=not pixels,
                    recomputed=not pixels,
                )
            )
            continue
        params = dict(module.named_parameters(recurse=False))
        # a leading 1 is a table added to the sequence (a ViT's class token and
        # position embeddings), not one matrix per expert
        stacked = {n: p for n, p in params.items() if p.ndim == 3 and p.shape[0] > 1}
        n_experts = getattr(module, "num_experts", None)
        if stacked:
            if not isinstance(n_experts, int) or any(
                p.shape[0] != n_experts for p in stacked.values()
            ):
                raise FlopsUnavailable(
                    f"module '{name}' ({type(module).__name__}) has 3-D weights "
                    f"({', '.join(stacked)}) that are not recognised mixture-of-experts weights"
                )
            top_k = top_k or _experts_per_token(model)
            if top_k is None:
                raise FlopsUnavailable(
                    f"module '{name}' holds {n_experts} experts, but the model's config "
                    "does not say how many a token is routed to (num_experts_per_tok)"
                )
            for p in stacked.values():
                # one expert's matrix, for each of the top-k experts a token visits
                f = 2.0 * p.numel() / n_experts * top_k
                out.append(_Matmul(module, f, p.requires_grad, single=False))
            continue
        weight = params.get("weight")
        if (
            weight is not None
            and weight.ndim == 2
            and isinstance(n_experts, int)
            and weight.shape[0] == n_experts
            and hasattr(module, "top_k")
        ):
            # a router that is not an nn.Linear: hidden -> expert logits, every token
            out.append(_Matmul(module, 2.0 * weight.numel(), weight.requires_grad))
    return out


def matmul_modules(model: Any) -> list[torch.nn.Module]:
    """The modules whose weight products the FLOPs count (what ``RecomputeWatch`` watches);
    raises ``FlopsUnavailable`` as ``estimate_flops`` would."""
    return list({id(mm.module): mm.module for mm in _matmuls(model)}.values())


def attention_windows(model: Any) -> list[int | None]:
    """Each attention layer's sliding window (None: the whole sequence)."""
    config = _text_config(model.config)
    layers = int(_config_field(config, "num_hidden_layers"))
    window = getattr(config, "sliding_window", None) or None
    types = getattr(config, "layer_types", None)
    if types is None:
        # no per-layer types: a model-wide sliding_window applies to every layer
        # (Mistral, Mixtral, Phi-3 pass it to every attention call)
        return [int(window) if window else None] * layers
    windows: list[int | None] = []
    for kind in types:
        if kind == "full_attention":
            windows.append(None)
        elif kind == "sliding_attention":
            windows.append(int(window) if window else None)
        else:
            raise FlopsUnavailable(
                f"attention layer type '{kind}' is not in the formula "
                "(only full_attention and sliding_attention are)"
            )
    return windows


def sliding_windows(model: Any) -> tuple[int, ...]:
    """The distinct sliding windows of the model's layers (what the recorder must track)."""
    return tuple(sorted({w for w in attention_windows(model) if w is not None}))


def _attention_width(config: Any) -> int:
    config = _text_config(config)
    heads = int(_config_field(config, "num_attention_heads"))
    head_dim = getattr(config, "head_dim", None) or _config_field(config, "hidden_size") // heads
    return heads * int(head_dim)


def estimate_flops(
    model: Any,
    sequences: SequenceLengths | float,
    recomputed: Recomputed | None,
    per_sample: set[int] | frozenset[int] = frozenset(),
) -> FlopsEstimate:
    """FLOPs per real token of one training step of ``model`` on ``sequences``.

    ``sequences`` is the length statistics of what was fed, or one number for
    sequences all that long. ``recomputed``: what activation checkpointing ran
    again (``RecomputeWatch``; ``Recomputed()`` for nothing), None where that was
    not seen (no hardware figure then). ``per_sample``: ids of the modules that run
    once per sample (``Task.per_sample_modules``). Raises ``FlopsUnavailable`` for a
    model part the formula does not cover.
    """
    if not isinstance(sequences, SequenceLengths):
        sequences = SequenceLengths.uniform(round(sequences))
    samples_per_token = sequences.rows / sequences.tokens if sequences.tokens else 0.0
    fwd = input_grad = weight_grad = rerun = 0.0
    for mm in _matmuls(model, per_sample):
        f = mm.forward * samples_per_token if mm.per_sample else mm.forward
        fwd += f
        if mm.input_grad:
            input_grad += f
        if mm.trained:
            weight_grad += f
        if mm.recomputed and recomputed is not None:
            rerun += f * recomputed.share(mm.module, single=mm.single)
    d_attn = _attention_width(model.config)
    try:
        per_layer = [4.0 * d_attn * sequences.attention_length(w) for w in attention_windows(model)]
    except KeyError as exc:
        raise FlopsUnavailable(str(exc.args[0])) from None
    attn_fwd = sum(per_layer)
    attention = 3.0 * attn_fwd  # forward + backward (twice the forward)
    model_flops = fwd + input_grad + weight_grad + attention
    recompute, why = None, None
    attention_rerun = (
        _attention_rerun(per_layer, recomputed.attention) if recomputed is not None else None
    )
    if recomputed is None:
        why = "what activation checkpointing ran again was not seen"
    elif recomputed.checkpointed and attn_fwd and attention_rerun is None:
        why = (
            f"activation checkpointing ran weight matrices again, but the model's "
            f"{len(recomputed.attention)} attention module(s) (named …Attention) are not its "
            f"{len(per_layer)} layers, to tell which layers' attention ran again"
        )
    else:
        recompute = rerun + (attention_rerun or 0.0)
    return FlopsEstimate(
        model_flops_per_token=model_flops,
        hardware_flops_per_token=None if recompute is None else model_flops + recompute,
        linear_forward=fwd,
        linear_input_grad=input_grad,
        linear_weight_grad=weight_grad,
        attention=attention,
        recompute=recompute,
        hardware_note=why,
    )


def _attention_rerun(per_layer: list[float], shares: tuple[float, ...]) -> float | None:
    """The attention cores' forward FLOPs run again, layer by layer; None where the
    model's attention modules are not its layers one to one (a vision tower's, a
    decoder's cross-attention): which layers ran again is then not known."""
    if len(shares) != len(per_layer):
        return None
    return sum(f * s for f, s in zip(per_layer, shares, strict=True))


def _fp32_matmuls_in_tf32() -> bool:
    matmul = torch.backends.cuda.matmul
    precision = getattr(matmul, "fp32_precision", None)
    if precision is not None:
        # torch >= 2.9; the legacy query raises once the new API has been used
        return str(precision) == "tf32"
    return bool(torch.get_float32_matmul_precision() != "highest")


def compute_mode(
    *, dtype: str | None, mixed_precision: str | None, tf32: bool | None
) -> ComputeMode:
    """The precision the training's matrix products run in.

    ``dtype`` is the model's weights' dtype, ``mixed_precision`` accelerate's
    mode as the Trainer passes it (``TrainingArguments.mixed_precision``:
    ``no``, ``fp16``, ``bf16`` or ``fp8``), ``tf32`` the training argument.
    """
    if mixed_precision == "fp8":
        return "fp8"
    if mixed_precision in ("fp16", "bf16") or dtype in ("bfloat16", "float16"):
        return "bf16"
    if tf32 or (tf32 is None and _fp32_matmuls_in_tf32()):
        return "tf32"
    return "fp32"


def peak_tflops(device_name: str | None, mode: ComputeMode) -> float | None:
    """The device's dense peak for ``mode``; None if the device or the mode has none."""
    if device_name is None:
        return None
    peaks = PEAK_TFLOPS.get(device_name)
    return None if peaks is None else peaks.for_mode(mode)


def peak_note(device_name: str | None, mode: ComputeMode, peak: float | None) -> str | None:
    """Why a GPU run has no MFU (None when it has a peak, or runs on the CPU)."""
    if peak is not None or device_name is None:
        return None
    how = "set peak_tflops_per_device (dense TFLOP/s per device) in the scenario's arguments"
    if device_name not in PEAK_TFLOPS:
        return f"no MFU: no peak is known for device '{device_name}'; {how}"
    return f"no MFU: device '{device_name}' has no {mode} tensor cores in the peak table; {how}"


def utilization(
    flops_per_token: float | None, tokens_per_second_per_device: float | None, peak: float | None
) -> tuple[float | None, float | None, list[str]]:
    """(achieved TFLOP/s per device, MFU, notes). An MFU above 1 is an error, not a figure."""
    if flops_per_token is None or not tokens_per_second_per_device:
        return None, None, []
    achieved = flops_per_token * tokens_per_second_per_device / 1e12
    if not peak:
        return achieved, None, []
    mfu = achieved / peak
    if mfu > 1.0:
        return (
            achieved,
            None,
            [
                f"error: MFU computed as {mfu:.3f} (> 1): {achieved:.1f} achieved TFLOP/s "
                f"against a peak of {peak:g}; the FLOPs count or the peak is wrong, so no MFU "
                "is reported"
            ],
        )
    return achieved, mfu, []


def sequences_or_uniform(
    fed: SequenceLengths | None, *, packing: bool, max_seq_len: int
) -> tuple[SequenceLengths | None, list[str]]:
    """What was fed; without records, packed rows are all ``max_seq_len`` long."""
    if fed is not None:
        return fed, []
    if packing:
        return SequenceLengths.uniform(max_seq_len), []
    return None, ["no FLOPs figure: sequence lengths were not recorded (instrumentation off)"]
