"""What a two-node SLURM job costs (issue 16): submit -> all ranks started, and the round trip.

On the tests' two-node cluster (tests/slurmcluster.py ``start_nodes``: one
slurmctld here, two slurmd in network namespaces of one CPU each), one CPU
experiment of 2 processes runs as one job over both nodes (gloo DDP between
the namespaces), and the same experiment runs with ``--executor local``
(both processes on this machine).

- submit -> all ranks started: from the orchestrator's sbatch (``slurm.json``'s
  ``submitted_at``) to the first write of the child's ``progress.json``
  (watched every 20 ms while the run goes on). Rank 0 writes it when training
  begins, which is after every rank has joined the process group and DDP has
  broadcast the parameters: both ranks have started and met. It includes
  SLURM's scheduling, each node's Python and submitit start, accelerate
  launch, the model's load and the data preparation. Beside it: the same
  span for the local run (from the orchestrator's start of the experiment,
  ``outcome.json``'s ``started_at``), and the nodes' launch times
  (``started_at`` of ``outcome.json`` and ``outcome.node1.json``).
- round-trip overhead per experiment: the run's wall time minus the job's own
  lifetime (``job_s``), SLURM minus local. It covers the shared-folder check,
  the submission, the wait for SLURM to say the job ended, and the merge.

Usage: python benchmarks/bench_slurm_multinode.py [--repeats N] [--steps S]
Needs root (network namespaces) and SLURM (installed where missing, as for the
tests). Prints the figures; the README's "Running on a cluster" section lists
them next to the one-node SLURM figures (benchmarks/bench_slurm.py).
"""

from __future__ import annotations

import argparse
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
    num_gpus: [2]
    arguments:
      model_name_or_path: tiny-llama
      max_seq_len: 64
      trainer: hf
      max_steps: {steps}
      learning_rate: {rate:.0e}
"""


def _stamp(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def run(folder: Path, env: dict[str, str], results: str, *extra: str) -> dict[str, float]:
    """One run of the matrix in ``folder``: its wall time and when progress.json first appeared."""
    argv = [sys.executable, "-m", "orchestrator", "run", "--scenarios", "scenarios.yaml"]
    argv += ["--defaults", str(REPO / "defaults.yaml"), "--results", results]
    argv += ["--device", "cpu", "--no-report", *extra]
    start = time.monotonic()
    first_progress: float | None = None
    with (folder / f"{results}.log").open("w") as log:
        proc = subprocess.Popen(argv, cwd=folder, env=env, stdout=log, stderr=subprocess.STDOUT)
        while proc.poll() is None:
            if first_progress is None and list((folder / results).glob("runs/*/progress.json")):
                first_progress = time.time()
            time.sleep(0.02)
    wall = time.monotonic() - start
    if proc.returncode != 0 or first_progress is None:
        text = (folder / f"{results}.log").read_text()[-3000:]
        sys.exit(f"bench_slurm_multinode: the {results} run failed:\n{text}")
    (run_dir,) = [p for p in (folder / results / "runs").iterdir() if p.is_dir()]
    outcome = json.loads((run_dir / "outcome.json").read_text())
    if outcome["status"] != "ok":
        sys.exit(f"bench_slurm_multinode: {results} ended {outcome['status']}: {outcome['error']}")
    figures = {
        "wall": wall,
        "beyond_job": wall - float(outcome["job_s"]),
        "progress_at": first_progress,
        "node0_started": _stamp(outcome["started_at"]),
    }
    node1 = run_dir / "outcome.node1.json"
    if node1.is_file():
        figures["node1_started"] = _stamp(json.loads(node1.read_text())["started_at"])
    record = run_dir / "slurm.json"
    if record.is_file():
        figures["submitted_at"] = float(json.loads(record.read_text())["submitted_at"])
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()
    sys.path.insert(0, str(REPO / "tests"))
    import slurmcluster

    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    with tempfile.TemporaryDirectory(prefix="bench-slurm2-") as tmp:
        folder = Path(tmp)
        env.setdefault("TUNEMATRIX_CACHE", str(folder / "cache"))
        started = slurmcluster.start_nodes(folder / "cluster", count=2, cpus=1)
        if isinstance(started, str):
            sys.exit(f"bench_slurm_multinode: no two-node SLURM cluster: {started}")
        slurm_env = {**env, **started.env}
        to_all, to_launch, local_start, slurm_extra, local_extra = [], [], [], [], []
        try:
            for i in range(args.repeats):
                (folder / "scenarios.yaml").write_text(scenarios_text(args.steps, (i + 1) * 1e-4))
                s = run(folder, slurm_env, f"slurm{i}", "--executor", "slurm")
                to_all.append(s["progress_at"] - s["submitted_at"])
                to_launch.append(max(s["node0_started"], s["node1_started"]) - s["submitted_at"])
                slurm_extra.append(s["beyond_job"])
                loc = run(folder, env, f"local{i}", "--executor", "local")
                local_start.append(loc["progress_at"] - loc["node0_started"])
                local_extra.append(loc["beyond_job"])
        finally:
            started.stop()
    med = statistics.median
    print(
        f"two-node SLURM job (2 CPU processes, one per node), {args.repeats} runs, "
        f"cluster start {started.start_s:.1f} s:"
    )
    print(
        f"  submit -> both nodes launched: median {med(to_launch):.2f} s "
        f"(min {min(to_launch):.2f}, max {max(to_launch):.2f})"
    )
    print(
        f"  submit -> all ranks started (training began after the DDP rendezvous): median "
        f"{med(to_all):.2f} s (min {min(to_all):.2f}, max {max(to_all):.2f}); "
        f"local launch -> the same: {med(local_start):.2f} s"
    )
    print(
        f"  run wall time beyond the job itself: SLURM {med(slurm_extra):.2f} s, local "
        f"{med(local_extra):.2f} s -> SLURM adds {med(slurm_extra) - med(local_extra):.2f} s "
        "per experiment"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
