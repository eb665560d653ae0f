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
computed from (``trainer_entry.measure.flops``).
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from orchestrator.contract.steady import precision_pct
from orchestrator.contract.trainers import COUNT_UNITS, count_column
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
    #: the process's minor page faults in each step (the host allocator's churn: memory
    #: handed back to the kernel and faulted in again)
    step_page_faults: list[int] = field(default_factory=list)
    #: a task's counts beside tokens (``COUNT_UNITS``: source tokens, audio seconds, …) per step
    step_counts: dict[str, list[float]] = field(default_factory=dict)
    #: the moments of the rows' lengths along a task's FLOPs dimensions per step
    #: (``length_moments``: ``source``, ``source*target``, …)
    step_moments: dict[str, list[int]] = field(default_factory=dict)
    #: from the start of training to the end of the first step
    first_step_s: float | None = None
    #: wall clock (Unix time) at the end of the first step
    first_step_end_unix: float | None = None
    peak_rss_bytes: int | None = None
    cuda_max_allocated_bytes: int | None = None
    cuda_max_reserved_bytes: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _page_faults() -> int:
    """This process's minor page faults so far (0 where the platform does not count them)."""
    try:
        import resource

        return int(resource.getrusage(resource.RUSAGE_SELF).ru_minflt)
    except (ImportError, OSError):
        return 0


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


def length_moments(dims: Mapping[str, Sequence[int]]) -> dict[str, int]:
    """The sums a step's counted FLOPs are linear in (``trainer_entry.measure.counted``).

    ``dims``: each dimension's real length for every row (rows in the same order in
    each). For every dimension ``a``, ``Σ n_a``; for every pair ``a ≤ b`` (by name),
    ``Σ n_a·n_b`` under the key ``a*b`` (``a*a`` for the squares).
    """
    names = sorted(dims)
    out = {a: int(sum(dims[a])) for a in names}
    for i, a in enumerate(names):
        for b in names[i:]:
            out[f"{a}*{b}"] = int(sum(x * y for x, y in zip(dims[a], dims[b], strict=True)))
    return out


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
        self._counts: dict[str, float] = {}
        self._moments: dict[str, int] = {}
        self._last: float | None = None
        self._begin: float | None = None
        #: when the last optimizer step ended (Unix time); None before the first
        self.last_step_end_unix: float | None = None
        self._faults = 0
        #: the model's sliding windows; None until the trainer has told (before the first batch)
        self.windows: tuple[int, ...] | None = None

    def add_batch(
        self,
        real: int,
        padded: int,
        lengths: Sequence[int] | None = None,
        *,
        counts: Mapping[str, float] | None = None,
        dims: Mapping[str, Sequence[int]] | None = None,
    ) -> None:
        """One micro-batch fed to the model (called from ``training_step``).

        ``lengths`` are the real lengths of its rows (a packed row's length
        when packing); without them only the token counts are recorded.
        ``counts``: the task's counts beside tokens; ``dims``: each row's real
        length along the task's FLOPs dimensions (their moments are recorded).
        """
        self._real += real
        self._padded += padded
        for name, value in (counts or {}).items():
            self._counts[name] = self._counts.get(name, 0) + value
        for name, value in length_moments(dims or {}).items():
            self._moments[name] = self._moments.get(name, 0) + value
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
        self._faults = _page_faults()

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
        faults = _page_faults()
        self.stats.step_page_faults.append(faults - self._faults)
        self._faults = faults
        # where the run's training phase ends (orchestrator/job/phases.py); not a rank record
        self.last_step_end_unix = time.time()
        self.stats.step_tokens.append(self._real)
        self.stats.step_padded_tokens.append(self._padded)
        self.stats.step_rows.append(self._rows)
        self.stats.step_sq_tokens.append(self._sq)
        for w in self.windows or ():
            self.stats.step_windowed_sq_tokens.setdefault(w, []).append(self._windowed.get(w, 0))
        # a name first seen late has 0 in the steps before it (every list spans every step)
        done = len(self.stats.step_times_s) - 1
        for name in self._counts:
            self.stats.step_counts.setdefault(name, [0.0] * done)
        for name in self._moments:
            self.stats.step_moments.setdefault(name, [0] * done)
        for name, series in self.stats.step_counts.items():
            series.append(self._counts.get(name, 0.0))
        for name, moments in self.stats.step_moments.items():
            moments.append(self._moments.get(name, 0))
        self._real = self._padded = self._rows = self._sq = 0
        self._windowed = {}
        self._counts = {}
        self._moments = {}


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
    # the host allocator's churn, per measured step: the busiest rank's (None where no
    # rank counted its steps' faults, as records before the count do)
    faults = [
        sum(r.step_page_faults[k:steps]) / (steps - k)
        for r in ranks
        if len(r.step_page_faults) >= steps
    ]
    # a task's counts beside tokens (source tokens, audio seconds, …), as tokens/s
    counted = {
        count_column(name): sum(sum(r.step_counts.get(name, [])[k:steps]) for r in ranks) / window
        for name in sorted({n for r in ranks for n in r.step_counts})
        if name in COUNT_UNITS and window > 0
    }
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
        "host_page_faults_per_step": max(faults) if faults else None,
        **counted,
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
