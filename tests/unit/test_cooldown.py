"""Cool-down between cells (orchestrator/job/cooldown.py): the wait's rule, with a fake
thermometer and clock."""

from __future__ import annotations

import json
import os
import sys
import threading
from types import SimpleNamespace
from typing import Any

import pytest

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


def test_each_gpu_waits_for_its_own_first_temperature(tmp_path) -> None:
    mark = tmp_path / "cooldown.json"
    first = FakeGpus({"GPU-a": 38, "GPU-b": 41})
    record = cooldown.wait(
        mark, ["0", "1"], 300, read=first.read, sleep=first.sleep, clock=first.clock
    )
    assert record == {"wait_s": 0.0, "start_c": 41.0, "target_c": 44.0}
    assert json.loads(mark.read_text()) == {"start_c": {"GPU-a": 38.0, "GPU-b": 41.0}}
    # the next cell's GPUs are at 60 and 52 °C, cooling 2 °C a second: a (mark 41) gets
    # there at t = 9.5, b (mark 44) at t = 4; the wait polls each second: 10 s
    hot = FakeGpus({"GPU-a": 60, "GPU-b": 52}, rate=2.0)
    record = cooldown.wait(mark, ["0", "1"], 300, read=hot.read, sleep=hot.sleep, clock=hot.clock)
    assert record == {"wait_s": 10.0, "start_c": 40.0, "target_c": 41.0}
    # a GPU not used before records its own first temperature, and does not wait
    other = FakeGpus({"GPU-c": 55})
    record = cooldown.wait(mark, ["2"], 300, read=other.read, sleep=other.sleep, clock=other.clock)
    assert record["wait_s"] == 0.0 and other.now == 0.0
    assert json.loads(mark.read_text())["start_c"]["GPU-c"] == 55.0


def test_a_wait_that_runs_out_says_so(tmp_path) -> None:
    mark = tmp_path / "cooldown.json"
    mark.write_text(json.dumps({"start_c": {"GPU-a": 35.0}}))
    stuck = FakeGpus({"GPU-a": 70}, rate=0.1)  # 70 - 0.1 t: 69 °C after 10 s
    record = cooldown.wait(mark, ["0"], 10, read=stuck.read, sleep=stuck.sleep, clock=stuck.clock)
    assert record["wait_s"] == 10.0 and record["start_c"] == 69.0
    assert record["note"] == "still 34 °C above its first temperature after 10 s: launched warm"


def test_a_stop_ends_the_wait(tmp_path) -> None:
    mark = tmp_path / "cooldown.json"
    mark.write_text(json.dumps({"start_c": {"GPU-a": 35.0}}))
    hot = FakeGpus({"GPU-a": 80})
    stop = threading.Event()

    def sleep(seconds: float) -> None:
        hot.sleep(seconds)
        if hot.now >= 3:
            stop.set()  # Ctrl-C while packing: the scheduler's stop

    with pytest.raises(cooldown.Stopped):
        cooldown.wait(mark, ["0"], 300, stop=stop, read=hot.read, sleep=sleep, clock=hot.clock)
    assert hot.now == 3.0


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


def test_a_launch_waits_before_its_wall_time_and_a_stop_means_no_launch(tmp_path, monkeypatch):
    """launch_and_wait with --cool-down: the wait comes before the job starts and is
    recorded; stopped during the wait, nothing is launched."""
    from orchestrator.contract.layout import NodeFiles
    from orchestrator.job.execute import Launch, RunOptions, launch_and_wait

    mark = tmp_path / "cooldown.json"
    mark.write_text(json.dumps({"start_c": {"GPU-a": 40.0}}))
    gpus = FakeGpus({"GPU-a": 46}, rate=1.0)  # at its mark (43) after 3 s
    real_wait = cooldown.wait

    def fake_thermometer(*args: Any, **kwargs: Any) -> dict[str, Any]:
        return real_wait(*args, read=gpus.read, sleep=gpus.sleep, clock=gpus.clock, **kwargs)

    monkeypatch.setattr(cooldown, "wait", fake_thermometer)
    files = NodeFiles(*(tmp_path / n for n in ("out", "err", "memory.csv", "side")))
    touched = tmp_path / "launched"
    launch = Launch(
        argv=[sys.executable, "-c", f"open({str(touched)!r}, 'w')"],
        env=dict(os.environ),
        files=files,
        primary=True,
        timeout_s=30,
        cooldown=mark,
    )
    options = RunOptions(memory_logging="huggingface", cool_down_s=60)
    ran = launch_and_wait(launch, options, ["0"])
    assert ran.cooldown == {"wait_s": 3.0, "start_c": 43.0, "target_c": 43.0}
    assert ran.returncode == 0 and touched.exists() and not ran.interrupted
    touched.unlink()
    gpus.start, gpus.now = {"GPU-a": 80}, 0.0
    stop = threading.Event()
    stop.set()
    ran = launch_and_wait(launch, options, ["0"], stop=stop)
    assert ran.interrupted and ran.proc is None and not touched.exists()


def test_cool_down_is_refused_where_the_jobs_run_elsewhere(tmp_path) -> None:
    """--cool-down reads this machine's GPUs: refused for SLURM before anything is written."""
    from orchestrator.contract.errors import UserError
    from orchestrator.contract.layout import ResultsLayout
    from orchestrator.executors.slurm import SlurmExecutor
    from orchestrator.job.execute import RunOptions
    from orchestrator.running.runner import preflight

    layout = ResultsLayout(tmp_path / "results")
    with pytest.raises(UserError, match=r"^--cool-down waits for this machine's GPUs: the "):
        plan: Any = SimpleNamespace(experiments=[])
        preflight(SlurmExecutor(), plan, layout, RunOptions(cool_down_s=60))
    assert not layout.root.exists()
