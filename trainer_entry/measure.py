"""What a run measures, and the arithmetic that turns it into metrics.

Every rank records, for each optimizer step, its wall time and the real and
padded tokens it fed. A step's time is the interval between consecutive step
ends (the first from the start of training), so the steps partition the
training time and nothing — data loading, logging, the optimizer — falls
between them. On a GPU the device is synchronised at each step end, so the
time is the device's, not the host's.

Throughput is total tokens over total time of the measured steps (the first
``warmup`` steps left out), never a total divided by a per-step mean. Global
throughput sums every rank's tokens over the slowest rank's time; per device
divides it by the number of ranks.
"""

from __future__ import annotations

import math
import os
import resource
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class RankStats:
    rank: int
    pid: int = field(default_factory=os.getpid)
    step_times_s: list[float] = field(default_factory=list)
    step_tokens: list[int] = field(default_factory=list)
    step_padded_tokens: list[int] = field(default_factory=list)
    #: from the start of training to the end of the first step
    first_step_s: float | None = None
    #: wall clock (Unix time) at the end of the first step
    first_step_end_unix: float | None = None
    peak_rss_bytes: int | None = None
    cuda_max_allocated_bytes: int | None = None
    cuda_max_reserved_bytes: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class StepRecorder:
    """Collects per-step figures on one rank; fed by the trainer and a callback."""

    def __init__(
        self,
        rank: int,
        sync: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.stats = RankStats(rank=rank)
        self._sync = sync
        self._clock = clock
        self._real = 0
        self._padded = 0
        self._last: float | None = None
        self._begin: float | None = None

    def add_batch(self, real: int, padded: int) -> None:
        """One micro-batch fed to the model (called from ``training_step``)."""
        self._real += real
        self._padded += padded

    def train_begin(self) -> None:
        if self._sync is not None:
            self._sync()
        self._begin = self._last = self._clock()

    def step_end(self) -> None:
        if self._sync is not None:
            self._sync()
        now = self._clock()
        assert self._last is not None and self._begin is not None, "train_begin was not called"
        self.stats.step_times_s.append(now - self._last)
        if self.stats.first_step_s is None:
            self.stats.first_step_s = now - self._begin
            self.stats.first_step_end_unix = time.time()
        self._last = now
        self.stats.step_tokens.append(self._real)
        self.stats.step_padded_tokens.append(self._padded)
        self._real = self._padded = 0


def peak_rss_bytes() -> int:
    """This process's peak resident set size (Linux reports KiB)."""
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def default_warmup(steps: int) -> int:
    """max(3, 10% of the steps), always leaving at least one step measured."""
    return max(0, min(max(3, math.ceil(0.1 * steps)), steps - 1))


def summarize(ranks: Sequence[RankStats], warmup: int | None = None) -> dict[str, Any]:
    """Throughput and step-time figures from every rank's records."""
    steps = min(len(r.step_times_s) for r in ranks) if ranks else 0
    if steps == 0:
        return {"steps": 0}
    k = default_warmup(steps) if warmup is None else max(0, min(warmup, steps - 1))
    times = [sum(r.step_times_s[k:steps]) for r in ranks]
    tokens = [sum(r.step_tokens[k:steps]) for r in ranks]
    padded = [sum(r.step_padded_tokens[k:steps]) for r in ranks]
    window = max(times)
    world = len(ranks)
    # the slowest rank sets each step's pace
    per_step = [max(r.step_times_s[i] for r in ranks) for i in range(k, steps)]
    mean = statistics.fmean(per_step)
    cv = statistics.pstdev(per_step) / mean if len(per_step) > 1 and mean > 0 else None
    global_tps = sum(tokens) / window if window > 0 else None
    total_real = sum(sum(r.step_tokens[:steps]) for r in ranks)
    total_padded = sum(sum(r.step_padded_tokens[:steps]) for r in ranks)
    return {
        "steps": steps,
        "warmup_steps_excluded": k,
        "steps_measured": steps - k,
        "measured_time_s": window,
        "tokens_measured": sum(tokens),
        "tokens_total": total_real,
        "padded_tokens_total": total_padded,
        "padding_fraction": 1 - sum(tokens) / sum(padded) if sum(padded) else None,
        "tokens_per_second_global": global_tps,
        "tokens_per_second_per_device": global_tps / world if global_tps is not None else None,
        "step_time_median_s": statistics.median(per_step),
        "step_time_mean_s": mean,
        "step_time_cv": cv,
        "step_time_min_s": min(per_step),
        "step_time_max_s": max(per_step),
    }


def loss_summary(log_history: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """First, last and mean-of-the-last-10% training loss from the trainer's log."""
    losses = [
        (int(e["step"]), float(e["loss"])) for e in log_history if "loss" in e and "step" in e
    ]
    if not losses:
        return {
            "loss_first": None,
            "loss_last": None,
            "loss_mean_last10pct": None,
            "loss_history": [],
        }
    tail = losses[-max(1, math.ceil(0.1 * len(losses))) :]
    return {
        "loss_first": losses[0][1],
        "loss_last": losses[-1][1],
        "loss_mean_last10pct": statistics.fmean(v for _, v in tail),
        "loss_history": [[s, v] for s, v in losses],
    }


def hf_stage_memory(metrics: Mapping[str, Any]) -> tuple[int | None, int | None]:
    """(peak, allocated) GPU bytes from HF's stage memory metrics, the predecessor's way.

    Running sum of each stage's allocation delta on top of ``before_init``;
    the peak of a stage is that sum plus the stage's peaked delta. The model
    loading stage before the Trainer (``before_init``) counts as allocated.
    None when the metrics are absent (CPU runs, or memory metrics off).
    """
    stages = ("before_init_mem_gpu", "init_mem_gpu", "train_mem_gpu")
    if not any(k.startswith(stages) for k in metrics):
        return None, None
    running = 0.0
    allocs: list[float] = []
    peaks: list[float] = []
    for stage in stages:
        delta = metrics.get(f"{stage}_alloc_delta", metrics.get(stage, 0)) or 0
        running += float(delta)
        allocs.append(running)
        peaks.append(running + float(metrics.get(f"{stage}_peaked_delta", 0) or 0))
    return int(max(peaks)), int(max(allocs))
