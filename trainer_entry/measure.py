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

Each rank also records the lengths of the sequences it fed — rows, real tokens
``Σ r``, ``Σ r²`` and, for each sliding window ``w`` of the model,
``Σ r·min(r, w)`` — which is what attention FLOPs per real token are
computed from (``trainer_entry.flops``).
"""

from __future__ import annotations

import math
import os
import resource
import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from orchestrator.contract.steady import precision_pct
from orchestrator.contract.window import warmup_of


@dataclass
class RankStats:
    rank: int
    pid: int = field(default_factory=os.getpid)
    step_times_s: list[float] = field(default_factory=list)
    step_tokens: list[int] = field(default_factory=list)
    step_padded_tokens: list[int] = field(default_factory=list)
    #: sequences (rows) fed in each step, a short last micro-batch counted as it is
    step_rows: list[int] = field(default_factory=list)
    #: Σ r² over the real lengths r of the rows fed in each step
    step_sq_tokens: list[int] = field(default_factory=list)
    #: sliding window w -> Σ r·min(r, w) for each step
    step_windowed_sq_tokens: dict[int, list[int]] = field(default_factory=dict)
    #: from the start of training to the end of the first step
    first_step_s: float | None = None
    #: wall clock (Unix time) at the end of the first step
    first_step_end_unix: float | None = None
    peak_rss_bytes: int | None = None
    cuda_max_allocated_bytes: int | None = None
    cuda_max_reserved_bytes: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class SequenceLengths:
    """Sums over the real lengths ``r`` of the sequences fed (padding excluded)."""

    rows: int
    #: Σ r
    tokens: int
    #: Σ r²
    sq_tokens: int
    #: sliding window w -> Σ r·min(r, w)
    windowed_sq_tokens: Mapping[int, int] = field(default_factory=dict)
    #: every sequence this long (answers any window)
    uniform_length: int | None = None

    @classmethod
    def uniform(cls, length: int, rows: int = 1) -> SequenceLengths:
        return cls(rows, rows * length, rows * length * length, {}, length)

    @classmethod
    def of(cls, lengths: Iterable[int], windows: Iterable[int] = ()) -> SequenceLengths:
        r = [int(x) for x in lengths]
        return cls(
            rows=len(r),
            tokens=sum(r),
            sq_tokens=sum(x * x for x in r),
            windowed_sq_tokens={w: sum(x * min(x, w) for x in r) for w in windows},
        )

    def attention_length(self, window: int | None) -> float:
        """Keys per real token's score row: ``Σ r·min(r, w) / Σ r`` (``Σ r² / Σ r`` unwindowed)."""
        if self.tokens == 0:
            return 0.0
        if window is None:
            return self.sq_tokens / self.tokens
        if self.uniform_length is not None:
            return float(min(self.uniform_length, window))
        if window not in self.windowed_sq_tokens:
            raise KeyError(f"the sequence lengths were not recorded for sliding window {window}")
        return self.windowed_sq_tokens[window] / self.tokens


def fed_sequences(ranks: Sequence[RankStats], start: int, stop: int) -> SequenceLengths | None:
    """What every rank fed in steps ``start`` to ``stop``; None where nothing was recorded."""
    rows = sum(sum(r.step_rows[start:stop]) for r in ranks)
    tokens = sum(sum(r.step_tokens[start:stop]) for r in ranks)
    if rows == 0 or tokens == 0:
        return None
    windows = {w for r in ranks for w in r.step_windowed_sq_tokens}
    return SequenceLengths(
        rows=rows,
        tokens=tokens,
        sq_tokens=sum(sum(r.step_sq_tokens[start:stop]) for r in ranks),
        windowed_sq_tokens={
            w: sum(sum(r.step_windowed_sq_tokens.get(w, [])[start:stop]) for r in ranks)
            for w in windows
        },
    )


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
        self._rows = 0
        self._sq = 0
        self._windowed: dict[int, int] = {}
        self._last: float | None = None
        self._begin: float | None = None
        #: the model's sliding windows; None until the trainer has told (before the first batch)
        self.windows: tuple[int, ...] | None = None

    def add_batch(self, real: int, padded: int, lengths: Sequence[int] | None = None) -> None:
        """One micro-batch fed to the model (called from ``training_step``).

        ``lengths`` are the real lengths of its rows (a packed row's length
        when packing); without them only the token counts are recorded.
        """
        self._real += real
        self._padded += padded
        if lengths is not None:
            fed = SequenceLengths.of(lengths, self.windows or ())
            self._rows += fed.rows
            self._sq += fed.sq_tokens
            for w, value in fed.windowed_sq_tokens.items():
                self._windowed[w] = self._windowed.get(w, 0) + value

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
        self.stats.step_rows.append(self._rows)
        self.stats.step_sq_tokens.append(self._sq)
        for w in self.windows or ():
            self.stats.step_windowed_sq_tokens.setdefault(w, []).append(self._windowed.get(w, 0))
        self._real = self._padded = self._rows = self._sq = 0
        self._windowed = {}


def peak_rss_bytes() -> int:
    """This process's peak resident set size (Linux reports KiB)."""
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def measured_window(
    steps: int, warmup: int | None, profiled: tuple[int, int] | None = None
) -> tuple[int, int]:
    """(warm-up steps excluded, first measured step) of a run of ``steps`` steps.

    The window is every step from the first measured one to the end. It starts
    after the warm-up (``orchestrator.contract.window``) and after the steps the
    profiler recorded (``profiled``: first step and count), whose time the
    profiler's start, stop and trace export distort; it may be empty when a run
    ended before its planned length.
    """
    k = warmup_of(steps, warmup)
    if profiled is None or profiled[1] <= 0:
        return k, k
    return k, max(k, profiled[0] + profiled[1])


def summarize(
    ranks: Sequence[RankStats],
    warmup: int | None = None,
    devices: int | None = None,
    profiled: tuple[int, int] | None = None,
) -> dict[str, Any]:
    """Throughput and step-time figures from every rank's records.

    ``devices``: what the per-device figures divide by (default: one per rank;
    under ``DataParallel`` one rank drives several GPUs).
    """
    steps = min(len(r.step_times_s) for r in ranks) if ranks else 0
    if steps == 0:
        return {"steps": 0, "profiled_steps": None}
    warm, k = measured_window(steps, warmup, profiled)
    # the result's one source of profiled_steps: None when the run recorded no profile
    profile = {"profiled_steps": profiled[1] if profiled is not None and profiled[1] > 0 else None}
    if k >= steps:
        # the profiled steps reached the end: nothing left to measure, no figure
        return {"steps": steps, "warmup_steps_excluded": warm, "steps_measured": 0, **profile}
    times = [sum(r.step_times_s[k:steps]) for r in ranks]
    tokens = [sum(r.step_tokens[k:steps]) for r in ranks]
    padded = [sum(r.step_padded_tokens[k:steps]) for r in ranks]
    window = max(times)
    world = devices or len(ranks)
    # the slowest rank sets each step's pace
    per_step = [max(r.step_times_s[i] for r in ranks) for i in range(k, steps)]
    mean = statistics.fmean(per_step)
    cv = statistics.stdev(per_step) / mean if len(per_step) > 1 and mean > 0 else None
    global_tps = sum(tokens) / window if window > 0 else None
    # samples (the rows fed: sequences, packed rows, images); unknown without row records
    samples = sum(sum(r.step_rows[k:steps]) for r in ranks)
    global_sps = samples / window if samples and window > 0 else None
    total_real = sum(sum(r.step_tokens[:steps]) for r in ranks)
    total_padded = sum(sum(r.step_padded_tokens[:steps]) for r in ranks)
    return {
        "steps": steps,
        "warmup_steps_excluded": warm,
        **profile,
        "steps_measured": steps - k,
        "measured_time_s": window,
        "tokens_measured": sum(tokens),
        "tokens_total": total_real,
        "padded_tokens_total": total_padded,
        "padding_fraction": 1 - sum(tokens) / sum(padded) if sum(padded) else None,
        "tokens_per_second_global": global_tps,
        "tokens_per_second_per_device": global_tps / world if global_tps is not None else None,
        "samples_measured": samples or None,
        "samples_per_second_global": global_sps,
        "samples_per_second_per_device": global_sps / world if global_sps is not None else None,
        "step_time_median_s": statistics.median(per_step),
        "step_time_mean_s": mean,
        "step_time_cv": cv,
        # the achieved precision: the batch-means 95% interval's half-width over the mean
        "step_time_ci_pct": precision_pct(per_step),
        "step_time_min_s": min(per_step),
        "step_time_max_s": max(per_step),
    }


def first_measured_step(summary: Mapping[str, Any]) -> int | None:
    """The first measured step of ``summarize``'s figures: its window is the steps after
    it, up to ``steps`` (after the warm-up and any profiled steps); None when the figures
    have no window (no step recorded)."""
    steps, measured = summary.get("steps"), summary.get("steps_measured")
    return int(steps) - int(measured) if steps is not None and measured is not None else None


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


#: The prefixes of HF's GPU stage metrics, in the order the stages run.
HF_GPU_STAGES = ("before_init_mem_gpu", "init_mem_gpu", "train_mem_gpu")


def hf_stage_memory(metrics: Mapping[str, Any]) -> tuple[int | None, int | None]:
    """(peak, allocated) GPU bytes from HF's stage memory metrics, the predecessor's way.

    Running sum of each stage's allocation delta on top of ``before_init``;
    the peak of a stage is that sum plus the stage's peaked delta. The model
    loading stage before the Trainer (``before_init``) counts as allocated.
    None when the metrics are absent (CPU runs, or memory metrics off).
    """
    if not any(k.startswith(HF_GPU_STAGES) for k in metrics):
        return None, None
    running = 0.0
    allocs: list[float] = []
    peaks: list[float] = []
    for stage in HF_GPU_STAGES:
        delta = metrics.get(f"{stage}_alloc_delta", metrics.get(stage, 0)) or 0
        running += float(delta)
        allocs.append(running)
        peaks.append(running + float(metrics.get(f"{stage}_peaked_delta", 0) or 0))
    return int(max(peaks)), int(max(allocs))


# ---------------------------------------------------------------------------
# GPU memory stages from torch.cuda's counters (no polling thread)
# ---------------------------------------------------------------------------

#: Where a run reads the counters, in order: before the model loads, before and after
#: the Trainer is built, at ``on_train_begin`` and at ``on_train_end``.
MEMORY_POINTS = ("load_begin", "init_begin", "init_end", "train_begin", "train_end")


@dataclass(frozen=True)
class MemoryReading:
    #: bytes allocated at the point (``torch.cuda.memory_allocated``)
    allocated: int
    #: the most allocated since the previous reset (``torch.cuda.max_memory_allocated``)
    peak: int


class MemoryCounters:
    """Reads allocated memory and its peak at the points of ``MEMORY_POINTS``.

    A reading resets the peak unless told not to, so its ``peak`` covers the
    interval since the previous reset. The readers are injected (torch.cuda's on a
    GPU), which keeps this module free of torch; a reading is three host calls, no
    thread and no device synchronisation.
    """

    def __init__(
        self,
        allocated: Callable[[], int],
        max_allocated: Callable[[], int],
        reset_peak: Callable[[], None],
        collect: Callable[[], object] | None = None,
    ) -> None:
        self._allocated = allocated
        self._max_allocated = max_allocated
        self._reset_peak = reset_peak
        self._collect = collect
        self.readings: dict[str, MemoryReading] = {}

    def mark(self, point: str, *, reset: bool = True) -> None:
        assert point in MEMORY_POINTS, point
        if point == "train_end" and self._collect is not None:
            # as HF's tracker does, so the train stage's allocation is what training
            # kept, not garbage; this point is after every clock of the run
            self._collect()
        self.readings[point] = MemoryReading(int(self._allocated()), int(self._max_allocated()))
        if reset:
            self._reset_peak()


def memory_stages(readings: Mapping[str, MemoryReading]) -> dict[str, int | None]:
    """HF ``TrainerMemoryTracker``'s GPU stage figures, and the loading peak, from readings.

    The stages and definitions are HF's: ``init`` is building the Trainer
    (``init_begin`` to ``init_end``), ``train`` is ``trainer.train()`` (``init_end``
    to ``train_end``); a stage's ``alloc_delta`` is allocated at its end minus at its
    start, its ``peaked_delta`` the most allocated during it above its end (never
    negative), and ``before_init_mem_gpu`` what was allocated when the Trainer was
    built. ``mem_load_peak_bytes`` is the most allocated from ``load_begin`` to
    ``train_begin``: model load, Trainer set-up and the wrapping and sharding
    ``train()`` does before its first step. Figures whose points are missing are None.
    """
    r = readings
    out: dict[str, int | None] = dict.fromkeys(
        (
            "before_init_mem_gpu",
            "init_mem_gpu_alloc_delta",
            "init_mem_gpu_peaked_delta",
            "train_mem_gpu_alloc_delta",
            "train_mem_gpu_peaked_delta",
            "mem_load_peak_bytes",
        )
    )
    if "init_begin" in r and "init_end" in r:
        out["before_init_mem_gpu"] = r["init_begin"].allocated
        out["init_mem_gpu_alloc_delta"] = r["init_end"].allocated - r["init_begin"].allocated
        out["init_mem_gpu_peaked_delta"] = max(0, r["init_end"].peak - r["init_end"].allocated)
    if "init_end" in r and "train_end" in r:
        end = r["train_end"]
        peak = max(end.peak, r["train_begin"].peak if "train_begin" in r else 0)
        out["train_mem_gpu_alloc_delta"] = end.allocated - r["init_end"].allocated
        out["train_mem_gpu_peaked_delta"] = max(0, peak - end.allocated)
    loading = ("init_begin", "init_end", "train_begin")
    if "load_begin" in r and all(p in r for p in loading):
        out["mem_load_peak_bytes"] = max(r[p].peak for p in loading)
    return out


def stage_memory_figures(
    source: str | None, hf_metrics: Mapping[str, Any], counted: Mapping[str, Any]
) -> dict[str, Any]:
    """The GPU memory stage columns of a result, from the one source the spec names.

    ``source`` is ``RunSpec.memory_stages``: ``torch`` takes ``counted`` (rank 0's
    ``memory_stages``), ``hf-tracker`` takes HF's ``hf_metrics``, None neither.
    Returns the stage figures (HF's names), the predecessor's two sums
    (``hf_stage_memory``) and ``mem_stage_source``, which names the source only
    when it produced figures.
    """
    from orchestrator.contract.spec import MEMORY_STAGE_SOURCES

    chosen = {"torch": counted, "hf-tracker": hf_metrics}.get(source or "", {})
    stages = {k: v for k, v in chosen.items() if k.startswith(HF_GPU_STAGES) and v is not None}
    peak, alloc = hf_stage_memory(stages)
    return {
        "stages": stages,
        "mem_peak_torch_mem_alloc_in_bytes": peak,
        "mem_torch_mem_alloc_in_bytes": alloc,
        "mem_stage_source": MEMORY_STAGE_SOURCES[source] if source and peak is not None else None,
    }
