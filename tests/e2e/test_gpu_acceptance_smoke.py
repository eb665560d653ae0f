"""benchmarks/gpu_acceptance.py --cpu-smoke, for real: cut off midway it leaves the table of
the parts that finished, and a run in which every cell of --model fails exits 1.

(A whole --cpu-smoke run takes about 2 minutes here; the folders one left are
tests/fixtures/acceptance-cpu, which tests/unit/test_gpu_acceptance.py checks.)
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_run import REPO, env, processes_mentioning

# a run cut off midway and a run whose every cell fails: faults, run with the others
# (tox -e faults), out of the plain pytest run
pytestmark = [pytest.mark.e2e, pytest.mark.faults]

SCRIPT = REPO / "benchmarks" / "gpu_acceptance.py"


def test_cut_off_after_its_first_part_it_leaves_that_parts_table(tmp_path: Path) -> None:
    work = tmp_path / "work"
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), "--cpu-smoke", "--keep", str(work)],
        env=env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    table = work / f"gpu_acceptance-{time.strftime('%Y-%m-%d')}.md"
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:
            if table.exists() and "parts done: 1 of " in table.read_text():
                break
            time.sleep(0.5)
        assert proc.poll() is None, "it ended before it could be cut off"
        # cut off as a time limit does: the whole group gets SIGTERM in the second part
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = table.read_text()
    assert re.search(r"^- parts done: 1 of \d+ \(independent figures\)$", text, re.M), text
    lines = [line for line in text.splitlines() if line.startswith("| independent")]
    assert len(lines) == 1 and lines[0].endswith("| all four measured | pass |"), text
    assert (work / f"gpu_acceptance-{time.strftime('%Y-%m-%d')}.json").exists()
    # the matrix it was running when cut off stopped with it: no job is left training
    time.sleep(2)
    assert not processes_mentioning(str(work / "matrix")), "a job outlived the cut-off"


def test_a_smoke_run_whose_every_cell_fails_exits_1(tmp_path: Path) -> None:
    work = tmp_path / "work"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--cpu-smoke", "--keep", str(work), "--model", "nowhere"],
        env=env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    text = next(work.glob("gpu_acceptance-*.md")).read_text()
    done_parts = re.search(r"^- parts done: (\d+) of (\d+) ", text, re.M)
    assert done_parts and done_parts[1] == done_parts[2], text
    rows = [line for line in text.splitlines() if line.startswith("| ") and "| ---" not in line]
    # the task families part trains its own models, not --model: its cells still pass
    families = [row for row in rows if ": trains, counts and FLOPs |" in row]
    assert len(families) == 4 and all(row.endswith("| pass |") for row in families), text
    results = [row.rsplit("|", 2)[1].strip() for row in rows if row not in families]
    results = [r for r in results if r != "result"]
    assert results and "pass" not in results
    assert results.count("FAIL") >= 5, text
