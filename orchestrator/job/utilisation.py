"""Utilisation: how busy a job kept its GPUs and its CPUs, from the sidecar's samples.

The sidecar (``orchestrator.job.sidecar``) writes, beside its memory samples,
at every sample (unless told not to, see ``OFF_ENV``):

- ``gpu_util`` / ``gpu_mem_util`` per device: NVML's ``utilization.gpu`` (the
  share of the driver's last sample period, 1/6 s to 1 s, in which a kernel
  ran) and its memory figure (the share in which device memory was read or
  written), in percent;
- ``tree_cpu``: the CPU time (user + system) the job's process tree has used,
  in microseconds, cumulative (see ``tree_cpu_seconds``);
- ``cpu_allowed``: how many CPUs the job's processes may run on (the union of
  their affinity masks), whenever it changes.

``summarize`` turns them into the row's figures over one window: the measured
steps (the window tokens/s covers) where the child's ``progress.json`` and
``result.json`` say when they were, else the whole training (first step to
last), else the job's whole life; ``util_window`` says which. A window over
model loading would mislead: loading is mostly one thread.

``cpu_util_mean_pct`` is the tree's CPU time over the window divided by the
window's wall time and by the number of CPUs the job may use, in percent: 100
means every allowed core was busy all the time (not top's per-core scale,
where two busy cores read 200).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from orchestrator.contract.progress import StepProgress
from orchestrator.contract.window import WINDOW_MEASURED

#: set to ``0`` in the environment of ``tunematrix run``, the sidecar samples memory
#: only. For measuring what utilisation sampling costs (benchmarks/bench_utilisation.py).
OFF_ENV = "TUNEMATRIX_SIDECAR_UTILISATION"

#: the sample kinds of memory.csv this module reads
GPU_UTIL = "gpu_util"
GPU_MEM_UTIL = "gpu_mem_util"
TREE_CPU = "tree_cpu"
CPU_ALLOWED = "cpu_allowed"
#: the window a row's figures cover, from the best known to the least: WINDOW_MEASURED (the
#: contract's, which the report reads), then these
WINDOW_TRAINING, WINDOW_JOB = "training", "job"
#: what a window needs for its CPU figure: this many CPU samples, spanning this long (the
#: kernel counts CPU time in 10 ms ticks: over 0.5 s, a tick at each end is at most 4% of
#: one CPU); with less, the next larger window is used
MIN_SAMPLES = 3
MIN_SPAN_S = 0.5
US = 1_000_000


# ---------------------------------------------------------------------------
# Reading (in the sidecar)
# ---------------------------------------------------------------------------


class CpuTimes(Protocol):
    """What ``psutil.Process.cpu_times()`` gives on Linux (seconds)."""

    user: float
    system: float
    children_user: float
    children_system: float


def tree_cpu_seconds(readings: Iterable[CpuTimes]) -> float:
    """The CPU time of a process tree at one sample, from each live member's times.

    Each member counts its own user and system time, and its ``children_*``
    times: what the kernel added to it from the children it has reaped (and
    theirs, recursively). A process of the tree that exits and is reaped by its
    parent in the tree therefore keeps its whole time in the sum, moved from its
    own figures to its parent's, even one that lived between two samples and was
    never seen. A member that has not reaped a child counts it only through the
    child's own figures, so nothing is counted twice. Lost: the time of a
    process that leaves the tree without being reaped in it (an orphan the
    init process reaps), and, for up to the membership refresh (1 s), the time
    of a process the sidecar has not yet seen alive (counted when it is seen,
    or when its parent reaps it).
    """
    return sum(t.user + t.system + t.children_user + t.children_system for t in readings)


class NvmlLike(Protocol):
    """The part of ``pynvml`` read here."""

    NVMLError: type[Exception]

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any: ...


def read_gpu_utilisation(
    nv: NvmlLike, handles: Mapping[int, Any], unsupported: set[int]
) -> dict[int, tuple[int, int]]:
    """``{device index: (utilization.gpu %, memory-bandwidth utilisation %)}``.

    A device whose driver cannot tell (MIG instances, some boards) is added to
    ``unsupported`` and not asked again: its columns stay empty rather than 0.
    """
    out: dict[int, tuple[int, int]] = {}
    for index, handle in handles.items():
        if index in unsupported:
            continue
        try:
            rates = nv.nvmlDeviceGetUtilizationRates(handle)
        except nv.NVMLError:
            unsupported.add(index)
            continue
        out[index] = (int(rates.gpu), int(rates.memory))
    return out


# ---------------------------------------------------------------------------
# The window (in the parent, after the job)
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Window:
    """A span of Unix time a row's utilisation figures cover."""

    name: str
    start: float
    end: float

    def holds(self, t: float) -> bool:
        return self.start <= t <= self.end


def windows_of(progress: StepProgress | None, result: Mapping[str, Any] | None) -> list[Window]:
    """The measured steps' window and the training's, where the child's records tell them.

    Training runs from ``train_started`` to the end of its last step (the result's
    ``timings.train_end_unix``; in a record without it, the last write of
    ``progress.json``, phase ``done``, which follows the trainer's own wrap-up).
    The measured steps are its last ``measured_time_s`` seconds (the warmup steps
    come first). Both clocks are this machine's wall clock, as the sidecar's
    timestamps are.
    """
    if progress is None or progress.phase != "done" or progress.updated <= progress.train_started:
        return []
    end = progress.updated
    timings = (result or {}).get("timings")
    last_step = timings.get("train_end_unix") if isinstance(timings, Mapping) else None
    if isinstance(last_step, (int, float)) and progress.train_started < last_step <= end:
        end = float(last_step)
    found = []
    metrics = (result or {}).get("metrics")
    measured = metrics.get("measured_time_s") if isinstance(metrics, Mapping) else None
    if isinstance(measured, (int, float)) and math.isfinite(measured) and measured > 0:
        start = end - float(measured)
        if start >= progress.train_started - 0.5:  # the ranks' clocks differ a little
            found.append(Window(WINDOW_MEASURED, max(start, progress.train_started), end))
    found.append(Window(WINDOW_TRAINING, progress.train_started, end))
    return found


def run_windows(progress_path: Path, result_path: Path) -> list[Window]:
    """``windows_of`` the files of a run folder (``progress.json``, ``result.json``)."""
    # here, not at the top: the sidecar imports this module and starts on the job's path
    from orchestrator.contract.result import read_result

    return windows_of(StepProgress.read(progress_path), read_result(result_path))


# ---------------------------------------------------------------------------
# Summaries (pure)
# ---------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) of ``values``, linear between the closest ranks."""
    if not values:
        raise ValueError("no values")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def cpu_util_pct(samples: Sequence[tuple[float, int]], cpus: int) -> float | None:
    """The tree's CPU time between the first and the last sample, over their span
    and ``cpus``, in percent; None with fewer than two samples, no span, or a total
    that fell (a process left the tree with its time: the figure cannot be trusted)."""
    if len(samples) < 2 or cpus < 1:
        return None
    (t0, c0), (t1, c1) = samples[0], samples[-1]
    if t1 <= t0 or c1 < c0:
        return None
    return 100.0 * (c1 - c0) / US / ((t1 - t0) * cpus)


def summarize(
    rows: Iterable[tuple[float, str, str, int]], windows: Sequence[Window] = ()
) -> dict[str, Any]:
    """The utilisation figures of a row from the sidecar's samples.

    ``windows``: the spans to try, best first (``windows_of``); the first that
    holds ``MIN_SAMPLES`` CPU samples over ``MIN_SPAN_S`` (or, without CPU
    samples, one GPU sample) is used, else the job's whole life. GPU figures pool every device's
    samples (the 10th percentile is low as soon as one GPU often sits idle).
    No samples of a kind: no figure (never 0).
    """
    gpu: list[tuple[float, int]] = []
    gpu_mem: list[tuple[float, int]] = []
    cpu: list[tuple[float, int]] = []
    allowed: list[tuple[float, int]] = []
    for t, kind, _, value in rows:
        if kind == GPU_UTIL:
            gpu.append((t, value))
        elif kind == GPU_MEM_UTIL:
            gpu_mem.append((t, value))
        elif kind == TREE_CPU:
            cpu.append((t, value))
        elif kind == CPU_ALLOWED:
            allowed.append((t, value))
    if not (gpu or cpu):
        return {}
    chosen = Window(WINDOW_JOB, -math.inf, math.inf)
    for window in windows:
        inside = [t for t, _ in cpu if window.holds(t)]
        enough = len(inside) >= MIN_SAMPLES and max(inside) - min(inside) >= MIN_SPAN_S
        if enough or (not cpu and any(window.holds(t) for t, _ in gpu)):
            chosen = window
            break
    out: dict[str, Any] = {"util_window": chosen.name}
    in_gpu = [float(v) for t, v in gpu if chosen.holds(t)]
    if in_gpu:
        out["gpu_util_mean_pct"] = sum(in_gpu) / len(in_gpu)
        out["gpu_util_p10_pct"] = percentile(in_gpu, 10)
    in_mem = [float(v) for t, v in gpu_mem if chosen.holds(t)]
    if in_mem:
        out["gpu_mem_bw_util_mean_pct"] = sum(in_mem) / len(in_mem)
    in_cpu = sorted((t, v) for t, v in cpu if chosen.holds(t))
    # the CPUs the job could use in the window: the most it was allowed at any point up to its end
    cpus = max((v for t, v in allowed if t <= chosen.end), default=0)
    cpu_pct = cpu_util_pct(in_cpu, cpus)
    if cpu_pct is not None:
        out["cpu_util_mean_pct"] = cpu_pct
        out["cpu_allowed"] = cpus
    return out
