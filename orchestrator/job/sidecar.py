"""The memory sidecar: a separate process that samples a job's memory.

Started by the runner before the job. It takes a baseline of the job's GPUs
(NVML), prints ``ready <backend>``, reads the job's pid from stdin, then
samples every ``--interval`` seconds until stdin closes or it gets SIGTERM:

- ``nvml`` backend (``nvidia-ml-py``): memory used on each of the job's GPUs,
  and each job process's use of them;
- ``psutil`` backend (always, and alone where NVML is missing): the resident
  memory (RSS) of every process of the job's tree and their sum, every
  sample; and the proportional set size (PSS, from ``/proc/<pid>/smaps_rollup``)
  of every process and their sum, at least every ``--pss-every`` seconds.

And utilisation (``orchestrator.job.utilisation``), unless ``--no-utilisation``
(or ``TUNEMATRIX_SIDECAR_UTILISATION=0``, for measuring its cost): NVML's
``utilization.gpu`` and memory-bandwidth figures of each GPU, and the CPU time
of the job's tree, read in the same pass over the tree as its RSS.

Summed RSS counts a page shared by several processes (the libraries and
model files every rank maps) once per process; summed PSS splits each shared
page between the processes that map it, so the tree's PSS is the memory the
job really holds. Reading PSS walks the page tables, which costs far more
than RSS (a few ms per torch process here, growing with its resident size),
so it is read at least every ``--pss-every`` seconds and whenever the tree's
RSS passes its previous high, but never more than ``PSS_BUDGET`` of the time.

Samples go to a CSV file as they are taken (``timestamp,kind,source,bytes``),
so a crash of anything loses nothing already sampled. ``summarize`` turns
them into the figures of a result row. Being a process of its own, the
sidecar keeps sampling whatever the job does to its interpreter.

    python -m orchestrator.job.sidecar --out memory.csv [--devices 0,1] [--interval 0.1]
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from orchestrator.job import energy, utilisation

CSV_HEADER = ("timestamp", "kind", "source", "bytes")
MIB = 1024 * 1024
#: the largest share of the sidecar's time spent reading PSS
PSS_BUDGET = 0.05
#: ``mem_tree_peak_measure``: how the tree's peak was measured
MEASURE_PSS = "pss"
MEASURE_MIXED = "pss+rss"  # RSS stood in for processes whose PSS could not be read
MEASURE_RSS_ONLY = "rss only"  # PSS could not be read at all: no PSS figure

# ---------------------------------------------------------------------------
# Mapping CUDA device entries to NVML devices (pure)
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class NvmlDevice:
    index: int
    uuid: str
    pci_bus_id: str
    name: str = ""


def map_visible_to_nvml(entries: Sequence[str], devices: Sequence[NvmlDevice]) -> list[NvmlDevice]:
    """The NVML devices that ``CUDA_VISIBLE_DEVICES`` entries name.

    Entries are UUIDs (``GPU-…``, or a unique prefix) or indices. Indices count
    in PCI bus order (``CUDA_DEVICE_ORDER=PCI_BUS_ID``, which the runner sets),
    which need not be NVML's own enumeration order.
    """
    by_pci = sorted(devices, key=lambda d: d.pci_bus_id.lower())
    out: list[NvmlDevice] = []
    for entry in entries:
        entry = entry.strip()
        if entry.isdigit():
            i = int(entry)
            if i >= len(by_pci):
                raise ValueError(f"CUDA device {i} does not exist ({len(by_pci)} GPUs)")
            out.append(by_pci[i])
            continue
        matches = [d for d in devices if d.uuid.startswith(entry) or d.uuid == f"GPU-{entry}"]
        if len(matches) != 1:
            raise ValueError(f"CUDA_VISIBLE_DEVICES entry {entry!r} matches {len(matches)} GPUs")
        out.append(matches[0])
    return out


# ---------------------------------------------------------------------------
# Summaries of the samples (pure)
# ---------------------------------------------------------------------------


def read_samples(path: Path) -> list[tuple[float, str, str, int]]:
    rows: list[tuple[float, str, str, int]] = []
    with suppress(OSError), path.open(newline="") as f:
        for row in csv.DictReader(f):
            try:
                rows.append(
                    (float(row["timestamp"]), row["kind"], row["source"], int(row["bytes"]))
                )
            except (KeyError, TypeError, ValueError):
                continue  # a line cut short by a crash
    return rows


def summarize(rows: Iterable[tuple[float, str, str, int]]) -> dict[str, Any]:
    """Peak figures from sidecar samples.

    GPU: each device's peak used memory minus its baseline before the job;
    the mean and the max over devices (the mean in MiB is the predecessor's
    ``mem_nvidia_mem_reserved``). CPU: the peak of the tree's summed PSS
    (``mem_tree_peak_pss_bytes``, with ``mem_tree_peak_measure`` saying
    whether RSS stood in for a process whose PSS could not be read, or that
    there is no PSS at all), the peak of its summed RSS (which counts shared
    pages once per process), and each process's own peak RSS and PSS.
    """
    baseline: dict[str, int] = {}
    device_peak: dict[str, int] = {}
    process_peak: dict[str, int] = {}
    gpu_process_peak: dict[str, int] = {}
    tree_peak = 0
    samples = 0
    process_pss_peak: dict[str, int] = {}
    tree_pss_peak, tree_pss_measure, pss_samples = 0, MEASURE_PSS, 0
    for _, kind, source, value in rows:
        if kind == "device_baseline":
            baseline[source] = value
        elif kind == "device_used":
            device_peak[source] = max(device_peak.get(source, 0), value)
            samples += 1
        elif kind == "process_rss":
            process_peak[source] = max(process_peak.get(source, 0), value)
        elif kind == "gpu_process":
            gpu_process_peak[source] = max(gpu_process_peak.get(source, 0), value)
        elif kind == "tree_rss":
            tree_peak = max(tree_peak, value)
            samples += 1
        elif kind == "process_pss":
            process_pss_peak[source] = max(process_pss_peak.get(source, 0), value)
        elif kind == "tree_pss":
            pss_samples += 1
            if value > tree_pss_peak:
                tree_pss_peak, tree_pss_measure = value, source
    out: dict[str, Any] = {"mem_sidecar_samples": samples}
    if device_peak:
        deltas = [max(0, device_peak[d] - baseline.get(d, 0)) for d in sorted(device_peak)]
        mean = sum(deltas) / len(deltas)
        out.update(
            mem_nvidia_mem_reserved=mean / MIB,
            mem_nvidia_peak_bytes_mean=mean,
            mem_nvidia_peak_bytes_max=max(deltas),
            mem_nvidia_peak_bytes_per_device=dict(zip(sorted(device_peak), deltas, strict=True)),
        )
    if gpu_process_peak:
        out["mem_nvidia_process_peak_bytes"] = gpu_process_peak
    if tree_peak:
        out["mem_tree_peak_rss_bytes"] = tree_peak
    if tree_pss_peak:
        out["mem_tree_peak_pss_bytes"] = tree_pss_peak
        out["mem_tree_peak_measure"] = tree_pss_measure
        out["mem_tree_pss_samples"] = pss_samples
    elif tree_peak:
        out["mem_tree_peak_measure"] = MEASURE_RSS_ONLY
    if process_peak:
        out["mem_process_peak_rss_bytes"] = process_peak
    if process_pss_peak:
        out["mem_process_peak_pss_bytes"] = process_pss_peak
    return out


def row_figures(
    rows: Sequence[tuple[float, str, str, int]], windows: Sequence[utilisation.Window]
) -> dict[str, Any]:
    """Every figure of a row from its samples: memory (``summarize``), and utilisation
    and energy over the first of ``windows`` they cover (``utilisation.run_windows``)."""
    return {
        **summarize(rows),
        **utilisation.summarize(rows, windows),
        **energy.summarize(rows, windows),
    }


# ---------------------------------------------------------------------------
# The sampling process
# ---------------------------------------------------------------------------


def visible_nvml_devices(nv: Any, entries: Sequence[str]) -> list[NvmlDevice]:
    """The NVML devices ``CUDA_VISIBLE_DEVICES`` entries name, through ``nv`` (``pynvml``,
    initialised)."""
    found = []
    for i in range(nv.nvmlDeviceGetCount()):
        h = nv.nvmlDeviceGetHandleByIndex(i)
        found.append(
            NvmlDevice(
                index=i,
                uuid=_text(nv.nvmlDeviceGetUUID(h)),
                pci_bus_id=_text(nv.nvmlDeviceGetPciInfo(h).busId),
                name=_text(nv.nvmlDeviceGetName(h)),
            )
        )
    return map_visible_to_nvml(entries, found)


class _Nvml:
    def __init__(self, entries: Sequence[str]) -> None:
        import pynvml

        self.nv = pynvml
        pynvml.nvmlInit()
        self.devices = visible_nvml_devices(pynvml, entries)
        self.handles = {d.index: pynvml.nvmlDeviceGetHandleByIndex(d.index) for d in self.devices}
        #: devices whose driver gives no utilisation figures (asked once)
        self.no_utilisation: set[int] = set()
        #: energy, power, clocks, temperature, throttling
        self.conditions = energy.NvmlConditions(pynvml, self.handles)

    def used(self) -> dict[int, int]:
        return {i: int(self.nv.nvmlDeviceGetMemoryInfo(h).used) for i, h in self.handles.items()}

    def utilisation(self) -> dict[int, tuple[int, int]]:
        return utilisation.read_gpu_utilisation(self.nv, self.handles, self.no_utilisation)

    def processes(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for h in self.handles.values():
            try:
                procs = self.nv.nvmlDeviceGetComputeRunningProcesses(h)
            except self.nv.NVMLError:
                continue
            for p in procs:
                used = p.usedGpuMemory or 0
                out[int(p.pid)] = out.get(int(p.pid), 0) + int(used)
        return out

    def close(self) -> None:
        with suppress(self.nv.NVMLError):
            self.nv.nvmlShutdown()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass
class PssSchedule:
    """When to read the tree's PSS: at least every ``every_s`` seconds and whenever the
    tree's RSS passes its high at the last read (a peak is forming), but spaced so that
    reading takes at most ``budget`` of the time (a read that took 10 ms waits 0.2 s)."""

    every_s: float = 1.0
    budget: float = PSS_BUDGET
    last: float = -math.inf
    cost_s: float = 0.0
    high: int = 0

    def due(self, now: float, tree_rss: int) -> bool:
        since = now - self.last
        if since < self.cost_s / self.budget:
            return False
        return since >= self.every_s or tree_rss > self.high

    def done(self, now: float, cost_s: float, tree_rss: int) -> None:
        self.last, self.cost_s, self.high = now, cost_s, max(self.high, tree_rss)


class _Tree:
    """The job's processes: membership refreshed each second, RSS (and, with ``cpu``,
    CPU time) read each sample, PSS when asked."""

    def __init__(self, pid: int, *, cpu: bool = False) -> None:
        import psutil

        self.psutil = psutil
        self.root = psutil.Process(pid)
        self.members: list[Any] = [self.root]
        self.refreshed = 0.0
        self.cpu = cpu
        #: the tree's CPU time at the last ``rss`` (``utilisation.tree_cpu_seconds``)
        self.cpu_s: float | None = None
        #: how many CPUs the tree's processes may use (the union of their affinities)
        self.cpus_allowed = 0

    def rss(self) -> dict[int, int]:
        now = time.monotonic()
        if now - self.refreshed >= 1.0:
            try:
                self.members = [self.root, *self.root.children(recursive=True)]
            except self.psutil.Error:
                self.members = [m for m in self.members if m.is_running()]
            self.refreshed = now
            if self.cpu:
                self.cpus_allowed = self._allowed()
        out: dict[int, int] = {}
        times = []
        for proc in self.members:
            try:
                out[proc.pid] = int(proc.memory_info().rss)
                if self.cpu:
                    times.append(proc.cpu_times())
            except self.psutil.Error:
                continue
        if self.cpu:
            self.cpu_s = utilisation.tree_cpu_seconds(times) if times else None
        return out

    def _allowed(self) -> int:
        cpus: set[int] = set()
        for proc in self.members:
            try:
                cpus.update(proc.cpu_affinity())
            except (self.psutil.Error, AttributeError, OSError):
                continue  # gone, or no affinity on this system
        return len(cpus) or (os.cpu_count() or 0)

    def pss(self, pids: Iterable[int]) -> tuple[dict[int, int], list[int]]:
        """PSS of each of ``pids`` where it can be read, and the pids where it cannot
        (access denied, or no PSS on this system); processes gone meanwhile are in neither."""
        by_pid = {proc.pid: proc for proc in self.members}
        out: dict[int, int] = {}
        unreadable: list[int] = []
        for pid in pids:
            proc = by_pid.get(pid)
            if proc is None:
                continue
            try:
                pss = getattr(proc.memory_full_info(), "pss", None)
            except self.psutil.NoSuchProcess:
                continue
            except (self.psutil.Error, OSError):
                pss = None
            if pss is None:
                unreadable.append(pid)
            else:
                out[pid] = int(pss)
        return out, unreadable


def _sample_loop(
    out: TextIO,
    nvml: _Nvml | None,
    pid_holder: list[int],
    stop: threading.Event,
    interval: float,
    pss_every: float = 1.0,
    utilisation_on: bool = True,
    rapl: Sequence[energy.RaplZone] = (),
) -> int:
    """Samples until ``stop``; returns how many samples it took. ``utilisation_on``:
    utilisation, energy and clocks too (else memory only); ``rapl``: the CPU
    packages' energy counters to read (a CPU job's)."""
    writer = csv.writer(out, lineterminator="\n")
    tree: _Tree | None = None
    schedule = PssSchedule(every_s=pss_every)
    last_flush = time.monotonic()
    cpus_written = 0
    samples = 0
    while not stop.is_set():
        now = time.time()
        samples += 1
        if nvml is not None:
            for index, used in nvml.used().items():
                writer.writerow((f"{now:.3f}", "device_used", index, used))
            if utilisation_on:
                for index, (gpu, mem) in nvml.utilisation().items():
                    writer.writerow((f"{now:.3f}", utilisation.GPU_UTIL, index, gpu))
                    writer.writerow((f"{now:.3f}", utilisation.GPU_MEM_UTIL, index, mem))
                for kind, index, value in nvml.conditions.read():
                    writer.writerow((f"{now:.3f}", kind, index, value))
        if utilisation_on:
            for zone in rapl:
                reading = zone.read()
                if reading is not None:
                    writer.writerow((f"{now:.3f}", energy.CPU_ENERGY, zone.name, reading))
        if pid_holder and tree is None:
            try:
                tree = _Tree(pid_holder[0], cpu=utilisation_on)
            except Exception:
                tree = None
        if tree is not None:
            rss = tree.rss()
            for pid, value in rss.items():
                writer.writerow((f"{now:.3f}", "process_rss", pid, value))
            tree_rss = sum(rss.values())
            if rss:
                writer.writerow((f"{now:.3f}", "tree_rss", "tree", tree_rss))
            if tree.cpu_s is not None:
                if tree.cpus_allowed != cpus_written:
                    cpus_written = tree.cpus_allowed
                    writer.writerow((f"{now:.3f}", utilisation.CPU_ALLOWED, "tree", cpus_written))
                cpu_us = round(tree.cpu_s * utilisation.US)
                writer.writerow((f"{now:.3f}", utilisation.TREE_CPU, "tree", cpu_us))
            if rss and schedule.due(time.monotonic(), tree_rss):
                began = time.monotonic()
                pss, unreadable = tree.pss(rss)
                schedule.done(began, time.monotonic() - began, tree_rss)
                for pid, value in pss.items():
                    writer.writerow((f"{now:.3f}", "process_pss", pid, value))
                if pss:  # with no PSS at all, a "PSS" total would only be the RSS again
                    total = sum(pss.values()) + sum(rss[pid] for pid in unreadable)
                    measure = MEASURE_MIXED if unreadable else MEASURE_PSS
                    writer.writerow((f"{now:.3f}", "tree_pss", measure, total))
            if nvml is not None:
                for pid, used in nvml.processes().items():
                    if pid in rss:
                        writer.writerow((f"{now:.3f}", "gpu_process", pid, used))
        if time.monotonic() - last_flush >= 1.0:
            out.flush()
            last_flush = time.monotonic()
        stop.wait(interval)
    return samples


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m orchestrator.job.sidecar", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--out", required=True, type=Path, help="CSV file of samples")
    parser.add_argument(
        "--devices", default="", help="the job's CUDA_VISIBLE_DEVICES entries (empty: CPU)"
    )
    parser.add_argument("--interval", type=float, default=0.1, help="seconds between samples")
    parser.add_argument(
        "--pss-every",
        type=float,
        default=1.0,
        help="read the process tree's PSS at least this often, in seconds (RSS: every sample)",
    )
    parser.add_argument(
        "--no-utilisation",
        action="store_true",
        default=os.environ.get(utilisation.OFF_ENV, "1") == "0",
        help="sample memory only, not GPU utilisation and CPU time (to measure their cost; "
        f"also {utilisation.OFF_ENV}=0)",
    )
    args = parser.parse_args(argv)

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when to stop us

    entries = [e for e in args.devices.split(",") if e.strip()]
    nvml: _Nvml | None = None
    backend, why = "psutil", ""
    if entries:
        try:
            nvml = _Nvml(entries)
            backend = "nvml+psutil"
        except Exception as exc:  # NVMLError_LibraryNotFound, a missing package, a bad entry
            why = f" ({type(exc).__name__}: {exc})".replace("\n", " ")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", newline="") as out:
        csv.writer(out, lineterminator="\n").writerow(CSV_HEADER)
        if nvml is not None:
            now = time.time()
            for index, used in nvml.used().items():
                out.write(f"{now:.3f},device_baseline,{index},{used}\n")
            names = sorted({d.name for d in nvml.devices})
            why = f" devices={';'.join(names)}"
        rapl = _energy_sources(out, entries, nvml is not None, why)
        out.flush()
        print(f"ready {backend}{why}", flush=True)

        pid_holder: list[int] = []

        def read_stdin() -> None:
            for line in sys.stdin:
                if line.strip().isdigit() and not pid_holder:
                    pid_holder.append(int(line))
            stop.set()  # stdin closed: the parent is done (or gone)

        threading.Thread(target=read_stdin, daemon=True).start()
        cpu_before, samples = time.process_time(), 0
        try:
            samples = _sample_loop(
                out,
                nvml,
                pid_holder,
                stop,
                args.interval,
                args.pss_every,
                utilisation_on=not args.no_utilisation,
                rapl=rapl,
            )
        finally:
            out.flush()
            os.fsync(out.fileno())
            if nvml is not None:
                nvml.close()
    # the sidecar's own cost, for sidecar.log (benchmarks/bench_utilisation.py reads it)
    cpu_s = time.process_time() - cpu_before
    per = f", {1e3 * cpu_s / samples:.3f} ms per sample" if samples else ""
    mode = "memory only" if args.no_utilisation else "memory+utilisation"
    print(
        f"sidecar: {samples} samples ({mode}), {cpu_s:.3f} s CPU{per}", file=sys.stderr, flush=True
    )
    return 0


def _energy_sources(
    out: TextIO, entries: Sequence[str], nvml: bool, why: str
) -> list[energy.RaplZone]:
    """A CPU job's RAPL zones (their ranges written), or a line in ``out`` saying why
    no energy will be sampled; a GPU job's energy comes with its NVML samples."""
    now = f"{time.time():.3f}"
    writer = csv.writer(out, lineterminator="\n")
    if entries:
        if not nvml:
            writer.writerow((now, energy.ENERGY_NONE, f"NVML could not be read{why}", 0))
        return []
    zones, reason = energy.rapl_zones()
    if reason:
        writer.writerow((now, energy.ENERGY_NONE, reason, 0))
    for zone in zones:
        writer.writerow((now, energy.CPU_ENERGY_RANGE, zone.name, zone.range_uj))
    return zones


def parse_ready(line: str) -> tuple[str, Mapping[str, str]]:
    """``ready nvml+psutil devices=A;B`` -> ("nvml+psutil", {"devices": "A;B"})."""
    words = line.strip().split(" ", 2)
    backend = words[1] if len(words) > 1 else "unknown"
    extra: dict[str, str] = {}
    if len(words) > 2:
        rest = words[2]
        if rest.startswith("devices="):
            extra["devices"] = rest.removeprefix("devices=")
        else:
            extra["note"] = rest.strip(" ()")
    return backend, extra


if __name__ == "__main__":
    sys.exit(main())
