"""Scale-out costs and gains (issue: pack jobs onto a node, run the matrix on SLURM).

- SLURM submission overhead per experiment: from the orchestrator's sbatch
  (``slurm.json``'s ``submitted_at``) to the experiment starting inside the
  job (``outcome.json``'s ``started_at``: SLURM's scheduling, the job's
  Python start and submitit's unpickling), for one-experiment matrices on an
  idle cluster, so no job waits for another's resources; and what the whole
  SLURM round trip (submit, wait, collect) adds to a run's wall time over the
  local executor on the same matrix.
- packing speedup on CPU slots: wall time of 8 tiny jobs one at a time,
  divided by the wall time of the same 8 packed on 2 slots.

Usage: python benchmarks/bench_slurm.py [--submissions N] [--jobs 8] [--slots 2] [--steps S]

Uses the SLURM cluster that ``sinfo`` reaches (``SLURM_CONF``); where there is
none, it starts the tests' one-node cluster (tests/slurmcluster.py: needs
root, installs Debian's slurm-wlm and munge where missing) and stops it at the
end. ``--no-slurm`` measures packing only. Targets: submit-to-start under 10 s
on the local cluster; packing at least 1.3x faster on 2 slots (with 2 cores or
more). Exit code 1 if one is missed.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

SUBMIT_TO_START_TARGET_S = 10.0
PACKING_TARGET = 1.3


def scenarios_text(steps: int, rates: list[float]) -> str:
    return f"""\
frameworks:
  ddp: {{accelerate_config: {REPO / "accelerate-ddp.yaml"}}}
matrix:
  effective_batch_size: [4]
scenarios:
  - name: bench
    device: cpu
    framework_config: [ddp]
    num_gpus: [1]
    arguments:
      model_name_or_path: tiny-llama
      max_seq_len: 64
      max_steps: {steps}
    sweep:
      learning_rate: [{", ".join(f"{r:.0e}" for r in rates)}]
"""


def tunematrix(folder: Path, env: dict[str, str], results: str, *extra: str) -> float:
    """Run the matrix in ``folder``; its wall time. Every experiment must end ok."""
    start = time.monotonic()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "orchestrator",
            "run",
            "--scenarios",
            "scenarios.yaml",
            "--defaults",
            str(REPO / "defaults.yaml"),
            "--results",
            results,
            "--device",
            "cpu",
            "--no-report",
            *extra,
        ],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    wall = time.monotonic() - start
    if proc.returncode != 0:
        sys.exit(f"bench_slurm: the run failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    with (folder / results / "raw_summary.csv").open() as f:
        statuses = [r["status"] for r in csv.DictReader(f)]
    if set(statuses) != {"ok"}:
        sys.exit(f"bench_slurm: not every experiment ended ok: {statuses}")
    return wall


def outcomes(results: Path) -> list[dict[str, object]]:
    return [json.loads(p.read_text()) for p in sorted(results.glob("runs/*/outcome.json"))]


def _stamp(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def cluster_env() -> tuple[dict[str, str], object | None]:
    """The environment that reaches a SLURM cluster, and the cluster we started (or None)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    if shutil.which("sinfo"):
        probe = subprocess.run(["sinfo", "-h"], capture_output=True, text=True, env=env)
        if probe.returncode == 0 and probe.stdout.strip():
            return env, None
    sys.path.insert(0, str(REPO / "tests"))
    import slurmcluster

    started = slurmcluster.start(Path(tempfile.mkdtemp(prefix="bench-slurm-")))
    if isinstance(started, str):
        sys.exit(f"bench_slurm: no SLURM cluster: {started} (--no-slurm measures packing only)")
    return {**env, **started.env}, started


def bench_slurm(folder: Path, submissions: int, steps: int) -> tuple[bool, list[str]]:
    env, started = cluster_env()
    try:
        latencies, slurm_extra, local_extra = [], [], []
        for i in range(submissions):
            (folder / "scenarios.yaml").write_text(scenarios_text(steps, [(i + 1) * 1e-4]))
            results = f"slurm{i}"
            wall = tunematrix(folder, env, results, "--executor", "slurm")
            (outcome,) = outcomes(folder / results)
            record = json.loads(next((folder / results).glob("runs/*/slurm.json")).read_text())
            latencies.append(_stamp(str(outcome["started_at"])) - float(record["submitted_at"]))
            slurm_extra.append(wall - float(outcome["job_s"]))  # type: ignore[arg-type]
            local = f"local{i}"
            wall = tunematrix(folder, env, local)
            (outcome,) = outcomes(folder / local)
            local_extra.append(wall - float(outcome["job_s"]))  # type: ignore[arg-type]
    finally:
        if started is not None:
            started.stop()  # type: ignore[attr-defined]
    median = statistics.median(latencies)
    added = statistics.median(slurm_extra) - statistics.median(local_extra)
    lines = [
        f"SLURM submit -> start per experiment: median {median:.2f} s "
        f"(min {min(latencies):.2f}, max {max(latencies):.2f}; {submissions} submissions)",
        f"run wall time beyond the job itself: SLURM {statistics.median(slurm_extra):.2f} s, "
        f"local {statistics.median(local_extra):.2f} s -> SLURM adds {added:.2f} s per experiment",
    ]
    return median <= SUBMIT_TO_START_TARGET_S, lines


def bench_packing(folder: Path, jobs: int, slots: int, steps: int) -> tuple[bool, list[str]]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    (folder / "scenarios.yaml").write_text(
        scenarios_text(steps, [(i + 1) * 1e-4 for i in range(jobs)])
    )
    exclusive = tunematrix(folder, env, "exclusive")
    packed = tunematrix(folder, env, "packed", "--pack", "--slots", str(slots))
    speedup = exclusive / packed
    cores = os.cpu_count() or 1
    lines = [
        f"packing {jobs} tiny jobs on {slots} CPU slots ({cores} cores): exclusive "
        f"{exclusive:.1f} s, packed {packed:.1f} s -> speedup {speedup:.2f}x"
    ]
    return (speedup >= PACKING_TARGET or cores < 2), lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--submissions", type=int, default=4)
    parser.add_argument("--jobs", type=int, default=8)
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--no-slurm", action="store_true", help="measure packing only")
    args = parser.parse_args()
    ok = True
    lines: list[str] = []
    with tempfile.TemporaryDirectory(prefix="bench-slurm-") as tmp:
        folder = Path(tmp)
        os.environ.setdefault("TUNEMATRIX_CACHE", str(folder / "cache"))
        if not args.no_slurm:
            met, found = bench_slurm(folder, args.submissions, args.steps)
            ok &= met
            lines += found
        met, found = bench_packing(folder, args.jobs, args.slots, args.steps)
        ok &= met
        lines += found
    for line in lines:
        print(line)
    print(
        f"targets: submit -> start <= {SUBMIT_TO_START_TARGET_S:.0f} s, packing >= "
        f"{PACKING_TARGET}x: {'met' if ok else 'MISSED'}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
