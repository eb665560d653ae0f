"""``tunematrix fit`` for real: the largest batch that fits under a cgroup memory limit.

The whole command runs inside a cgroup v1 memory cgroup, as on a SLURM node:
its probes are real ``accelerate launch`` runs of the tiny Llama on the CPU,
and the probe that does not fit is ended by the kernel's out-of-memory killer.
TRL's bfd packing (its per-document masks take the memory; tunematrix's blocks
add only ~14 MB a sample here, too little to tell 1 from 2): at 4096 tokens a
sample, one sample peaks near 1.0 GB for the whole cgroup
and two near 1.4 GB, so a 1.16 GiB limit puts the answer at 1, bracketed by an
ok probe and a genuine oom one, in two probes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import memcgroup
import pytest

# a real kernel OOM kill in a memory cgroup (root): tox -e faults
pytestmark = [pytest.mark.e2e, pytest.mark.faults]

REPO = Path(__file__).resolve().parents[2]
LIMIT_BYTES = 1190 * 2**20

DEFAULTS = "max_steps: 20\nlogging_steps: 1\nreport_to: none\nsave_strategy: 'no'\n"
SCENARIOS = f"""\
frameworks:
  ddp: {{accelerate_config: {REPO / "accelerate-ddp.yaml"}}}
matrix:
  effective_batch_size: [4]
scenarios:
  - name: fit
    device: cpu
    framework_config: [ddp]
    num_gpus: [1]
    search: {{max: per_device_train_batch_size, limit: 2}}
    arguments:
      model_name_or_path: tiny-llama
      torch_dtype: float32
      max_seq_len: 4096
      packing_strategy: bfd
"""


@pytest.fixture(scope="module")
def memory_cgroup() -> Iterator[Path]:
    """A cgroup v1 memory cgroup, removed afterwards with whatever ran in it."""
    with memcgroup.memory_cgroup("fit-test", LIMIT_BYTES) as folder:
        yield folder


@pytest.fixture(scope="module")
def fitted(
    tmp_path_factory: pytest.TempPathFactory, memory_cgroup: Path
) -> tuple[subprocess.CompletedProcess[str], Path]:
    """``tunematrix fit`` run once inside the cgroup: the orchestrator, launcher and rank."""
    folder = tmp_path_factory.mktemp("fit")
    (folder / "defaults.yaml").write_text(DEFAULTS)
    (folder / "scenarios.yaml").write_text(SCENARIOS)

    args = ("--scenarios", "scenarios.yaml", "--results", "res", "--probe-steps", "2")
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator", "fit", *args],
        cwd=folder,
        env={
            **os.environ,
            "PYTHONPATH": str(REPO),
            "HF_HUB_OFFLINE": "1",
            "OMP_NUM_THREADS": "1",
        },
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=memcgroup.joining(memory_cgroup),
    )
    return done, folder / "res"


def test_the_answer_is_bracketed_by_an_ok_probe_and_a_real_oom(fitted, memory_cgroup) -> None:
    done, results = fitted
    assert done.returncode == 0, done.stderr[-3000:]
    fit = json.loads((results / "fit.json").read_text())
    (search,) = fit["families"]
    probes = {p["value"]: p for p in search["probes"]}
    assert search["ending"] == "bracketed", search
    answer, miss = search["largest_fit"], search["first_too_big"]
    assert answer == miss - 1
    assert (probes[answer]["status"], probes[answer]["verdict"]) == ("ok", "fits")
    assert probes[miss]["status"] == "oom", probes[miss]
    assert "killed by the kernel's out-of-memory killer" in probes[miss]["reason"]
    assert search["why_too_big"].startswith("oom: host memory: ")
    # the margin was taken of the cgroup's limit, and the answer stayed within it
    assert search["capacity_bytes"] == LIMIT_BYTES
    assert "memory cgroup limit" in search["capacity_source"]
    assert 0 < probes[answer]["peak_memory_bytes"] < 0.9 * LIMIT_BYTES
    assert search["tokens_per_second"] == probes[answer]["tokens_per_second"] > 0
    # each probe is its own run folder and row; the answer is printed and in fit.md
    rows = (results / "raw_summary.csv").read_text().splitlines()
    assert len(rows) == 1 + len(probes)
    assert all(
        (results / "runs" / p["experiment_id"] / "outcome.json").is_file() for p in probes.values()
    )
    assert f"| per_device_train_batch_size | {answer} |" in done.stdout
    assert f"| {miss} | oom | too_big: host memory:" in (results / "fit.md").read_text()
    assert (memory_cgroup / "cgroup.procs").read_text().split() == []
