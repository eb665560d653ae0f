"""What running on Ray costs: submit -> all ranks started, and the round trip per experiment.

For one-experiment matrices (a 2-process CPU experiment, tiny Llama) on an
idle Ray cluster, so no task waits for another's resources:

- submit -> task started: from the orchestrator's submission (``ray.json``'s
  ``submitted_at``, written just before the task is submitted) to the task
  running in its worker on a node (``ray.json``'s ``started_at``: Ray's
  scheduling, a worker for the task's runtime environment, unpickling);
- submit -> all ranks started: to the moment the last rank began its first
  training step (``result.json``: each rank's ``first_step_end_unix -
  first_step_s``). This includes what any executor pays (``accelerate
  launch``, Python, torch, the model and data), so the same figure is given
  for a local run of the experiment (from the experiment's start);
- the round trip: a run's wall time beyond the job's own lifetime
  (``outcome.json``'s ``job_s``), Ray against ``--executor local`` on the same
  matrix; the difference is what Ray adds per experiment (connecting, the
  shared-folder check, submitting, waiting, collecting).

Usage: python benchmarks/bench_ray.py [--submissions N] [--steps S] [--address ADDR]

Uses the cluster at ``--address`` (or RAY_ADDRESS); where none is given, it
starts the tests' local cluster of two node processes (tests/raycluster.py: a
head and a worker, 2 CPUs each) and stops it at the end. Target: submit ->
task started under 5 s on the local cluster. Exit code 1 if it is missed.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

SUBMIT_TO_TASK_TARGET_S = 5.0


def scenarios_text(steps: int, rate: float) -> str:
    return f"""\
frameworks:
  ddp: {{accelerate_config: {REPO / "accelerate-ddp.yaml"}}}
matrix:
  effective_batch_size: [4]
  num_gpus: [2]
scenarios:
  - name: bench
    device: cpu
    framework_config: [ddp]
    arguments:
      model_name_or_path: tiny-llama
      max_seq_len: 64
      max_steps: {steps}
    sweep:
      learning_rate: [{rate:.0e}]
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
        sys.exit(f"bench_ray: the run failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    with (folder / results / "raw_summary.csv").open() as f:
        statuses = [r["status"] for r in csv.DictReader(f)]
    if set(statuses) != {"ok"}:
        sys.exit(f"bench_ray: not every experiment ended ok: {statuses}")
    return wall


def one_run(results: Path) -> tuple[dict[str, object], dict[str, object], Path]:
    (outcome_path,) = results.glob("runs/*/outcome.json")
    result = json.loads((outcome_path.parent / "result.json").read_text())
    return json.loads(outcome_path.read_text()), result, outcome_path.parent


def ranks_started(result: dict[str, object]) -> float:
    """When the last rank began its first step (unix seconds)."""
    ranks = result.get("ranks") or []
    starts = [
        float(r["first_step_end_unix"]) - float(r["first_step_s"])
        for r in ranks  # type: ignore[union-attr]
        if r.get("first_step_end_unix") is not None and r.get("first_step_s") is not None
    ]
    if len(starts) < 2:
        sys.exit(f"bench_ray: expected the first-step times of 2 ranks, found {len(starts)}")
    return max(starts)


def _stamp(text: object) -> float:
    return datetime.fromisoformat(str(text)).timestamp()


def cluster_env(address: str | None) -> tuple[dict[str, str], object | None]:
    """The environment that reaches a Ray cluster, and the cluster we started (or None)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    address = address or os.environ.get("RAY_ADDRESS")
    if address:
        return {**env, "RAY_ADDRESS": address}, None
    sys.path.insert(0, str(REPO / "tests"))
    import raycluster

    started = raycluster.start_cluster(head_cpus=2, worker_cpus=2)
    return {**env, **started.env}, started


def bench_ray(
    folder: Path, submissions: int, steps: int, address: str | None
) -> tuple[bool, list[str]]:
    env, started = cluster_env(address)
    to_task, to_ranks, local_ranks, ray_extra, local_extra = [], [], [], [], []
    try:
        for i in range(submissions):
            (folder / "scenarios.yaml").write_text(scenarios_text(steps, (i + 1) * 1e-4))
            results = f"ray{i}"
            wall = tunematrix(folder, env, results, "--executor", "ray")
            outcome, result, run = one_run(folder / results)
            record = json.loads((run / "ray.json").read_text())
            submitted = float(record["submitted_at"])
            to_task.append(float(record["started_at"]) - submitted)
            to_ranks.append(ranks_started(result) - submitted)
            ray_extra.append(wall - float(outcome["job_s"]))  # type: ignore[arg-type]
            local = f"local{i}"
            wall = tunematrix(folder, env, local)
            outcome, result, _ = one_run(folder / local)
            local_ranks.append(ranks_started(result) - _stamp(outcome["started_at"]))
            local_extra.append(wall - float(outcome["job_s"]))  # type: ignore[arg-type]
    finally:
        if started is not None:
            started.stop()  # type: ignore[attr-defined]
    median = statistics.median(to_task)
    added = statistics.median(ray_extra) - statistics.median(local_extra)
    lines = [
        f"Ray submit -> task started: median {median:.2f} s (min {min(to_task):.2f}, "
        f"max {max(to_task):.2f}; {submissions} submissions)",
        f"Ray submit -> all ranks started (2 ranks' first step): median "
        f"{statistics.median(to_ranks):.2f} s; local, experiment start -> all ranks started: "
        f"{statistics.median(local_ranks):.2f} s",
        f"run wall time beyond the job itself: Ray {statistics.median(ray_extra):.2f} s, "
        f"local {statistics.median(local_extra):.2f} s -> Ray adds {added:.2f} s per experiment",
    ]
    return median <= SUBMIT_TO_TASK_TARGET_S, lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--submissions", type=int, default=4)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--address", help="a Ray cluster (default: RAY_ADDRESS, else start one)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-ray-") as tmp:
        folder = Path(tmp)
        os.environ.setdefault("TUNEMATRIX_CACHE", str(folder / "cache"))
        ok, lines = bench_ray(folder, args.submissions, args.steps, args.address)
    for line in lines:
        print(line)
    print(
        f"target: submit -> task started <= {SUBMIT_TO_TASK_TARGET_S:.0f} s: "
        f"{'met' if ok else 'MISSED'}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
