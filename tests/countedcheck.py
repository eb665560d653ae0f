"""The counted FLOPs of a task (``trainer_entry.measure.counted``) against PyTorch's FLOP counter.

The reference runs the real model (eager attention: the CPU's fused attention
kernel is one the counter does not count) on real tensors, one sample per row
with no padding, forward and backward, and sums what the counter saw. The
figure under test is the fit the run makes: counted on the meta device at its
own probe lengths, then applied to the rows' length sums.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

from trainer_entry.measure.counted import CountedFlops, count_flops
from trainer_entry.measure.steps import length_moments


def in_mode(model: Any, task: Any, mode: str, target_modules: Any) -> Any:
    """``model`` as a test of ``mode`` trains it: ``full`` as it is, ``lora`` with rank-8
    adapters on ``target_modules`` (the project's ``apply_peft``), ``checkpointed`` with
    non-reentrant activation checkpointing; in training mode."""
    from trainer_entry.models.load import apply_peft
    from trainer_entry.run.parse import PeftConfig

    if mode == "lora":
        config = PeftConfig(method="lora", r=8, target_modules=target_modules)
        model = apply_peft(model, config, quantized=False, task=task)
    if mode == "checkpointed":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model.train()


def real(batch: Mapping[str, Any], marks: Mapping[str, tuple[int, int]] = {}) -> dict[str, Any]:
    """A probe's meta tensors made real: ones of the same shape and dtype on the CPU.

    ``marks``: input -> (how many leading positions, the id they hold): the values a
    meta probe sets and cannot keep (a vision-language probe's image positions)."""
    out = {
        k: torch.ones(v.shape, dtype=v.dtype) if isinstance(v, torch.Tensor) else v
        for k, v in batch.items()
    }
    for name, (count, value) in marks.items():
        out[name][..., :count] = value
    return out


def counted_step(model: Any, inputs: Mapping[str, Any]) -> float:
    """The FLOPs ``FlopCounterMode`` counts in one training step of ``model`` on ``inputs``
    (real tensors), forward and backward; the gradients are cleared after it."""
    with FlopCounterMode(display=False) as counter:
        model(**inputs).loss.backward()
    model.zero_grad(set_to_none=True)
    return float(counter.get_total_flops())


def counted_over_reference(
    task: Any,
    model: Any,
    rows: Sequence[Mapping[str, int]],
    *,
    checkpointing: bool = False,
    labels: Callable[[Mapping[str, int]], torch.Tensor] | None = None,
    marks: Callable[[Mapping[str, int]], Mapping[str, tuple[int, int]]] | None = None,
) -> float:
    """The run's counted FLOPs for ``rows`` over the counter's sum of one step per row.

    ``labels``: the labels the reference trains on where the probe has none (a CTC
    model's probe backpropagates its logits' mean; the reference runs its real loss).
    ``marks``: a row's leading positions that hold an id (``real``)."""
    dims = task.flop_dims
    typical = {d: sum(r[d] for r in rows) / len(rows) for d in dims}
    counted = count_flops(
        model,
        lambda lengths: task.probe_batch(model.config, lengths),
        typical,
        checkpointing=checkpointing,
    )
    coefficients = counted.hardware if checkpointing else counted.model
    assert coefficients is not None, counted.hardware_note
    moments = length_moments({d: [r[d] for r in rows] for d in dims})
    figure = CountedFlops.total(coefficients, len(rows), moments)
    reference = 0
    for lengths in rows:
        inputs = real(task.probe_batch(model.config, lengths), marks(lengths) if marks else {})
        if "labels" not in inputs and labels is not None:
            inputs["labels"] = labels(lengths)
        reference += counted_step(model, inputs)
    return figure / reference
