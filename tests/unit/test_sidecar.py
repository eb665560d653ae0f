"""The sidecar's arithmetic and device mapping (pure), and its real process on the CPU."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.sidecar import (
    MIB,
    NvmlDevice,
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
        (2.0, "process_rss", "10", 150),
        (2.0, "process_rss", "11", 200),
        (2.0, "tree_rss", "tree", 350),
    ]
    s = summarize(rows)
    assert s["mem_tree_peak_rss_bytes"] == 400
    assert s["mem_process_peak_rss_bytes"] == {"10": 150, "11": 300}
    assert "mem_nvidia_mem_reserved" not in s


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
        [sys.executable, "-m", "orchestrator.sidecar", "--out", str(out), "--interval", "0.05"],
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
