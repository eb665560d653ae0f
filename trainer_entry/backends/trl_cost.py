"""What TRL's per-step entropy and token accuracy cost an ``sft`` run, measured after training.

``SFTTrainer`` computes both for every micro-batch in its fused LM head (TRL
offers no setting to turn them off), so they are inside every ``sft`` figure.
After training, on rank 0, the fused head is timed on the run's own LM head
with hidden states the size of one micro-batch, alternately with and without
those two outputs: the forward and the backward to the hidden states, which is
where they differ (the weight gradient is the same either way and is left
out). The difference, times the micro-batches of a step, is what they cost a
step. Not in that figure: the four gathers and two device-to-host syncs TRL
makes per micro-batch to log them.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

#: the fused head's outputs with the metrics, and without
WITH_METRICS = ("log_probs", "entropy", "is_top1")
WITHOUT_METRICS = ("log_probs",)
#: timed runs of each variant, alternated (after one untimed run of each)
REPEATS = 5


@dataclass(frozen=True)
class MetricsCost:
    """Seconds of one micro-batch's fused head, median of ``REPEATS``, with and without."""

    with_metrics_s: float
    without_metrics_s: float
    tokens: int
    #: the wider of the two variants' ranges (max - min): the timing's own noise
    spread_s: float = 0.0

    @property
    def per_micro_batch_s(self) -> float:
        return self.with_metrics_s - self.without_metrics_s


def _head_weight(model: Any) -> torch.Tensor | None:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    head = base.get_output_embeddings() if hasattr(base, "get_output_embeddings") else None
    weight = getattr(head, "weight", None)
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or weight.numel() == 0:
        return None  # no head, or a shard (ZeRO-3 leaves an empty tensor)
    if type(weight).__name__ == "DTensor" or hasattr(weight, "_local_tensor"):
        return None  # FSDP2's shard
    if hasattr(weight, "ds_id") or hasattr(weight, "ds_status"):
        return None  # a ZeRO-3 parameter: partitioned, gathered only inside its hooks
    return weight


def measure(
    model: Any,
    tokens: int,
    *,
    autocast: Callable[[], Any],
    sync: Callable[[], None] | None,
) -> MetricsCost | str:
    """The fused head timed on ``tokens`` positions with and without the metrics, or why
    it could not be (a line)."""
    try:
        from trl.kernels import ChunkedLogProbFunction
        from trl.trainer import utils as trl_utils
    except ImportError as exc:
        return f"TRL's fused LM head is not importable here ({exc})"
    chunk = getattr(trl_utils, "_CHUNKED_LOGPROB_CHUNK_SIZE", None)
    weight = _head_weight(model)
    if weight is None:
        return "the LM head is sharded or absent on rank 0"
    if chunk is None or tokens <= 0:
        return "TRL's fused head has no chunk size this tunematrix knows"
    weight = weight.detach()
    generator = torch.Generator(device=weight.device).manual_seed(0)
    hidden = torch.randn(
        tokens, weight.shape[1], device=weight.device, dtype=weight.dtype, generator=generator
    )
    targets = torch.randint(
        0, weight.shape[0], (tokens,), device=weight.device, generator=generator
    )

    def once(outputs: tuple[str, ...]) -> float:
        h = hidden.detach().requires_grad_(True)
        if sync:
            sync()
        t = time.perf_counter()
        with autocast():
            log_probs = ChunkedLogProbFunction.apply(
                h, weight, None, targets, 1.0, chunk, None, 1.0, outputs
            )[0]
        log_probs.sum().backward()
        if sync:
            sync()
        return time.perf_counter() - t

    try:
        for outputs in (WITH_METRICS, WITHOUT_METRICS):  # untimed: first-call costs
            once(outputs)
        times: dict[tuple[str, ...], list[float]] = {WITH_METRICS: [], WITHOUT_METRICS: []}
        for i in range(2 * REPEATS):
            outputs = WITH_METRICS if i % 2 == 0 else WITHOUT_METRICS
            times[outputs].append(once(outputs))
    except Exception as exc:  # a measurement after training never fails the finished run
        return f"TRL's fused head could not be timed ({type(exc).__name__}: {exc})"
    return MetricsCost(
        with_metrics_s=statistics.median(times[WITH_METRICS]),
        without_metrics_s=statistics.median(times[WITHOUT_METRICS]),
        tokens=tokens,
        spread_s=max(max(t) - min(t) for t in times.values()),
    )


def cost_note(cost: MetricsCost | str, *, micro_batches: int, step_time_s: float | None) -> str:
    """The row's line on what TRL's per-step metrics cost."""
    if isinstance(cost, str):
        return f"TRL's per-step entropy and token accuracy: cost not measured: {cost}"
    per_step = cost.per_micro_batch_s * micro_batches
    how = (
        f"(its fused LM head timed after training on {cost.tokens} positions, median of "
        f"{REPEATS}: {cost.with_metrics_s * 1e3:.1f} ms with them, "
        f"{cost.without_metrics_s * 1e3:.1f} ms without, runs spread over "
        f"{cost.spread_s * 1e3:.1f} ms; × {micro_batches} micro-batch"
        f"{'es' if micro_batches != 1 else ''} a step; the syncs TRL makes to log them are not "
        "in it)"
    )
    if abs(cost.per_micro_batch_s) <= cost.spread_s:
        return f"TRL's per-step entropy and token accuracy cost less than the timing's noise {how}"
    share = f", {per_step / step_time_s:.1%} of the median step" if step_time_s else ""
    return (
        f"TRL's per-step entropy and token accuracy cost {per_step * 1e3:.1f} ms a step{share} "
        + how
    )
