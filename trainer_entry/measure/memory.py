"""What a run's memory measures: the process's peak RSS, the GPU counters at stage
boundaries, and HF's stage metrics read the predecessor's way."""

from __future__ import annotations

import resource
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from orchestrator.contract.outcome import looks_like_oom


def is_oom(exc: BaseException) -> bool:
    """Out of memory by the same patterns the parent reads a stderr with."""
    if isinstance(exc, MemoryError):
        return True
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(exc, torch.OutOfMemoryError):
        return True
    return looks_like_oom(f"{type(exc).__name__}: {exc}")


#: whether this process's resident high-water mark is this run's: False once a reset
#: between the runs of a shared launch failed (the mark then holds an earlier run's peak)
_peak_rss_is_this_runs = True


def peak_rss_bytes() -> int | None:
    """This process's peak resident set size since it started, or since the last
    ``reset_peak_rss``; None when that reset failed (an earlier run's peak would show).

    Linux's ``VmHWM`` (what ``reset_peak_rss`` resets), else ``ru_maxrss`` (KiB).
    """
    if not _peak_rss_is_this_runs:
        return None
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def reset_peak_rss() -> None:
    """Between the runs of a shared launch: hand freed heap back to the system (glibc's
    ``malloc_trim``) and start the resident high-water mark again from the resident
    size now (Linux's ``clear_refs``, since 4.0), so the next run's peak is its own."""
    global _peak_rss_is_this_runs
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass  # another C library: its heap stays as it is, and the peak says so
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        _peak_rss_is_this_runs = False


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
