"""Energy, power and the conditions of a measurement, from the sidecar's samples.

The sidecar (``orchestrator.job.sidecar``) writes, beside its memory samples,
at every sample of a GPU job, for each of its GPUs (``NvmlConditions``):

- ``gpu_energy_mj``: NVML's total-energy counter (millijoules since the driver
  loaded; Volta and later);
- ``gpu_power_mw``: NVML's power reading (on Ampere and later a one-second
  average, so it smears what happens within a second);
- ``gpu_sm_mhz`` and ``gpu_mem_mhz``: the SM and memory clocks;
- ``gpu_temp_c``: the GPU's temperature;
- ``gpu_clock_reasons``: the bitmask of why the clocks are below their
  maximum (NVML's clock event reasons, formerly throttle reasons);
- ``gpu_power_limit_mw``: the enforced power limit, when it changes.

A figure a GPU does not give (not supported, no permission) is asked once and
then no more. On a CPU job it reads RAPL instead (``rapl_zones``): the energy
counter of each CPU package (``/sys/class/powercap/intel-rapl:N``, whose name
is ``package-N``), once per sample, as ``rapl_uj`` with the zone's name as the
source and its wrap-around range once as ``rapl_range_uj``. Only the top-level
package zones count: their subzones (core, uncore, dram) are parts of the
package or beside it, and ``intel-rapl-mmio`` repeats a package, so adding
them would count energy twice. Where nothing can be read, one ``energy_none``
sample says why.

``summarize`` turns them into the row's figures over the window the
utilisation figures use (``orchestrator.job.utilisation.windows_of``: the
measured steps, the window tokens/s covers, where the child's files say when
they ran):

- energy: the counter's rise over the window, each edge interpolated between
  the samples either side of it; a counter that wraps (RAPL's, at its range;
  NVML's, at 2**64) is unwrapped sample by sample, and one that jumps beyond
  ``MAX_WATTS`` (a reset) is not used. Without a usable counter, the power
  samples integrated over the window (trapezoids), and ``energy_source`` says
  which. With neither, no figure and ``energy_note`` says why: never 0.
- conditions, per GPU: the SM and memory clocks' minimum and median, the
  highest temperature, the enforced power limit, and the share of samples
  carrying each clock event reason. A reason in ``THROTTLE_REASONS`` is a
  slowdown; ``gpu_throttled_pct`` is the share of samples of the most throttled GPU
  carrying one.

Per-token figures are the report's (``orchestrator.results.aggregate``): the
energy over the measured window divided by the tokens measured in it.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from orchestrator.contract.columns import THROTTLED_SHARE
from orchestrator.job.utilisation import Window

#: sample kinds of memory.csv (the value column holds the integer)
GPU_ENERGY = "gpu_energy_mj"
GPU_POWER = "gpu_power_mw"
GPU_SM_CLOCK = "gpu_sm_mhz"
GPU_MEM_CLOCK = "gpu_mem_mhz"
GPU_TEMP = "gpu_temp_c"
GPU_CLOCK_REASONS = "gpu_clock_reasons"
GPU_POWER_LIMIT = "gpu_power_limit_mw"
CPU_ENERGY = "rapl_uj"
CPU_ENERGY_RANGE = "rapl_range_uj"
ENERGY_NONE = "energy_none"
#: the kinds that are states (written when they change), not samples
STATES = (GPU_POWER_LIMIT, CPU_ENERGY_RANGE, ENERGY_NONE)

#: where RAPL's zones are
POWERCAP = Path("/sys/class/powercap")
#: NVML's energy counter is an unsigned 64-bit count of millijoules
NVML_COUNTER_RANGE = 2**64
#: a counter rising faster than this (watts, one GPU or one CPU package) has been
#: reset, not used: no device draws it
MAX_WATTS = 5000.0
#: the largest gap between power samples, as a share of the window (and at least
#: ``MIN_GAP_S``), over which integrating them is still trusted
MAX_GAP_SHARE = 0.1
MIN_GAP_S = 1.0

SOURCE_COUNTER = "nvml energy counter"
SOURCE_POWER = "nvml power samples"
SOURCE_RAPL = "rapl package counter"

#: NVML's clock event reasons (``nvmlClocksEventReason*``): bit -> name as shown
REASONS: dict[int, str] = {
    0x1: "idle",
    0x2: "applications clocks",
    0x4: "sw power cap",
    0x8: "hw slowdown",
    0x10: "sync boost",
    0x20: "sw thermal",
    0x40: "hw thermal",
    0x80: "hw power brake",
    0x100: "display clocks",
    0x200: "board limit",
    0x400: "reliability",
}
#: the reasons that slow a GPU below the clocks it was set to (not: idle, a clock
#: setting chosen by the user, the display)
THROTTLE_REASONS = 0x4 | 0x8 | 0x10 | 0x20 | 0x40 | 0x80 | 0x200 | 0x400

#: NVML error codes that do not go away: not supported, no permission, function not found
_PERMANENT_ERRORS = {3, 4, 13}
_FUNCTION_NOT_FOUND = 13


# ---------------------------------------------------------------------------
# Reading (in the sidecar)
# ---------------------------------------------------------------------------


class NvmlLike(Protocol):
    """The part of ``pynvml`` read here."""

    NVMLError: type[Exception]
    NVML_CLOCK_SM: int
    NVML_CLOCK_MEM: int
    NVML_TEMPERATURE_GPU: int

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int: ...
    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int: ...
    def nvmlDeviceGetClockInfo(self, handle: Any, clock: int) -> int: ...
    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int: ...
    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int: ...


class NvmlConditions:
    """Reads the energy, power and clock figures of a job's GPUs, one call per sample."""

    def __init__(self, nv: NvmlLike, handles: Mapping[int, Any]) -> None:
        self.nv = nv
        self.handles = dict(handles)
        #: (device, kind) pairs the driver cannot give: not asked again
        self.unsupported: set[tuple[int, str]] = set()
        self._limit: dict[int, int] = {}
        # the name changed in NVML 12.2: clock "event" reasons, formerly "throttle" reasons
        self._reasons = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
            nv, "nvmlDeviceGetCurrentClocksThrottleReasons", None
        )

    def _calls(self) -> list[tuple[str, Any]]:
        nv = self.nv
        calls: list[tuple[str, Any]] = [
            (GPU_ENERGY, nv.nvmlDeviceGetTotalEnergyConsumption),
            (GPU_POWER, nv.nvmlDeviceGetPowerUsage),
            (GPU_SM_CLOCK, lambda h: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)),
            (GPU_MEM_CLOCK, lambda h: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM)),
            (GPU_TEMP, lambda h: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)),
            (GPU_POWER_LIMIT, nv.nvmlDeviceGetEnforcedPowerLimit),
        ]
        if self._reasons is not None:
            # the function in force at the call: the older name once a device lacked the newer
            calls.append((GPU_CLOCK_REASONS, lambda h: self._reasons(h)))
        return calls

    def _older_reasons(self, handle: Any) -> int | None:
        """The reasons by NVML's older name, for a driver that lacks the newer (before
        535); from then on the older is read. None where it cannot be read either."""
        older = getattr(self.nv, "nvmlDeviceGetCurrentClocksThrottleReasons", None)
        if older is None or older is self._reasons:
            return None
        self._reasons = older
        try:
            return int(older(handle))
        except self.nv.NVMLError:
            return None

    def read(self) -> list[tuple[str, int, int]]:
        """``(kind, device, value)`` of one sample; the power limit only when it changed."""
        out: list[tuple[str, int, int]] = []
        calls = self._calls()
        for index, handle in self.handles.items():
            for kind, call in calls:
                if (index, kind) in self.unsupported:
                    continue
                try:
                    value = int(call(handle))
                except self.nv.NVMLError as exc:
                    code = getattr(exc, "value", None)
                    retried = None
                    if kind == GPU_CLOCK_REASONS and code == _FUNCTION_NOT_FOUND:
                        retried = self._older_reasons(handle)
                    if retried is None:
                        if code in _PERMANENT_ERRORS:
                            self.unsupported.add((index, kind))
                        continue  # a passing error (a timeout): this sample goes without
                    value = retried
                if kind == GPU_POWER_LIMIT:
                    if self._limit.get(index) == value:
                        continue
                    self._limit[index] = value
                out.append((kind, index, value))
        return out


@dataclass(frozen=True)
class RaplZone:
    """One CPU package's energy counter."""

    name: str
    path: Path
    range_uj: int

    def read(self) -> int | None:
        try:
            return int((self.path / "energy_uj").read_text().strip())
        except (OSError, ValueError):
            return None


def rapl_zones(root: Path = POWERCAP) -> tuple[list[RaplZone], str]:
    """The CPU packages' RAPL counters that can be read, and why there are none
    where there are none (``""`` when some are found)."""
    try:
        found = sorted(
            p for p in root.iterdir() if p.name.startswith("intel-rapl:") and p.name.count(":") == 1
        )
    except OSError:
        return [], f"no RAPL here: {root} does not exist (no powercap driver on this machine)"
    zones: list[RaplZone] = []
    unreadable: list[str] = []
    names: set[str] = set()
    for path in found:
        try:
            name = (path / "name").read_text().strip()
        except OSError:
            continue
        if not name.startswith("package") or name in names:
            continue
        try:
            int((path / "energy_uj").read_text().strip())
            span = int((path / "max_energy_range_uj").read_text().strip())
        except PermissionError:
            unreadable.append(str(path / "energy_uj"))
            continue
        except (OSError, ValueError):
            continue
        names.add(name)
        zones.append(RaplZone(name=name, path=path, range_uj=span))
    if zones:
        return zones, ""
    if unreadable:
        return [], (
            f"RAPL is not readable by this user ({unreadable[0]}: root only, as Linux "
            "has made it since 5.10)"
        )
    return [], f"no RAPL package zone under {root} (this machine exposes no CPU package energy)"


# ---------------------------------------------------------------------------
# Arithmetic over a window (pure)
# ---------------------------------------------------------------------------


def _at(t0: float, v0: float, t1: float, v1: float, t: float) -> float:
    """The value at ``t`` on the line through ``(t0, v0)`` and ``(t1, v1)``."""
    return v0 if t1 <= t0 else v0 + (v1 - v0) * (t - t0) / (t1 - t0)


def _covers(times: Sequence[float], window: Window) -> bool:
    return bool(times) and times[0] <= window.start and times[-1] >= window.end


def counter_energy(
    samples: Sequence[tuple[float, int]], window: Window, span: int, scale: float
) -> tuple[float | None, str]:
    """Joules a counter rose by over ``window``, and why there is no figure.

    ``samples``: ``(time, reading)``, readings in units of ``scale`` joules,
    wrapping at ``span``. Each step between samples is taken modulo ``span``;
    a step implying more than ``MAX_WATTS`` is a reset, and the counter is not used.
    Each edge of the window is interpolated between the samples either side.
    """
    ordered = sorted(samples)
    times = [t for t, _ in ordered]
    if not _covers(times, window):
        return None, "its samples do not cover the window"
    gap = _edge_gap(times, window)
    if gap > _largest_gap(window):
        return None, f"its samples leave a gap of {gap:.1f} s at an edge of the window"
    # the counter unwrapped: joules since the first sample
    joules = [0.0]
    for (t0, c0), (t1, c1) in itertools.pairwise(ordered):
        step = ((c1 - c0) % span) * scale
        if step > MAX_WATTS * max(t1 - t0, 1e-3):
            return None, f"the counter jumped by {step:.0f} J in {t1 - t0:.2f} s (a reset)"
        joules.append(joules[-1] + step)
    return _rise(times, joules, window), ""


def _largest_gap(window: Window) -> float:
    """The longest span without a sample over which ``window``'s figure is still trusted."""
    return max(MIN_GAP_S, MAX_GAP_SHARE * (window.end - window.start))


def _edge_gap(times: Sequence[float], window: Window) -> float:
    """The longest span between the samples either side of an edge of ``window``: what
    interpolating the edge assumes was steady."""
    gaps = []
    for edge in (window.start, window.end):
        before = max((t for t in times if t <= edge), default=edge)
        after = min((t for t in times if t >= edge), default=edge)
        gaps.append(after - before)
    return max(gaps)


def _rise(times: Sequence[float], values: Sequence[float], window: Window) -> float:
    """``values`` (a running total at ``times``) at the window's end less at its start."""

    def value_at(t: float) -> float:
        for i in range(1, len(times)):
            if times[i] >= t:
                return _at(times[i - 1], values[i - 1], times[i], values[i], t)
        return values[-1]

    return value_at(window.end) - value_at(window.start)


def power_energy(samples: Sequence[tuple[float, int]], window: Window) -> tuple[float | None, str]:
    """Joules from power samples (milliwatts) over ``window``: trapezoids, each edge
    interpolated; none where the samples do not cover the window or leave a gap
    over ``MAX_GAP_SHARE`` of it."""
    ordered = sorted(samples)
    times = [t for t, _ in ordered]
    if not _covers(times, window):
        return None, "its power samples do not cover the window"
    inside = [t for t in times if window.start < t < window.end]
    edges = [window.start, *inside, window.end]
    gap = max(b - a for a, b in itertools.pairwise(edges))
    if gap > _largest_gap(window):
        return None, f"its power samples leave a gap of {gap:.1f} s"
    total = [0.0]
    for (t0, p0), (t1, p1) in itertools.pairwise(ordered):
        total.append(total[-1] + (t1 - t0) * (p0 + p1) / 2 / 1000)
    return _rise(times, total, window), ""


@dataclass(frozen=True)
class DeviceEnergy:
    joules: float | None
    source: str
    why: str = ""


def gpu_energy(
    counter: Sequence[tuple[float, int]], power: Sequence[tuple[float, int]], window: Window
) -> DeviceEnergy:
    """One GPU's energy over ``window``: its counter, else its power samples."""
    why = "no energy counter"
    if counter:
        joules, why = counter_energy(counter, window, NVML_COUNTER_RANGE, 1e-3)
        if joules is not None and joules > 0:
            return DeviceEnergy(joules, SOURCE_COUNTER)
        why = f"the energy counter: {why or 'it did not rise over the window'}"
    if power:
        joules, more = power_energy(power, window)
        if joules is not None and joules > 0:
            return DeviceEnergy(joules, SOURCE_POWER)
        why = f"{why}; {more or 'its power samples read 0 W'}"
    else:
        why = f"{why}; no power samples"
    return DeviceEnergy(None, "", why)


def share_text(shares: Mapping[str, float]) -> str:
    """``{"sw power cap": 0.42}`` -> ``"sw power cap 42%"``, largest first."""
    ordered = sorted(shares.items(), key=lambda kv: (-kv[1], kv[0]))
    return ", ".join(f"{name} {100 * share:.0f}%" for name, share in ordered if share > 0)


def _conditions(by_kind: Mapping[str, list[tuple[float, int]]], window: Window) -> dict[str, Any]:
    """One GPU's conditions over ``window``: clocks, temperature, limit, reasons."""
    out: dict[str, Any] = {}

    def inside(kind: str) -> list[int]:
        return [v for t, v in by_kind.get(kind, []) if window.holds(t)]

    for kind, name in ((GPU_SM_CLOCK, "sm_clock"), (GPU_MEM_CLOCK, "mem_clock")):
        values = inside(kind)
        if values:
            out[f"{name}_min_mhz"] = min(values)
            out[f"{name}_median_mhz"] = statistics.median(values)
    temps = inside(GPU_TEMP)
    if temps:
        out["temp_max_c"] = max(temps)
    # the limits in force over the window: the last set before it, and any set in it
    limits = by_kind.get(GPU_POWER_LIMIT, [])
    before = [v for t, v in limits if t <= window.start]
    seen = before[-1:] + [v for t, v in limits if window.holds(t)]
    if seen:
        out["power_limit_w"] = min(seen) / 1000
    reasons = inside(GPU_CLOCK_REASONS)
    if reasons:
        out["reasons"] = {
            name: sum(1 for r in reasons if r & bit) / len(reasons)
            for bit, name in REASONS.items()
            if bit != 0x1 and any(r & bit for r in reasons)
        }
        out["throttled_share"] = sum(1 for r in reasons if r & THROTTLE_REASONS) / len(reasons)
    return out


def summarize(
    rows: Iterable[tuple[float, str, str, int]], windows: Sequence[Window] = ()
) -> dict[str, Any]:
    """The energy and conditions figures of a row from the sidecar's samples.

    ``windows``: the spans to try, best first (``utilisation.windows_of``); the
    first that the samples cover is used, else none (energy over a job's whole
    life, model loading included, is not what tokens/s measured).
    """
    gpu: dict[str, dict[str, list[tuple[float, int]]]] = {}
    rapl: dict[str, list[tuple[float, int]]] = {}
    spans: dict[str, int] = {}
    none = ""
    times: list[float] = []
    for t, kind, source, value in rows:
        if kind in _GPU_KINDS:
            gpu.setdefault(source, {}).setdefault(kind, []).append((t, value))
            times.append(t)
        elif kind == CPU_ENERGY:
            rapl.setdefault(source, []).append((t, value))
            times.append(t)
        elif kind == CPU_ENERGY_RANGE:
            spans[source] = value
        elif kind == ENERGY_NONE:
            none = source
    if not gpu and not rapl:
        return {"energy_note": none} if none else {}
    times.sort()
    window = next((w for w in windows if _covers(times, w)), None)
    if window is None:
        why = (
            "the samples do not cover the measured steps"
            if windows
            else "the run's files do not say when its measured steps ran"
        )
        return {"energy_note": f"no energy figure: {why}"}
    out: dict[str, Any] = {"energy_window": window.name}
    seconds = window.end - window.start
    if gpu:
        out.update(_gpu_figures(gpu, window, seconds))
    else:
        out.update(_rapl_figures(rapl, spans, window, seconds))
    return out


def of_first_node(figures: Mapping[str, Any], nodes: int) -> dict[str, Any]:
    """A job over ``nodes`` nodes, summarised from its first node's sidecar: the energy
    is that node's alone, so the cell gets no total (each GPU's power still holds)."""
    if nodes <= 1 or "energy_j" not in figures:
        return dict(figures)
    out = {k: v for k, v in figures.items() if k not in ("energy_j", "energy_devices")}
    out["energy_note"] = f"no energy figure: the sidecar read the first of {nodes} nodes only"
    return out


_GPU_KINDS = {
    GPU_ENERGY,
    GPU_POWER,
    GPU_SM_CLOCK,
    GPU_MEM_CLOCK,
    GPU_TEMP,
    GPU_CLOCK_REASONS,
    GPU_POWER_LIMIT,
}


def _gpu_figures(
    gpu: Mapping[str, Mapping[str, list[tuple[float, int]]]], window: Window, seconds: float
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    per_device: dict[str, dict[str, Any]] = {}
    energies: dict[str, DeviceEnergy] = {}
    for device in sorted(gpu, key=_device_order):
        kinds = gpu[device]
        energy = gpu_energy(kinds.get(GPU_ENERGY, []), kinds.get(GPU_POWER, []), window)
        energies[device] = energy
        detail = _conditions(kinds, window)
        if energy.joules is not None:
            detail["energy_j"], detail["energy_source"] = energy.joules, energy.source
        if energy.source == SOURCE_COUNTER and kinds.get(GPU_POWER):
            # the power samples' integral beside the counter's: a check of either
            detail["power_samples_j"] = power_energy(kinds[GPU_POWER], window)[0]
        per_device[device] = detail
    missing = [d for d, e in energies.items() if e.joules is None]
    if missing:
        first = missing[0]
        out["energy_note"] = f"no energy figure: GPU {first} has {energies[first].why}" + (
            f" (and {len(missing) - 1} more GPU(s))" if len(missing) > 1 else ""
        )
    else:  # every GPU's energy is above 0 (``gpu_energy``)
        total = sum(e.joules or 0.0 for e in energies.values())
        out["energy_j"] = total
        out["energy_devices"] = len(energies)
        out["energy_source"] = " + ".join(sorted({e.source for e in energies.values()}))
        out["power_mean_w"] = total / seconds / len(energies)
    out.update(_pooled(per_device))
    out["gpu_conditions_per_device"] = per_device
    return out


def _device_order(device: str) -> tuple[int, str]:
    return (int(device), "") if device.isdigit() else (1 << 30, device)


def _pooled(per_device: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The row's conditions: the slowest GPU's clocks, the hottest, the lowest limit."""
    out: dict[str, Any] = {}
    details = list(per_device.values())

    def values(key: str) -> list[Any]:
        return [d[key] for d in details if key in d]

    for key, column, pick in (
        ("sm_clock_min_mhz", "gpu_sm_clock_min_mhz", min),
        ("sm_clock_median_mhz", "gpu_sm_clock_median_mhz", min),
        ("mem_clock_min_mhz", "gpu_mem_clock_min_mhz", min),
        ("mem_clock_median_mhz", "gpu_mem_clock_median_mhz", min),
        ("temp_max_c", "gpu_temp_max_c", max),
        ("power_limit_w", "gpu_power_limit_w", min),
    ):
        found = values(key)
        if found:
            out[column] = pick(found)
    limits = set(values("power_limit_w"))
    if len(limits) > 1:
        out["gpu_power_limit_note"] = "GPUs under different power limits: " + ", ".join(
            f"{w:g} W" for w in sorted(limits)
        )
    conditions = [f"{min(limits):g} W limit"] if limits else []
    shares = values("throttled_share")
    if shares:
        out["gpu_throttled_pct"] = 100 * max(shares)
        worst: dict[str, float] = {}
        for reasons in values("reasons"):
            for name, share in reasons.items():
                worst[name] = max(worst.get(name, 0.0), share)
        out["gpu_clock_reasons"] = share_text(worst) or "none"
        if max(shares) > THROTTLED_SHARE:
            slowdowns = [
                name
                for bit, name in REASONS.items()
                if bit & THROTTLE_REASONS and worst.get(name, 0.0) > THROTTLED_SHARE
            ]
            conditions.append("throttled (" + ", ".join(slowdowns or ["several reasons"]) + ")")
    elif details:
        # the driver gave no clock event reasons: not "not throttled"
        conditions.append("throttling unknown")
    if conditions:
        out["gpu_conditions"] = ", ".join(conditions)
    return out


def _rapl_figures(
    rapl: Mapping[str, list[tuple[float, int]]],
    spans: Mapping[str, int],
    window: Window,
    seconds: float,
) -> dict[str, Any]:
    total = 0.0
    for zone in sorted(rapl):
        span = spans.get(zone)
        if not span:
            return {"energy_note": f"no energy figure: RAPL {zone}: its wrap-around is unknown"}
        joules, why = counter_energy(rapl[zone], window, span, 1e-6)
        if joules is None:
            return {"energy_note": f"no energy figure: RAPL {zone}: {why}"}
        total += joules
    if not total > 0 or not seconds > 0:
        return {"energy_note": "no energy figure: the RAPL counters did not rise over the window"}
    return {
        "energy_j": total,
        "energy_devices": len(rapl),
        "energy_source": SOURCE_RAPL,
        "power_mean_w": total / seconds / len(rapl),
        "energy_note": "RAPL counts the whole CPU package(s): every process on them, "
        "not only this job",
    }
