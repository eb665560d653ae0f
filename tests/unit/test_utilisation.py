"""Utilisation: CPU-time accounting of a process tree, NVML's figures, the window and
the summary (pure, with fakes), and the real sidecar's CPU time against the kernel's."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from orchestrator.contract.progress import StepProgress
from orchestrator.job import utilisation as u
from orchestrator.job.sidecar import read_samples

REPO = Path(__file__).resolve().parents[2]

# ---------------------------------------------------------------------------
# CPU time of a tree whose processes come and go
# ---------------------------------------------------------------------------


@dataclass
class FakeTimes:
    user: float = 0.0
    system: float = 0.0
    children_user: float = 0.0
    children_system: float = 0.0


@dataclass
class FakeKernel:
    """Processes that use CPU, exit, and are reaped by their parent (whose
    ``children_*`` then gain the child's whole time, as the kernel's rusage does),
    or by init when their parent is gone."""

    procs: dict[int, tuple[int, FakeTimes]] = field(default_factory=dict)
    #: every second of CPU any process of the tree used
    used: float = 0.0
    #: what init reaped: lost to the tree
    orphaned: float = 0.0

    def spawn(self, pid: int, parent: int) -> None:
        self.procs[pid] = (parent, FakeTimes())

    def run(self, pid: int, user: float, system: float = 0.0) -> None:
        times = self.procs[pid][1]
        times.user += user
        times.system += system
        self.used += user + system

    def exit(self, pid: int) -> None:
        parent, times = self.procs.pop(pid)
        for child, (pp, _) in list(self.procs.items()):
            if pp == pid:
                self.procs[child] = (1, self.procs[child][1])  # reparented to init
        total_u = times.user + times.children_user
        total_s = times.system + times.children_system
        if parent in self.procs:
            parent_times = self.procs[parent][1]
            parent_times.children_user += total_u
            parent_times.children_system += total_s
        else:
            self.orphaned += total_u + total_s

    def readings(self) -> list[FakeTimes]:
        return [times for _, times in self.procs.values()]


def test_a_process_that_exits_keeps_its_time_in_its_parent() -> None:
    k = FakeKernel()
    k.spawn(100, parent=0)  # the launcher
    k.spawn(101, parent=100)  # rank 0
    k.spawn(102, parent=100)  # rank 1
    k.run(100, 0.2)
    k.run(101, 1.0, 0.1)
    k.run(102, 1.0, 0.2)
    first = u.tree_cpu_seconds(k.readings())
    assert first == pytest.approx(k.used)
    # between two samples: rank 1 starts a worker that runs and is reaped, never seen alive
    k.spawn(103, parent=102)
    k.run(103, 0.7, 0.05)
    k.exit(103)
    k.run(101, 0.5)
    # and rank 0 exits and is reaped by the launcher
    k.exit(101)
    second = u.tree_cpu_seconds(k.readings())
    assert second == pytest.approx(k.used)  # nothing lost, nothing counted twice
    assert second - first == pytest.approx(0.7 + 0.05 + 0.5)


def test_a_grandchild_reaped_inside_the_tree_is_counted_once() -> None:
    k = FakeKernel()
    k.spawn(100, parent=0)
    k.spawn(101, parent=100)
    k.spawn(102, parent=101)
    k.run(102, 2.0)
    k.exit(102)  # into 101's children figures
    assert u.tree_cpu_seconds(k.readings()) == pytest.approx(2.0)
    k.exit(101)  # 101's own and children figures move into 100's
    assert u.tree_cpu_seconds(k.readings()) == pytest.approx(2.0)


def test_an_orphan_takes_its_time_with_it() -> None:
    # the documented loss: a process whose parent exits first is reaped by init
    k = FakeKernel()
    k.spawn(100, parent=0)
    k.spawn(101, parent=100)
    k.spawn(102, parent=101)
    k.run(102, 1.0)
    k.exit(101)  # 102 now belongs to init
    k.exit(102)
    assert k.orphaned == pytest.approx(1.0)
    assert u.tree_cpu_seconds(k.readings()) == pytest.approx(k.used - k.orphaned)


def test_cpu_util_over_the_samples() -> None:
    # 1.5 CPU-seconds per second on 2 allowed CPUs: 75%
    samples = [(10.0 + i * 0.1, round(1.5 * i * 0.1 * u.US)) for i in range(11)]
    assert u.cpu_util_pct(samples, 2) == pytest.approx(75.0)
    assert u.cpu_util_pct(samples[:1], 2) is None  # no span
    # a total that fell: a process left with its time, the figure is not to be trusted
    assert u.cpu_util_pct([(0.0, 5 * u.US), (1.0, 4 * u.US)], 1) is None


# ---------------------------------------------------------------------------
# NVML's figures, with a fake NVML
# ---------------------------------------------------------------------------


class FakeNvmlError(Exception):
    pass


@dataclass
class FakeRates:
    gpu: int
    memory: int


class FakeNvml:
    NVMLError = FakeNvmlError

    def __init__(self, rates: dict[str, FakeRates | None]) -> None:
        self.rates = rates
        self.calls: list[str] = []

    def nvmlDeviceGetUtilizationRates(self, handle: str) -> FakeRates:
        self.calls.append(handle)
        rates = self.rates[handle]
        if rates is None:
            raise FakeNvmlError("Not Supported")
        return rates


def test_gpu_utilisation_and_a_device_that_cannot_tell() -> None:
    nv = FakeNvml({"h0": FakeRates(97, 41), "h1": None})
    unsupported: set[int] = set()
    handles = {0: "h0", 3: "h1"}
    assert u.read_gpu_utilisation(nv, handles, unsupported) == {0: (97, 41)}
    assert unsupported == {3}
    nv.rates["h0"] = FakeRates(12, 5)
    assert u.read_gpu_utilisation(nv, handles, unsupported) == {0: (12, 5)}
    assert nv.calls == ["h0", "h1", "h0"]  # the device that cannot tell is asked once


# ---------------------------------------------------------------------------
# The window and the summary
# ---------------------------------------------------------------------------


def _progress(started: float, updated: float, phase: str = "done") -> StepProgress:
    return StepProgress(
        step=10,
        max_steps=10,
        tokens_per_second_rank0=100.0,
        world_size=2,
        phase=phase,
        updated=updated,
        train_started=started,
    )


def test_windows_from_the_child_files() -> None:
    result = {"metrics": {"measured_time_s": 4.0}}
    measured, training = u.windows_of(_progress(100.0, 110.0), result)
    assert (measured.name, measured.start, measured.end) == ("measured", 106.0, 110.0)
    assert (training.name, training.start, training.end) == ("training", 100.0, 110.0)
    # the end of the last step, where the result records it: the progress file's last write
    # follows the trainer's wrap-up, which is not training
    timed = {"metrics": {"measured_time_s": 4.0}, "timings": {"train_end_unix": 108.5}}
    measured, training = u.windows_of(_progress(100.0, 110.0), timed)
    assert (measured.start, measured.end, training.end) == (104.5, 108.5, 108.5)
    # one that cannot be (after the last write, or before training): the last write
    for wrong in (111.0, 99.0):
        timed["timings"]["train_end_unix"] = wrong
        assert u.windows_of(_progress(100.0, 110.0), timed)[0].end == 110.0
    # no measured time: the training alone
    assert [w.name for w in u.windows_of(_progress(100.0, 110.0), {"metrics": {}})] == ["training"]
    # a measured time longer than training cannot be placed
    too_long = {"metrics": {"measured_time_s": 30.0}}
    assert [w.name for w in u.windows_of(_progress(100.0, 110.0), too_long)] == ["training"]
    # training not over (a failed run), or no progress file: no window
    assert u.windows_of(_progress(100.0, 105.0, phase="measuring"), result) == []
    assert u.windows_of(None, result) == []


def test_run_windows_reads_the_files(tmp_path) -> None:
    progress, result = tmp_path / "progress.json", tmp_path / "result.json"
    progress.write_text(_progress(100.0, 110.0).to_json())
    result.write_text(json.dumps({"metrics": {"measured_time_s": 2.5}}))
    assert [w.name for w in u.run_windows(progress, result)] == ["measured", "training"]
    assert u.run_windows(tmp_path / "none.json", result) == []


def test_percentile_matches_the_inclusive_quantiles() -> None:
    values = [3.0, 97.0, 0.0, 55.0, 88.0, 91.0, 12.0]
    expected = statistics.quantiles(values, n=10, method="inclusive")[0]
    assert u.percentile(values, 10) == pytest.approx(expected)
    assert u.percentile([5.0], 10) == 5.0
    assert u.percentile(values, 0) == 0.0 and u.percentile(values, 100) == 97.0


def _rows() -> list[tuple[float, str, str, int]]:
    """20 s of a job on 4 CPUs: loading (1 CPU busy) to t=10, then training (3 busy);
    2 GPUs, busy during training but for device 1 now and then."""
    rows: list[tuple[float, str, str, int]] = [(0.0, "cpu_allowed", "tree", 4)]
    cpu = 0.0
    for i in range(201):
        t = i * 0.1
        rows.append((t, "tree_rss", "tree", 1000))  # memory rows are ignored here
        rows.append((t, "tree_cpu", "tree", round(cpu * u.US)))
        cpu += 0.1 * (1.0 if t < 10 else 3.0)
        training = t >= 10
        rows.append((t, "gpu_util", "0", 100 if training else 0))
        rows.append((t, "gpu_util", "1", (0 if i % 4 == 0 else 100) if training else 0))
        rows.append((t, "gpu_mem_util", "0", 40 if training else 0))
        rows.append((t, "gpu_mem_util", "1", 20 if training else 0))
    return rows


def test_summary_over_the_measured_window() -> None:
    window = u.Window("measured", 12.0, 19.0)
    s = u.summarize(_rows(), [window, u.Window("training", 10.0, 20.0)])
    assert s["util_window"] == "measured"
    assert s["cpu_util_mean_pct"] == pytest.approx(75.0)  # 3 of 4 CPUs
    assert s["cpu_allowed"] == 4
    # device 1 idle at every 4th sample: a quarter of its samples, an eighth of all
    inside = [v for t, kind, _, v in _rows() if kind == "gpu_util" and window.holds(t)]
    assert len(inside) > 120 and s["gpu_util_mean_pct"] == pytest.approx(statistics.mean(inside))
    assert s["gpu_util_mean_pct"] == pytest.approx(87.5, abs=1.0)
    assert s["gpu_util_p10_pct"] == 0.0  # idle time shows in the 10th percentile
    assert s["gpu_mem_bw_util_mean_pct"] == pytest.approx(30.0)


def test_summary_falls_back_to_a_larger_window() -> None:
    # a measured window too short to count CPU time in (3 samples over 0.2 s): the training's
    short = u.Window("measured", 15.0, 15.25)
    s = u.summarize(_rows(), [short, u.Window("training", 10.0, 20.0)])
    assert s["util_window"] == "training" and s["cpu_util_mean_pct"] == pytest.approx(75.0)
    # no window known: the whole job, loading included (what the window avoids)
    s = u.summarize(_rows())
    assert s["util_window"] == "job"
    assert s["cpu_util_mean_pct"] == pytest.approx(100 * (10 * 1 + 10 * 3) / 20 / 4, rel=0.02)


def test_no_gpu_samples_no_gpu_figures() -> None:
    cpu_only = [r for r in _rows() if not r[1].startswith("gpu")]
    s = u.summarize(cpu_only, [u.Window("measured", 12.0, 19.0)])
    assert "cpu_util_mean_pct" in s
    assert not {"gpu_util_mean_pct", "gpu_util_p10_pct", "gpu_mem_bw_util_mean_pct"} & set(s)
    # memory only (utilisation sampling off): nothing at all
    assert u.summarize([(0.0, "tree_rss", "tree", 1)]) == {}


# ---------------------------------------------------------------------------
# The real sidecar against the kernel's own count
# ---------------------------------------------------------------------------

_JOB = """
import resource, subprocess, sys, time
def burn(seconds):
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass
child = subprocess.Popen([sys.executable, "-c", "import time\\nend = time.process_time() + 0.8\\nwhile time.process_time() < end: pass"])
child.wait()
burn(0.5)
me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
total = me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime
open(sys.argv[1], "w").write(repr(total))
time.sleep(0.6)
"""


@pytest.mark.parametrize("off", [False, True])
def test_real_sidecar_counts_the_cpu_time_of_a_child_that_exited(tmp_path, off) -> None:
    """A job whose child burns CPU and exits: the sidecar's tree CPU time matches the
    kernel's count of the job and its reaped child; with utilisation off, no such rows."""
    out, total = tmp_path / "memory.csv", tmp_path / "total"
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)}
    if off:
        env[u.OFF_ENV] = "0"
    side = subprocess.Popen(
        [sys.executable, "-m", "orchestrator.job.sidecar", "--out", str(out), "--interval", "0.05"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert side.stdout is not None and side.stdin is not None
    assert side.stdout.readline().startswith("ready psutil")
    job = subprocess.Popen([sys.executable, "-c", _JOB, str(total)])
    side.stdin.write(f"{job.pid}\n")
    side.stdin.flush()
    job.wait(timeout=60)
    time.sleep(0.1)
    _, err = side.communicate(timeout=10)  # closes stdin: the sidecar stops
    assert "sidecar:" in err and "ms per sample" in err
    rows = read_samples(out)
    cpu = [v for _, kind, _, v in rows if kind == "tree_cpu"]
    if off:
        assert cpu == [] and "memory only" in err
        return
    assert "memory+utilisation" in err
    kernel = float(total.read_text())
    # the last samples come after the job wrote its total (it sleeps 0.6 s then)
    assert max(cpu) / u.US == pytest.approx(kernel, abs=0.05)
    assert cpu == sorted(cpu)  # the child's exit lost nothing
    assert any(kind == "cpu_allowed" and v >= 1 for _, kind, _, v in rows)
