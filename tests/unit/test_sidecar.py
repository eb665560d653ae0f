"""The sidecar's arithmetic and device mapping (pure), and its real process on the CPU."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.job.sidecar import (
    MIB,
    NvmlDevice,
    PssSchedule,
    map_visible_to_nvml,
    parse_ready,
    read_samples,
    summarize,
)

REPO = Path(__file__).resolve().parents[2]

DEVICES = [
    # NVML enumeration order need not be PCI order
    NvmlDevice(
        index=0, uuid="GPU-aaaa", pci_bus_id="00000000:C1:00.0", name="NVIDIA H100 80GB HBM3"
    ),
    NvmlDevice(
        index=1, uuid="GPU-bbbb", pci_bus_id="00000000:41:00.0", name="NVIDIA H100 80GB HBM3"
    ),
    NvmlDevice(
        index=2, uuid="GPU-cccc", pci_bus_id="00000000:81:00.0", name="NVIDIA H100 80GB HBM3"
    ),
]


def test_indices_count_in_pci_bus_order() -> None:
    assert [d.index for d in map_visible_to_nvml(["0", "1", "2"], DEVICES)] == [1, 2, 0]
    assert [d.index for d in map_visible_to_nvml(["2"], DEVICES)] == [0]


def test_uuids_and_prefixes() -> None:
    assert [d.index for d in map_visible_to_nvml(["GPU-cccc", "GPU-a"], DEVICES)] == [2, 0]
    with pytest.raises(ValueError, match="matches 0 GPUs"):
        map_visible_to_nvml(["GPU-zzzz"], DEVICES)
    with pytest.raises(ValueError, match="CUDA device 5 does not exist"):
        map_visible_to_nvml(["5"], DEVICES)


def test_gpu_summary_subtracts_the_baseline() -> None:
    rows = [
        (0.0, "device_baseline", "1", 500 * MIB),
        (0.0, "device_baseline", "2", 700 * MIB),
        (1.0, "device_used", "1", 10_500 * MIB),
        (1.0, "device_used", "2", 8_700 * MIB),
        (2.0, "device_used", "1", 20_500 * MIB),
        (2.0, "device_used", "2", 6_700 * MIB),
        (2.0, "gpu_process", "4242", 19_000 * MIB),
    ]
    s = summarize(rows)
    # peaks 20,000 MiB and 8,000 MiB above baseline
    assert s["mem_nvidia_peak_bytes_max"] == 20_000 * MIB
    assert s["mem_nvidia_peak_bytes_mean"] == 14_000 * MIB
    assert s["mem_nvidia_mem_reserved"] == 14_000  # MiB, the predecessor's unit
    assert s["mem_nvidia_peak_bytes_per_device"] == {"1": 20_000 * MIB, "2": 8_000 * MIB}
    assert s["mem_nvidia_process_peak_bytes"] == {"4242": 19_000 * MIB}


def test_cpu_summary() -> None:
    rows = [
        (1.0, "process_rss", "10", 100),
        (1.0, "process_rss", "11", 300),
        (1.0, "tree_rss", "tree", 400),
        (1.0, "process_pss", "10", 60),
        (1.0, "process_pss", "11", 240),
        (1.0, "tree_pss", "pss", 300),
        (2.0, "process_rss", "10", 150),
        (2.0, "process_rss", "11", 200),
        (2.0, "tree_rss", "tree", 350),
    ]
    s = summarize(rows)
    assert s["mem_tree_peak_rss_bytes"] == 400
    assert s["mem_tree_peak_pss_bytes"] == 300 and s["mem_tree_peak_measure"] == "pss"
    assert s["mem_tree_pss_samples"] == 1
    assert s["mem_process_peak_rss_bytes"] == {"10": 150, "11": 300}
    assert s["mem_process_peak_pss_bytes"] == {"10": 60, "11": 240}
    assert "mem_nvidia_mem_reserved" not in s


def test_the_pss_peak_says_when_rss_stood_in() -> None:
    # process 11's PSS could not be read at the peak: its RSS stood in, and the row says so
    rows = [
        (1.0, "tree_rss", "tree", 400),
        (1.0, "tree_pss", "pss", 300),
        (2.0, "tree_rss", "tree", 500),
        (2.0, "tree_pss", "pss+rss", 420),
    ]
    s = summarize(rows)
    assert s["mem_tree_peak_pss_bytes"] == 420 and s["mem_tree_peak_measure"] == "pss+rss"
    # PSS never readable: no PSS figure rather than the RSS under its name
    s = summarize([(1.0, "tree_rss", "tree", 400)])
    assert "mem_tree_peak_pss_bytes" not in s and s["mem_tree_peak_measure"] == "rss only"


def test_pss_schedule() -> None:
    schedule = PssSchedule(every_s=1.0, budget=0.05)
    assert schedule.due(0.0, 100)  # the first sample
    schedule.done(0.0, 0.001, 100)
    assert not schedule.due(0.5, 100)  # no new high, not a second yet
    assert schedule.due(0.5, 101)  # the tree's RSS passes its high: a peak may be forming
    assert schedule.due(1.0, 100)  # a second since the last read
    # a read that took 20 ms: the next one waits 0.4 s (5% of the time), even for a new high
    schedule.done(2.0, 0.02, 200)
    assert not schedule.due(2.3, 10_000)
    assert schedule.due(2.41, 10_000)


def test_parse_ready() -> None:
    assert parse_ready("ready nvml+psutil devices=NVIDIA H100 80GB HBM3\n") == (
        "nvml+psutil",
        {"devices": "NVIDIA H100 80GB HBM3"},
    )
    assert parse_ready(
        "ready psutil (NVMLError_LibraryNotFound: NVML Shared Library Not Found)\n"
    ) == (
        "psutil",
        {"note": "NVMLError_LibraryNotFound: NVML Shared Library Not Found"},
    )


def test_a_cut_csv_line_is_skipped(tmp_path) -> None:
    path = tmp_path / "memory.csv"
    path.write_text("timestamp,kind,source,bytes\n1.0,tree_rss,tree,100\n2.0,tree_rss,tr")
    assert read_samples(path) == [(1.0, "tree_rss", "tree", 100)]
    assert read_samples(tmp_path / "none.csv") == []


def test_real_sidecar_follows_a_process_tree(tmp_path) -> None:
    """The sidecar process samples a parent and its child, and stops on EOF."""
    job = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys, time; "
            "c = subprocess.Popen([sys.executable, '-c', 'b = bytearray(80 * 2**20); import time; time.sleep(3)']); "
            "time.sleep(3); c.wait()",
        ]
    )
    out = tmp_path / "memory.csv"
    side = subprocess.Popen(
        [sys.executable, "-m", "orchestrator.job.sidecar", "--out", str(out), "--interval", "0.05"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    assert side.stdout is not None and side.stdin is not None
    assert side.stdout.readline().startswith("ready psutil")
    side.stdin.write(f"{job.pid}\n")
    side.stdin.flush()
    time.sleep(2.5)
    side.stdin.close()
    assert side.wait(timeout=10) == 0
    job.wait()
    s = summarize(read_samples(out))
    pids = s["mem_process_peak_rss_bytes"]
    assert str(job.pid) in pids and len(pids) == 2  # the parent and its child
    assert max(pids.values()) > 80 * 2**20  # the child's 80 MiB buffer
    assert s["mem_tree_peak_rss_bytes"] >= max(pids.values())
    # PSS read too (at least once a second), and never above the summed RSS
    assert s["mem_tree_peak_measure"] == "pss" and s["mem_tree_pss_samples"] >= 2
    assert max(pids.values()) < s["mem_tree_peak_pss_bytes"] <= s["mem_tree_peak_rss_bytes"]
    assert str(job.pid) in s["mem_process_peak_pss_bytes"]


SHARED_MAPPER = """
import mmap, sys
with open(sys.argv[1], "rb") as f:
    m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
total = sum(m[i] for i in range(0, len(m), 4096))  # touch every page: resident in both
# one write of the whole line (print writes "ready" and the newline apart, so the
# two mappers' lines could interleave as "readyready"); a pipe write this small is atomic
sys.stdout.write("ready\\n")
sys.stdout.flush()
sys.stdin.read()
"""


def test_tree_pss_counts_shared_pages_once(tmp_path) -> None:
    """Two processes map one 96 MiB file: summed RSS counts it twice, the tree's PSS once."""
    from orchestrator.job.sidecar import _Tree

    size = 96 * MIB
    data = tmp_path / "shared.bin"
    data.write_bytes(b"\1" * size)
    # the job: a parent that starts the two mappers and waits for them
    job = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys; "
            f"cs = [subprocess.Popen([sys.executable, '-c', {SHARED_MAPPER!r}, {str(data)!r}], "
            "stdin=sys.stdin, stdout=sys.stdout) for _ in range(2)]; "
            "[c.wait() for c in cs]",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert job.stdin is not None and job.stdout is not None
    try:
        assert [job.stdout.readline().strip() for _ in range(2)] == ["ready", "ready"]
        tree = _Tree(job.pid)
        rss = tree.rss()
        pss, unreadable = tree.pss(rss)
        assert len(rss) == 3 and unreadable == [] and set(pss) == set(rss)
        # the file counts twice in the summed RSS, and once (half in each mapper) in the PSS
        assert sum(rss.values()) - sum(pss.values()) > 0.8 * size
        mappers = [pid for pid in rss if pid != job.pid]
        assert all(rss[pid] > size for pid in mappers)
        assert all(pss[pid] < rss[pid] - 0.4 * size for pid in mappers)
    finally:
        job.stdin.close()  # EOF: the mappers and the parent end
        job.wait(timeout=10)


def test_the_tree_pss_reaches_the_tables(tmp_path) -> None:
    """raw_summary.csv and the report's cells carry the tree's PSS peak and how it was measured."""
    from fakeruns import write_run

    from orchestrator.results import collect
    from orchestrator.results.report import CostSettings, add_derived, aggregate

    memory = summarize(
        [(1.0, "tree_rss", "tree", 3 * 2**30), (1.0, "tree_pss", "pss+rss", 2 * 2**30)]
    )
    for r in range(3):
        run = write_run(tmp_path, f"a.r{r}", cell_id="a", repeat=r, device="cpu")
        outcome = json.loads((run / "outcome.json").read_text())
        (run / "outcome.json").write_text(json.dumps({**outcome, "memory": memory}))
    rows = add_derived(collect.load(tmp_path), CostSettings())
    assert set(rows["mem_tree_peak_pss_bytes"]) == {2 * 2**30}
    assert set(rows["mem_tree_peak_measure"]) == {"pss+rss"}
    (cell,) = aggregate(rows).to_dict("records")
    assert cell["mem_tree_peak_pss_bytes"] == 2 * 2**30
