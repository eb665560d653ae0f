"""Host out-of-memory kills for real: a job under a cgroup memory limit, as on a SLURM node.

The kernel's OOM killer ends a rank with SIGKILL; the launcher then stops the
other ranks, which report "interrupted". The row must say ``oom`` (host
memory), and a rank killed by hand must not be called out of memory.
"""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import memcgroup
import psutil
import pytest

# a real kernel OOM kill in a memory cgroup (root): tox -e faults
pytestmark = [pytest.mark.e2e, pytest.mark.faults]

REPO = Path(__file__).resolve().parents[2]

DEFAULTS = "max_steps: 4\nlogging_steps: 1\nreport_to: none\nsave_strategy: 'no'\n"


def scenarios(model: str, num_gpus: int, extra: str = "") -> str:
    return (
        "frameworks:\n"
        f"  ddp: {{accelerate_config: {REPO / 'accelerate-ddp.yaml'}}}\n"
        "matrix:\n  effective_batch_size: [2]\n"
        "scenarios:\n"
        "  - name: host\n"
        "    device: cpu\n"
        "    framework_config: [ddp]\n"
        f"    num_gpus: [{num_gpus}]\n"
        "    arguments:\n"
        f"      model_name_or_path: {model}\n"
        "      max_seq_len: 64\n"
        f"{extra}"
    )


@pytest.fixture
def memory_cgroup(tmp_path: Path) -> Iterator[Path]:
    """A cgroup v1 memory cgroup of 2.5 GiB, removed afterwards with whatever ran in it."""
    with memcgroup.memory_cgroup(f"test-{tmp_path.name}", 2560 * 1024 * 1024) as folder:
        yield folder


def start_in_cgroup(folder: Path, cwd: Path, *args: str) -> subprocess.Popen[str]:
    """``tunematrix run`` started inside the cgroup: the orchestrator, launcher and ranks all in it."""

    return subprocess.Popen(
        # the check before launch proves nothing here (tests/e2e/test_stackcheck_e2e.py)
        [sys.executable, "-m", "orchestrator", "run", "--no-report", "--no-check", *args],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=memcgroup.joining(folder),
    )


def only_row(results: Path) -> dict[str, str]:
    with (results / "raw_summary.csv").open() as f:
        (row,) = list(csv.DictReader(f))
    return row


@pytest.mark.parametrize("num_gpus", [1, 2])
def test_a_rank_killed_by_the_kernel_oom_killer_is_oom(tmp_path, memory_cgroup, num_gpus) -> None:
    # a 1.2B-parameter model built in fp32 needs ~5 GB per rank: far over the limit
    (tmp_path / "defaults.yaml").write_text(DEFAULTS)
    (tmp_path / "scenarios.yaml").write_text(scenarios("config:llama-3.2-1b", num_gpus))
    proc = start_in_cgroup(
        memory_cgroup,
        tmp_path,
        *("--scenarios", "scenarios.yaml", "--results", "res", "--num-gpus", str(num_gpus)),
    )
    _out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]  # oom is an answer, not an error of the run
    row = only_row(tmp_path / "res")
    assert row["status"] == "oom", row["error"]
    assert row["error"].startswith("host memory: "), row["error"]
    assert "killed by the kernel's out-of-memory killer" in row["error"]
    assert memcgroup.left_in(memory_cgroup) == []


def test_a_rank_killed_by_hand_is_failed_not_oom(tmp_path, memory_cgroup) -> None:
    (tmp_path / "defaults.yaml").write_text(DEFAULTS)
    (tmp_path / "scenarios.yaml").write_text(
        scenarios("tiny-llama", 2, extra="      max_steps: 100000\n")
    )
    proc = start_in_cgroup(
        memory_cgroup,
        tmp_path,
        *("--scenarios", "scenarios.yaml", "--results", "res", "--num-gpus", "2"),
    )
    deadline = time.monotonic() + 120
    ranks: list[psutil.Process] = []
    while time.monotonic() < deadline and len(ranks) < 2:
        time.sleep(0.5)
        ranks = [
            p
            for p in map(psutil.Process, memcgroup.left_in(memory_cgroup))
            if p.is_running()
            and "trainer_entry" in p.cmdline()
            and "accelerate" not in p.cmdline()[1]
        ]
    if len(ranks) < 2:
        proc.kill()
        pytest.fail(f"the two ranks never started: {proc.communicate()[1][-3000:]}")
    time.sleep(2)
    ranks[1].send_signal(signal.SIGKILL)
    _out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err[-3000:]
    row = only_row(tmp_path / "res")
    assert row["status"] == "failed", row["error"]
    assert "was killed by SIGKILL, not by the out-of-memory killer" in row["error"]
    assert memcgroup.left_in(memory_cgroup) == []
