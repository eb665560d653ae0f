"""Energy, power and clocks per cell (orchestrator/job/energy.py), driven through a fake
NVML the way the sidecar drives the real one, each figure against hand arithmetic."""

from __future__ import annotations

import csv
import io
from collections.abc import Callable
from pathlib import Path

import pytest

from orchestrator.job import energy as e
from orchestrator.job.sidecar import read_samples, row_figures
from orchestrator.job.utilisation import Window

NOT_SUPPORTED, TIMEOUT = 3, 10


class FakeNvmlError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value


class FakeNvml:
    """One GPU per handle, each figure a function of the fake clock ``now``.

    ``energy_mj``/``power_mw``/…: handle -> f(now) (None: the GPU does not give it).
    """

    NVMLError = FakeNvmlError
    NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_TEMPERATURE_GPU = 1, 2, 0

    def __init__(self) -> None:
        self.now = 0.0
        self.figures: dict[str, dict[str, Callable[[float], int] | None]] = {}
        self.calls: list[tuple[str, str]] = []
        self.fail_once: set[tuple[str, str]] = set()

    def _get(self, figure: str, handle: str) -> int:
        self.calls.append((figure, handle))
        if (figure, handle) in self.fail_once:
            self.fail_once.discard((figure, handle))
            raise FakeNvmlError(TIMEOUT)
        f = self.figures[handle].get(figure)
        if f is None:
            raise FakeNvmlError(NOT_SUPPORTED)
        return f(self.now)

    def nvmlDeviceGetTotalEnergyConsumption(self, h: str) -> int:
        return self._get("energy", h)

    def nvmlDeviceGetPowerUsage(self, h: str) -> int:
        return self._get("power", h)

    def nvmlDeviceGetClockInfo(self, h: str, clock: int) -> int:
        return self._get("sm" if clock == self.NVML_CLOCK_SM else "mem", h)

    def nvmlDeviceGetTemperature(self, h: str, sensor: int) -> int:
        return self._get("temp", h)

    def nvmlDeviceGetEnforcedPowerLimit(self, h: str) -> int:
        return self._get("limit", h)

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: str) -> int:
        return self._get("reasons", h)


def gpu(watts: Callable[[float], float], start_mj: int = 0, **more: Callable[[float], int] | None):
    """A GPU drawing ``watts(t)``: its counter (the integral, in mJ, from ``start_mj``,
    wrapping at 2**64) and its power reading; the rest constant unless given."""
    step = 0.001  # the counter integrates finely, as the GPU's own does

    def counter(t: float) -> int:
        n = round(t / step)
        joules = sum(watts(i * step) * step for i in range(n))
        return (start_mj + round(joules * 1000)) % 2**64

    figures: dict[str, Callable[[float], int] | None] = {
        "energy": counter,
        "power": lambda t: round(watts(t) * 1000),
        "sm": lambda t: 1980,
        "mem": lambda t: 2619,
        "temp": lambda t: 40,
        "limit": lambda t: 700_000,
        "reasons": lambda t: 0,
    }
    figures.update(more)
    return figures


def sample(nv: FakeNvml, handles: dict[int, str], until: float, every: float):
    """The sidecar's loop: a reading of every GPU each ``every`` seconds from 0 to ``until``."""
    reader = e.NvmlConditions(nv, handles)
    rows: list[tuple[float, str, str, int]] = []
    for i in range(round(until / every) + 1):
        nv.now = i * every
        rows += [(nv.now, kind, str(index), value) for kind, index, value in reader.read()]
    return rows, reader


MEASURED = Window("measured", 2.25, 7.25)


def test_the_counter_over_the_window_edges_interpolated() -> None:
    nv = FakeNvml()
    nv.figures = {"a": gpu(lambda t: 300.0), "b": gpu(lambda t: 200.0)}
    rows, _ = sample(nv, {0: "a", 1: "b"}, until=10.0, every=0.5)
    s = e.summarize(rows, [MEASURED])
    # 5 s at 300 W and at 200 W; the edges fall between samples
    assert s["energy_j"] == pytest.approx(300 * 5 + 200 * 5, abs=0.01)
    assert s["energy_source"] == e.SOURCE_COUNTER and s["energy_window"] == "measured"
    assert s["power_mean_w"] == pytest.approx(250.0, abs=0.01)  # per GPU
    assert s["energy_devices"] == 2
    per = s["gpu_conditions_per_device"]
    assert per["0"]["energy_j"] == pytest.approx(1500.0, abs=0.01)
    # the power samples' integral is kept beside the counter's, for the GPU acceptance check
    assert per["0"]["power_samples_j"] == pytest.approx(1500.0)
    assert per["1"]["energy_j"] == pytest.approx(1000.0, abs=0.01)


def test_a_counter_that_wraps_around() -> None:
    nv = FakeNvml()
    # one joule before the counter's 64 bits run out: it wraps in the first second
    nv.figures = {"a": gpu(lambda t: 300.0, start_mj=2**64 - 1000)}
    rows, _ = sample(nv, {0: "a"}, until=10.0, every=0.5)
    counters = [v for _, kind, _, v in rows if kind == e.GPU_ENERGY]
    assert counters[0] > counters[-1]  # it did wrap
    s = e.summarize(rows, [MEASURED])
    assert s["energy_j"] == pytest.approx(1500.0, abs=0.01)
    assert s["energy_source"] == e.SOURCE_COUNTER
    # RAPL's counter wraps at its zone's range, in microjoules
    span = 262_143_328_850
    rapl = [(0.0, e.CPU_ENERGY_RANGE, "package-0", span)]
    rapl += [
        (t, e.CPU_ENERGY, "package-0", (span - 50_000_000 + round(t * 80e6)) % span)
        for t in (0.0, 1.0, 2.0, 3.0, 4.0)
    ]
    s = e.summarize(rapl, [Window("measured", 0.5, 3.5)])
    assert s["energy_j"] == pytest.approx(80.0 * 3)  # 80 W for 3 s across the wrap
    assert s["energy_source"] == e.SOURCE_RAPL and s["power_mean_w"] == pytest.approx(80.0)
    assert "whole CPU package" in s["energy_note"]


def test_a_counter_reset_falls_back_to_the_power_samples() -> None:
    nv = FakeNvml()
    fine = gpu(lambda t: 300.0, start_mj=5_000_000)["energy"]
    assert fine is not None
    # the driver reloads at t = 4: the counter starts again from 0
    reset = gpu(lambda t: 300.0, energy=lambda t: fine(t) if t < 4 else round((t - 4) * 300e3))
    nv.figures = {"a": reset}
    rows, _ = sample(nv, {0: "a"}, until=10.0, every=0.5)
    s = e.summarize(rows, [MEASURED])
    assert s["energy_source"] == e.SOURCE_POWER
    assert s["energy_j"] == pytest.approx(1500.0)


def test_power_samples_only() -> None:
    nv = FakeNvml()
    # no energy counter (before Volta); power rises 20 W a second from 100 W
    nv.figures = {"a": gpu(lambda t: 100.0 + 20.0 * t, energy=None)}
    rows, reader = sample(nv, {0: "a"}, until=10.0, every=1.0)
    assert (0, e.GPU_ENERGY) in reader.unsupported
    assert sum(1 for f, _ in nv.calls if f == "energy") == 1  # asked once
    window = Window("measured", 2.5, 7.5)
    s = e.summarize(rows, [window])
    # ∫ (100 + 20 t) dt from 2.5 to 7.5 = 500 + 10 (7.5² - 2.5²) = 1000 J: trapezoids are
    # exact on a line, the edges interpolated
    assert s["energy_j"] == pytest.approx(1000.0)
    assert s["energy_source"] == e.SOURCE_POWER
    assert s["power_mean_w"] == pytest.approx(200.0)


def test_power_samples_with_a_gap_are_not_trusted() -> None:
    rows = [(t, e.GPU_POWER, "0", 300_000) for t in (0.0, 1.0, 2.0, 8.0, 9.0, 10.0)]
    s = e.summarize(rows, [Window("measured", 0.5, 9.5)])
    assert "energy_j" not in s
    assert "gap of 6.0 s" in s["energy_note"]


def test_neither_counter_nor_power() -> None:
    nv = FakeNvml()
    nv.figures = {"a": gpu(lambda t: 300.0, energy=None, power=None)}
    rows, _ = sample(nv, {0: "a"}, until=10.0, every=0.5)
    s = e.summarize(rows, [MEASURED])
    assert "energy_j" not in s and "power_mean_w" not in s
    assert s["energy_note"] == "no energy figure: GPU 0 has no energy counter; no power samples"
    # the clocks are still there
    assert s["gpu_sm_clock_min_mhz"] == 1980
    # one GPU of two without figures: no total (it would leave that GPU out)
    nv = FakeNvml()
    nv.figures = {"a": gpu(lambda t: 300.0), "b": gpu(lambda t: 1.0, energy=None, power=None)}
    rows, _ = sample(nv, {0: "a", 1: "b"}, until=10.0, every=0.5)
    s = e.summarize(rows, [MEASURED])
    assert "energy_j" not in s and s["energy_note"].startswith("no energy figure: GPU 1 has")


def test_throttle_reasons_mid_window() -> None:
    nv = FakeNvml()
    # from t = 5 the GPU hits its power cap and its SM clock falls; idle now and then
    # (not a slowdown); it heats up
    nv.figures = {
        "a": gpu(
            lambda t: 300.0,
            reasons=lambda t: (0x4 if t >= 5 else 0) | (0x1 if t == 1 else 0),
            sm=lambda t: 1500 if t >= 5 else 1980,
            temp=lambda t: 40 + round(t),
        ),
        "b": gpu(lambda t: 300.0),
    }
    rows, _ = sample(nv, {0: "a", 1: "b"}, until=10.0, every=1.0)
    s = e.summarize(rows, [Window("measured", 0.0, 10.0)])
    # samples at 0..10: 11 in the window, 6 of them (5..10) capped
    assert s["gpu_throttled_pct"] == pytest.approx(100 * 6 / 11)
    assert s["gpu_clock_reasons"] == "sw power cap 55%"  # idle is not shown
    assert s["gpu_sm_clock_min_mhz"] == 1500
    assert s["gpu_sm_clock_median_mhz"] == 1500  # the slower GPU's median (6 of 11 at 1500)
    assert s["gpu_conditions_per_device"]["1"]["sm_clock_median_mhz"] == 1980
    assert s["gpu_mem_clock_min_mhz"] == 2619
    assert s["gpu_temp_max_c"] == 50
    assert s["gpu_power_limit_w"] == 700.0
    assert s["gpu_conditions"] == "700 W limit, throttled (sw power cap)"
    # a window before the cap: not throttled
    s = e.summarize(rows, [Window("measured", 0.0, 4.0)])
    assert s["gpu_throttled_pct"] == 0 and s["gpu_clock_reasons"] == "none"
    assert s["gpu_conditions"] == "700 W limit"
    # a window that caught the cap at its last sample: 1 of 6 samples is past the mark
    s = e.summarize(rows, [Window("measured", 0.0, 5.0)])
    assert s["gpu_throttled_pct"] == pytest.approx(100 / 6)
    assert s["gpu_conditions"] == "700 W limit, throttled (sw power cap)"
    # ... and 1 of 11 is not (sampled twice as often)
    rows, _ = sample(nv, {0: "a", 1: "b"}, until=10.0, every=0.5)
    s = e.summarize(rows, [Window("measured", 0.0, 5.0)])
    assert s["gpu_throttled_pct"] == pytest.approx(100 / 11)
    assert s["gpu_conditions"] == "700 W limit"


def test_a_passing_error_skips_a_sample_and_a_limit_is_written_when_it_changes() -> None:
    nv = FakeNvml()
    nv.figures = {"a": gpu(lambda t: 300.0, limit=lambda t: 700_000 if t < 3 else 500_000)}
    nv.fail_once = {("energy", "a")}
    rows, reader = sample(nv, {0: "a"}, until=5.0, every=1.0)
    energy = [t for t, kind, _, _ in rows if kind == e.GPU_ENERGY]
    assert energy == [1.0, 2.0, 3.0, 4.0, 5.0] and not reader.unsupported
    limits = [(t, v) for t, kind, _, v in rows if kind == e.GPU_POWER_LIMIT]
    assert limits == [(0.0, 700_000), (3.0, 500_000)]
    s = e.summarize(rows, [Window("measured", 1.5, 4.5)])
    assert s["gpu_power_limit_w"] == 500.0  # the lowest in force over the window
    # two GPUs under different limits: said
    other = [
        (0.0, e.GPU_POWER_LIMIT, "1", 700_000),
        *((t, e.GPU_SM_CLOCK, "1", 1980) for t in range(6)),
    ]
    s = e.summarize(rows + other, [Window("measured", 1.5, 4.5)])
    assert s["gpu_power_limit_note"] == "GPUs under different power limits: 500 W, 700 W"


def test_no_window_no_figure() -> None:
    nv = FakeNvml()
    nv.figures = {"a": gpu(lambda t: 300.0)}
    rows, _ = sample(nv, {0: "a"}, until=5.0, every=1.0)
    assert e.summarize(rows, [])["energy_note"].endswith("do not say when its measured steps ran")
    s = e.summarize(rows, [Window("measured", 4.0, 9.0)])
    assert s == {"energy_note": "no energy figure: the samples do not cover the measured steps"}
    assert e.summarize([]) == {}


def _zone(root: Path, name: str, label: str, uj: int = 1000, span: int = 10**9) -> None:
    (root / name).mkdir()
    (root / name / "name").write_text(label + "\n")
    (root / name / "energy_uj").write_text(f"{uj}\n")
    (root / name / "max_energy_range_uj").write_text(f"{span}\n")


def test_rapl_zones_are_the_packages_once(tmp_path, monkeypatch) -> None:
    _zone(tmp_path, "intel-rapl:0", "package-0")
    _zone(tmp_path, "intel-rapl:0:0", "core")  # a part of package 0
    _zone(tmp_path, "intel-rapl:0:1", "dram")
    _zone(tmp_path, "intel-rapl:1", "package-1", uj=7, span=5 * 10**8)
    _zone(tmp_path, "intel-rapl-mmio:0", "package-0")  # package 0 again
    _zone(tmp_path, "intel-rapl:2", "psys")  # the platform: packages and more
    zones, why = e.rapl_zones(tmp_path)
    assert why == ""
    assert [(z.name, z.range_uj, z.read()) for z in zones] == [
        ("package-0", 10**9, 1000),
        ("package-1", 5 * 10**8, 7),
    ]
    # none at all, and none readable by this user
    assert "does not exist" in e.rapl_zones(tmp_path / "none")[1]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert e.rapl_zones(empty)[1].startswith("no RAPL package zone under")
    original = Path.read_text

    def denied(self: Path, *args, **kwargs) -> str:
        if self.name == "energy_uj":
            raise PermissionError(13, "Permission denied")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", denied)
    zones, why = e.rapl_zones(tmp_path)
    assert zones == [] and why.startswith("RAPL is not readable by this user")


def test_throttle_reasons_under_a_driver_older_than_the_bindings_name() -> None:
    """nvidia-ml-py 12.535+ names it ClocksEventReasons; a driver before 535 lacks that
    symbol (function not found): the older ClocksThrottleReasons is read instead."""
    nv = FakeNvml()
    nv.figures = {"a": gpu(lambda t: 300.0, reasons=lambda t: 0x4)}

    def not_in_this_driver(h: str) -> int:
        raise FakeNvmlError(13)

    nv.nvmlDeviceGetCurrentClocksEventReasons = not_in_this_driver  # type: ignore[method-assign]
    nv.nvmlDeviceGetCurrentClocksThrottleReasons = lambda h: nv._get("reasons", h)  # type: ignore[attr-defined]
    nv.figures["b"] = gpu(lambda t: 300.0, reasons=lambda t: 0x20)
    rows, reader = sample(nv, {0: "a", 1: "b"}, until=2.0, every=1.0)
    assert [v for _, kind, _, v in rows if kind == e.GPU_CLOCK_REASONS] == [4, 32] * 3
    assert not reader.unsupported
    # a driver that gives no reasons at all: throttling unknown, not "not throttled"
    nv = FakeNvml()
    nv.figures = {"a": gpu(lambda t: 300.0, reasons=None)}
    rows, _ = sample(nv, {0: "a"}, until=10.0, every=1.0)
    s = e.summarize(rows, [Window("measured", 1.0, 9.0)])
    assert s["gpu_conditions"] == "700 W limit, throttling unknown"
    assert "gpu_throttled_pct" not in s


def test_a_counter_that_does_not_rise_or_a_stalled_edge_is_not_used() -> None:
    # GPU 1's counter is frozen: not 0 J in the total, its power samples instead
    nv = FakeNvml()
    nv.figures = {"a": gpu(lambda t: 300.0), "b": gpu(lambda t: 200.0, energy=lambda t: 7)}
    rows, _ = sample(nv, {0: "a", 1: "b"}, until=10.0, every=0.5)
    s = e.summarize(rows, [MEASURED])
    assert s["energy_j"] == pytest.approx(1500.0 + 1000.0, abs=0.01)
    assert s["energy_source"] == f"{e.SOURCE_COUNTER} + {e.SOURCE_POWER}"
    # the sidecar stalled 3 s across the window's start: the counter's edge is not trusted
    stalled = [r for r in rows if r[2] == "0" and not 1.0 < r[0] < 4.0]
    s = e.summarize(stalled, [Window("measured", 2.5, 9.5)])
    assert "energy_j" not in s and "gap of 3.0 s at an edge" in s["energy_note"]


def test_a_multi_node_job_gets_no_cell_total() -> None:
    figures = {"energy_j": 9000.0, "energy_devices": 8, "power_mean_w": 600.0, "gpu_util": 1}
    one = e.of_first_node(figures, 2)
    assert "energy_j" not in one and "energy_devices" not in one
    assert one["power_mean_w"] == 600.0
    assert one["energy_note"] == "no energy figure: the sidecar read the first of 2 nodes only"
    assert e.of_first_node(figures, 1) == figures


def test_a_shared_launchs_cut_keeps_the_states_and_a_quoted_reason(tmp_path) -> None:
    """A shared launch cuts the sidecar's samples per run: the states before the cut (the
    power limit, RAPL's range, a reason) come along, a reason's comma survives."""
    from orchestrator.job.shared import _cut_samples

    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(("timestamp", "kind", "source", "bytes"))
    writer.writerow(("1.000", e.GPU_POWER_LIMIT, "0", 700_000))
    writer.writerow(("1.000", e.ENERGY_NONE, "a reason, with a comma", 0))
    for t in range(2, 12):
        writer.writerow((f"{t}.000", e.GPU_ENERGY, "0", t * 300_000))
        writer.writerow((f"{t}.000", e.GPU_POWER, "0", 300_000))
    source, target = tmp_path / "launch.csv", tmp_path / "run.csv"
    source.write_text(text.getvalue())
    _cut_samples(source, target, start_unix=5.0, end_unix=9.0)
    rows = read_samples(target)
    assert rows[:2] == [
        (1.0, e.GPU_POWER_LIMIT, "0", 700_000),
        (1.0, e.ENERGY_NONE, "a reason, with a comma", 0),
    ]
    s = e.summarize(rows, [Window("measured", 5.5, 8.5)])
    assert s["energy_j"] == pytest.approx(900.0) and s["gpu_power_limit_w"] == 700.0


def test_the_reason_survives_the_csv(tmp_path) -> None:
    """A reason with commas goes through memory.csv whole."""
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(("timestamp", "kind", "source", "bytes"))
    writer.writerow(("1.000", e.ENERGY_NONE, "no RAPL here: a, b", 0))
    path = tmp_path / "memory.csv"
    path.write_text(text.getvalue())
    rows = read_samples(path)
    assert rows == [(1.0, e.ENERGY_NONE, "no RAPL here: a, b", 0)]
    assert row_figures(rows, [])["energy_note"] == "no RAPL here: a, b"
