"""Analytic FLOPs per token of a training step, and MFU against a peak table.

Counted per token, for a decoder with ``L`` layers, attention width ``d_attn``
(heads × head dim) and sequence length ``s``:

- every linear layer (``in × out`` weight): forward ``2·in·out``; backward
  ``2·in·out`` for the input gradient, plus ``2·in·out`` for the weight
  gradient only when the weight is trained. So full fine-tuning costs
  ``6·N``, and LoRA costs ``4·N`` for the frozen weights (forward and input
  gradient, no weight gradient) plus ``6·N`` for the adapters;
- attention scores and mixing: forward ``4·s·d_attn`` per layer (QKᵀ and
  AV), backward twice that. Counted over the full ``s × s`` square, as
  PyTorch's FLOP counter and most MFU reports do, although a causal kernel
  may skip the masked half;
- embeddings, norms, activations, softmax and the optimizer are left out
  (memory-bound, small next to the matrix products).

This is the model FLOPs figure MFU is based on. With activation
checkpointing the hardware also recomputes each decoder layer's forward;
that is reported separately (``hardware_flops_per_token``) and not counted
as useful work.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

#: Dense peak TFLOP/s per device, by the exact name ``torch.cuda.get_device_name()``
#: reports: (bf16/fp16 tensor cores, fp32 without TF32). Sparsity figures are
#: not used. An unknown device gets no MFU rather than a guess.
PEAK_TFLOPS: dict[str, tuple[float, float]] = {
    "NVIDIA A100-SXM4-80GB": (312.0, 19.5),
    "NVIDIA A100-SXM4-40GB": (312.0, 19.5),
    "NVIDIA A100-PCIE-40GB": (312.0, 19.5),
    "NVIDIA A100 80GB PCIe": (312.0, 19.5),
    "NVIDIA H100 80GB HBM3": (989.4, 66.9),  # H100 SXM
    "NVIDIA H100 PCIe": (756.5, 51.2),
    "NVIDIA H100 NVL": (835.5, 60.0),
    "NVIDIA H200": (989.4, 66.9),
    "NVIDIA L4": (121.0, 30.3),
    "NVIDIA L40S": (362.05, 91.6),
    "NVIDIA A10G": (125.0, 31.2),
    "AMD Instinct MI300X": (1307.4, 163.4),
}


@dataclass(frozen=True)
class FlopsEstimate:
    #: useful model FLOPs per token of a training step (forward + backward)
    model_flops_per_token: float
    #: including the forward recomputed by activation checkpointing
    hardware_flops_per_token: float
    linear_forward: float
    linear_input_grad: float
    linear_weight_grad: float
    attention: float
    recompute: float


def _decoder_layer_linears(model: Any) -> set[int]:
    """ids of the linear layers inside decoder blocks (what checkpointing recomputes)."""
    classes: set[str] = set()
    for module in model.modules():
        classes.update(getattr(module, "_no_split_modules", None) or [])
    inside: set[int] = set()
    for module in model.modules():
        if type(module).__name__ in classes:
            inside.update(id(m) for m in module.modules() if isinstance(m, torch.nn.Linear))
    return inside


def _attention_shape(config: Any) -> tuple[int, int]:
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    layers = int(config.num_hidden_layers)
    heads = int(config.num_attention_heads)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return layers, heads * int(head_dim)


def estimate_flops(model: Any, seq_len: float, activation_checkpointing: bool) -> FlopsEstimate:
    """FLOPs per token of one training step of ``model`` at sequence length ``seq_len``."""
    in_layers = _decoder_layer_linears(model) if activation_checkpointing else set()
    fwd = input_grad = weight_grad = recompute = 0.0
    for module in model.modules():
        if not isinstance(module, torch.nn.Linear):
            continue
        f = 2.0 * module.in_features * module.out_features
        fwd += f
        input_grad += f
        if module.weight.requires_grad:
            weight_grad += f
        if id(module) in in_layers:
            recompute += f
    layers, d_attn = _attention_shape(model.config)
    attn_fwd = 4.0 * seq_len * d_attn * layers
    attention = 3.0 * attn_fwd  # forward + backward (twice the forward)
    if activation_checkpointing:
        recompute += attn_fwd
    model_flops = fwd + input_grad + weight_grad + attention
    return FlopsEstimate(
        model_flops_per_token=model_flops,
        hardware_flops_per_token=model_flops + recompute,
        linear_forward=fwd,
        linear_input_grad=input_grad,
        linear_weight_grad=weight_grad,
        attention=attention,
        recompute=recompute,
    )


def peak_tflops(device_name: str | None, half_precision: bool) -> float | None:
    """The device's dense peak for the precision its matrix products run in; None if unknown."""
    if device_name is None:
        return None
    peaks = PEAK_TFLOPS.get(device_name)
    if peaks is None:
        return None
    return peaks[0] if half_precision else peaks[1]
