"""A results folder on a full disk, for real: a 400 KiB tmpfs (root, to mount it).

The first cell fails naming the disk and its free space; every later one, whatever its
model, is spared rather than launched to fail alike; the summary says why.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_run import env

pytestmark = [pytest.mark.e2e, pytest.mark.faults]

SCENARIOS = """\
matrix:
  effective_batch_size: [4]
scenarios:
"""
CELL = """\
  - name: {name}
    device: cpu
    num_gpus: [1]
    arguments:
      model_name_or_path: {model}
      max_seq_len: 64
      max_steps: 4
      report_to: none
      save_strategy: "no"
"""


@pytest.fixture
def small_disk(tmp_path: Path):
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    disk = tmp_path / "small"
    disk.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=400k", "tmpfs", str(disk)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def test_a_full_disk_fails_one_cell_and_spares_the_rest(tmp_path: Path, small_disk: Path) -> None:
    cells = [("a", "tiny-llama"), ("b", "tiny-gpt2"), ("c", "tiny-llama")]
    (tmp_path / "scenarios.yaml").write_text(
        SCENARIOS + "".join(CELL.format(name=n, model=m) for n, m in cells)
    )
    run = subprocess.run(
        [
            *(sys.executable, "-m", "orchestrator", "run", "--scenarios", "scenarios.yaml"),
            *("--results", str(small_disk / "res"), "--device", "cpu", "--no-check"),
        ],
        cwd=tmp_path,
        env={**env(), "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 1, run.stderr[-3000:]
    lines = (run.stdout + run.stderr).splitlines()
    failed = [line for line in lines if "] failed " in line]
    assert len(failed) == 1, run.stdout[-3000:]
    assert "disk full: " in failed[0] and " free (No space left on device)" in failed[0]
    assert str(small_disk / "res" / "runs") in failed[0]
    spared = [line for line in lines if "] skipped " in line]
    assert len(spared) == 2 and all("not launched: the disk of " in s for s in spared), lines
    assert "failed 1, spared 2" in run.stdout
