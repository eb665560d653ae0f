"""One training step counted by PyTorch's FLOP counter, beside what the run's own watch sees.

The reference the FLOPs figures are held to: ``FlopCounterMode`` counts every matrix
product a step runs, recomputation included. Alongside, the step is watched as a run
watches its first step (``RecomputeWatch``), and the one thing the model figure counts
that autograd may not run is measured: the input gradient of a weight product whose
input needs none (LoRA without checkpointing: nothing below the first layer trains).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

from trainer_entry.measure.flops import matmul_modules
from trainer_entry.measure.recompute import Recomputed, RecomputeWatch


@dataclass(frozen=True)
class CountedStep:
    #: FLOPs per token the counter saw in the step (forward, backward, recompute)
    counted: float
    #: what the watch saw run again
    recomputed: Recomputed
    #: FLOPs per token of input gradients autograd skipped (inputs needing no gradient)
    skipped_input_grads: float


def counted_step(
    model: Any, ids: torch.Tensor, loss: Callable[[Any, torch.Tensor], Any]
) -> CountedStep:
    """``loss(model, ids).backward()`` once, counted and watched."""
    skipped: list[float] = []

    def record(module: Any, args: Any) -> None:
        if not torch.is_grad_enabled() or torch._C._current_graph_task_id() != -1:
            return  # a reentrant block's first forward, or a recompute
        if isinstance(args[0], torch.Tensor) and not args[0].requires_grad:
            skipped.append(2.0 * module.weight.numel())

    linear = [
        m
        for m in matmul_modules(model)
        if isinstance(m, torch.nn.Linear) or type(m).__name__ == "Conv1D"
    ]
    handles = [m.register_forward_pre_hook(record) for m in linear]
    watch = RecomputeWatch()
    watch.attach(model, matmul_modules(model))
    try:
        with FlopCounterMode(display=False) as counter:
            loss(model, ids).backward()
    finally:
        for handle in handles:
            handle.remove()
        recomputed = watch.detach()
    assert recomputed is not None, watch.unwatched
    return CountedStep(counter.get_total_flops() / ids.numel(), recomputed, sum(skipped))
