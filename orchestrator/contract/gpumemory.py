"""A cell's predicted GPU memory, and what it means against a device's.

The child predicts the peak of torch's allocation of one training step on the
cell's busiest rank (``trainer_entry.run.memoryplan``: the step on fake
tensors), with what holds it (``terms``). What NVML will show is beyond it:

- the caching allocator's headroom (reserved less allocated): a block freed
  in the step is kept for reuse, and a later, larger request cannot always
  reuse it. Predicted as the larger of ``HEADROOM_SHARE`` of the peak and the
  step's largest single tensor. On an H100, for Llama 3.2 1B (8 × 2048
  tokens, bf16): 8.6 GB over 34.0 allocated where the largest tensor (the
  fp32 logits) was 8.4 GB, 0.6 over 12.3 where it was 1.1 (TRL's fused loss),
  2.9 over 34.6 under FSDP (predicted 8.4: the allocator reused better);
- the CUDA context and the libraries' workspaces, outside torch's allocator:
  ``CUDA_CONTEXT_BYTES`` (1.40 GB on that H100 with torch 2.11, all three
  cells).

A cell is certain to run out of the device's memory (``over``, pruned before
launch) when what the prediction counts from the parameters (weights,
gradients, optimizer states) and what the step makes, less ``OVER_MARGIN`` (the
most a prediction was over a measurement), exceed it. The predecessor's A100
table decides it: Llama-2-70B LoRA on 2 GPUs at batch 2, predicted 91.2 GB of
which 72.5 GB weights, ran out of 80 GiB; a flat 15% on the whole peak launched it. One whose predicted NVML peak reaches
``CLOSE_SHARE`` of the device's is ``close``: flagged, and launched.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from orchestrator.contract.devices import GIB

#: reserved beyond allocated, at least this share of the peak
HEADROOM_SHARE = 0.05
#: what the CUDA context and the libraries' workspaces take outside torch's allocator
CUDA_CONTEXT_BYTES = int(1.40e9)
#: the most a prediction's made terms (activations, logits, the backward's and the
#: optimizer step's temporaries) have been over a measurement: a cell whose counted terms
#: and made terms less this exceed the device's memory is certain to run out of it
OVER_MARGIN = 0.15
#: the terms counted from the parameters, exact but for sharding's gathered block
COUNTED = ("weights", "gradients", "optimizer states")
#: a predicted NVML peak at this share of the device's memory or more is close to it
CLOSE_SHARE = 0.90
#: where prediction and measurement differ by more than this, summary.md says so
TOLERANCE = 0.15
#: what a predicted NVML figure marked ``≥`` means (FSDP over several GPUs)
NVML_LOWER_BOUND = (
    "≥: under FSDP over several GPUs the predicted NVML figure is a lower bound: FSDP's caching "
    "allocator reserves far above its allocated peak (nvidia-smi showed 56.2 GB against "
    "36.2 GB allocated for Mistral-7B on 2 A100s), by an amount no formula here predicts"
)


def nvml_text(prediction_bytes: float | None, lower_bound: bool) -> str:
    """A predicted NVML figure, ``≥``-marked where it is a lower bound."""
    if prediction_bytes is None:
        return "-"
    return ("≥ " if lower_bound else "") + gb(prediction_bytes)


#: the terms of a prediction, in the order they are shown
TERMS = (
    "weights",
    "gradients",
    "optimizer states",
    "activations",
    "logits and loss",
    "backward",
    "optimizer step",
)

Verdict = Literal["fits", "close", "over"]


def gb(value: float) -> str:
    """Bytes as GB to one decimal (``34.0 GB``), the unit summary.md and the plan use;
    under 1 GB, as MB (``432 MB``: a tiny model's)."""
    if abs(value) < 1e9:
        return f"{value / 1e6:.0f} MB"
    return f"{value / 1e9:.1f} GB"


def part_of(part: float, whole: float) -> str:
    """``25.2 of 34.0 GB``; ``96 MB of 1.2 GB`` where the units differ."""
    if (abs(part) < 1e9) == (abs(whole) < 1e9):
        return f"{gb(part).split()[0]} of {gb(whole)}"
    return f"{gb(part)} of {gb(whole)}"


@dataclass(frozen=True)
class MemoryPrediction:
    """One cell's prediction (the child's answer), or why there is none (``error``)."""

    #: torch's peak allocation of a training step on the busiest rank
    peak_bytes: int | None = None
    terms: Mapping[str, int] = field(default_factory=dict)
    #: the largest single tensor the step made
    largest_block: int = 0
    #: what formulas stood in for where the CPU could not run the GPU's way
    formulas: tuple[str, ...] = ()
    seconds: float | None = None
    error: str | None = None
    #: why the check refused the cell before launch (then it has no prediction)
    refused: str | None = None
    #: NVML's figure is a lower bound (``NVML_LOWER_BOUND``)
    nvml_lower_bound: bool = False

    @classmethod
    def from_answer(cls, answer: Mapping[str, Any]) -> MemoryPrediction:
        if answer.get("error") or answer.get("peak_bytes") is None:
            return cls(error=str(answer.get("error") or "no prediction"))
        return cls(
            peak_bytes=int(answer["peak_bytes"]),
            terms={str(k): int(v) for k, v in (answer.get("terms") or {}).items()},
            largest_block=int(answer.get("largest_block") or 0),
            formulas=tuple(answer.get("formulas") or ()),
            seconds=answer.get("seconds"),
            nvml_lower_bound=bool(answer.get("nvml_lower_bound")),
        )

    def as_answer(self) -> dict[str, Any]:
        if self.peak_bytes is None:
            return {"error": self.error}
        return {
            "peak_bytes": self.peak_bytes,
            "terms": dict(self.terms),
            "largest_block": self.largest_block,
            "formulas": list(self.formulas),
            "seconds": self.seconds,
            "nvml_lower_bound": self.nvml_lower_bound,
        }

    @property
    def reserved_bytes(self) -> int | None:
        """torch's predicted peak reserved: the peak and the allocator's headroom."""
        if self.peak_bytes is None:
            return None
        return self.peak_bytes + max(int(HEADROOM_SHARE * self.peak_bytes), self.largest_block)

    @property
    def nvml_bytes(self) -> int | None:
        """What NVML will show at the peak: reserved and the CUDA context."""
        reserved = self.reserved_bytes
        return None if reserved is None else reserved + CUDA_CONTEXT_BYTES

    def largest_term(self) -> tuple[str, int] | None:
        if not self.terms:
            return None
        name = max(self.terms, key=lambda k: self.terms[k])
        return name, self.terms[name]

    def largest_line(self) -> str:
        """``logits and loss: 25.2 of 34.0 GB``."""
        term = self.largest_term()
        if term is None or self.peak_bytes is None:
            return ""
        return f"{term[0]}: {part_of(term[1], self.peak_bytes)}"

    @property
    def least_bytes(self) -> int:
        """The least torch peak the prediction allows: its counted terms (weights,
        gradients, optimizer states: parameters times their bytes) as they are, the rest
        (what the step makes) less ``OVER_MARGIN``, the most the prediction has been over
        a measurement."""
        counted = sum(self.terms.get(term, 0) for term in COUNTED)
        made = max(0, (self.peak_bytes or 0) - counted)
        return counted + int(made / (1 + OVER_MARGIN))

    def verdict(self, capacity_bytes: float | None) -> Verdict | None:
        """Against one device's memory: ``over`` (certain to run out), ``close``, ``fits``;
        None without a prediction or a capacity."""
        if self.peak_bytes is None or not capacity_bytes:
            return None
        if self.least_bytes > capacity_bytes:
            return "over"
        if (self.nvml_bytes or 0) >= CLOSE_SHARE * capacity_bytes:
            return "close"
        return "fits"

    def pruned_reason(self, capacity_bytes: float) -> str:
        """Why the cell is not launched (after ``pruned: ``)."""
        return (
            f"predicted to need {gb(self.peak_bytes or 0)} of torch memory on its busiest "
            f"GPU, over the device's {capacity_bytes / GIB:.0f} GiB "
            f"({self.largest_line()}); --no-prune launches it"
        )


@dataclass(frozen=True)
class MemoryVerdict:
    """A cell's prediction against the memory of the device it is planned for."""

    prediction: MemoryPrediction
    #: one device's memory, bytes (None: not known here)
    capacity_bytes: float | None = None
    #: where the capacity came from (``--gpu-memory-gib 80``, ``this machine's NVIDIA H100``)
    capacity_source: str = ""
    #: the predicted batch is the one that runs: packed (full blocks) or of a fixed shape.
    #: False: unpacked text, padded to its longest row, which may be shorter than the
    #: full-length rows predicted: an ``over`` cell may still fit, and is launched
    certain: bool = True

    @property
    def verdict(self) -> Verdict | None:
        return self.prediction.verdict(self.capacity_bytes)

    @property
    def prunes(self) -> bool:
        """Over the device's memory by the margin, and certain to be: not launched."""
        return self.verdict == "over" and self.certain

    def row(self) -> dict[str, Any]:
        """The plan's columns (``plan --memory --output``, ``memory_plan.json``)."""
        p = self.prediction
        largest = p.largest_term()
        return {
            "predicted_peak_bytes": p.peak_bytes,
            "predicted_reserved_bytes": p.reserved_bytes,
            "predicted_nvml_bytes": p.nvml_bytes,
            "predicted_largest_term": largest[0] if largest else None,
            "predicted_largest_term_bytes": largest[1] if largest else None,
            "device_memory_bytes": int(self.capacity_bytes) if self.capacity_bytes else None,
            "memory_verdict": self.verdict,
            "memory_prediction_error": p.error,
            "predicted_nvml_lower_bound": p.nvml_lower_bound or None,
        }
