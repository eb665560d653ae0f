"""Cool-down between cells (orchestrator/job/cooldown.py): the wait's rule, with a fake
thermometer and clock."""

from __future__ import annotations

import json

from orchestrator.job import cooldown


class FakeGpus:
    """Temperatures that fall by ``rate`` degrees a second from ``start``, on a fake clock."""

    def __init__(self, start: dict[str, float], rate: float = 0.0, floor: float = 30.0) -> None:
        self.start, self.rate, self.floor = start, rate, floor
        self.now = 0.0
        self.reads = 0

    def read(self) -> dict[str, int]:
        self.reads += 1
        return {d: round(max(self.floor, t - self.rate * self.now)) for d, t in self.start.items()}

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    def clock(self) -> float:
        return self.now


def test_the_first_cell_sets_the_mark_and_a_later_one_waits_for_it(tmp_path) -> None:
    mark = tmp_path / "cooldown.json"
    first = FakeGpus({"0": 38, "1": 41})
    record = cooldown.wait(
        mark, ["0", "1"], 300, read=first.read, sleep=first.sleep, clock=first.clock
    )
    assert record == {"wait_s": 0.0, "start_c": 41.0, "target_c": 44.0}
    assert json.loads(mark.read_text()) == {"start_c": 41.0}
    # the next cell's GPUs are at 60 and 52 °C, cooling 2 °C a second: 60 - 2t <= 44 at t = 8
    hot = FakeGpus({"0": 60, "1": 52}, rate=2.0)
    record = cooldown.wait(mark, ["0", "1"], 300, read=hot.read, sleep=hot.sleep, clock=hot.clock)
    assert record == {"wait_s": 8.0, "start_c": 44.0, "target_c": 44.0}
    # a cell already cool does not wait
    cool = FakeGpus({"0": 43})
    record = cooldown.wait(mark, ["0"], 300, read=cool.read, sleep=cool.sleep, clock=cool.clock)
    assert record["wait_s"] == 0.0 and cool.now == 0.0


def test_a_wait_that_runs_out_says_so(tmp_path) -> None:
    mark = tmp_path / "cooldown.json"
    mark.write_text(json.dumps({"start_c": 35.0}))
    stuck = FakeGpus({"0": 70}, rate=0.1)  # 70 - 0.1 t: 69 °C after 10 s
    record = cooldown.wait(mark, ["0"], 10, read=stuck.read, sleep=stuck.sleep, clock=stuck.clock)
    assert record["wait_s"] == 10.0 and record["start_c"] == 69.0
    assert record["note"] == "still 34 °C above the first cell's start after 10 s: launched warm"


def test_no_temperature_no_wait(tmp_path, monkeypatch) -> None:
    mark = tmp_path / "cooldown.json"
    record = cooldown.wait(mark, [], 300)
    assert record == {"wait_s": 0.0, "note": "no GPU temperature on the CPU: no wait"}
    record = cooldown.wait(mark, ["0"], 300, read=lambda: None)
    assert record["note"].startswith("the GPUs' temperature cannot be read") and not mark.exists()
    # where NVML cannot start (no driver), the real reader reads nothing
    import pynvml

    def no_driver() -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)

    monkeypatch.setattr(pynvml, "nvmlInit", no_driver)
    assert cooldown.nvml_reader(["0"])() is None
    record = cooldown.wait(mark, ["0"], 300)
    assert record["note"].startswith("the GPUs' temperature cannot be read")
