"""How close `tunematrix plan`'s up-front estimate comes to the time a matrix then takes.

A tiny CPU matrix (tiny-llama, 1 process, the baseline and one overlay) is run
once into a fresh results folder, so its history holds those cells. Then two
matrices are estimated from that history and run:

- **own**: the same matrix again (each experiment estimated from its own cell's
  earlier run);
- **similar**: the same cells with twice the steps and twice the effective batch
  (new cell ids: estimated from similar cells, their tokens/s scaled to the new
  tokens plus their time outside the training steps).

It prints, for each, the estimated and the actual device-hours (the sum of the
experiments' wall time × processes) and the error of the estimate. Timings need
a quiet machine: other work on it slows the runs and not the estimate.

    python benchmarks/bench_estimate.py            # the two matrices, ~1.5 min
    python benchmarks/bench_estimate.py --steps 4  # shorter runs
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from orchestrator import api  # noqa: E402
from orchestrator.contract.layout import ResultsLayout  # noqa: E402
from orchestrator.results.estimate import estimate_plan  # noqa: E402


def scenarios(steps: int) -> str:
    return f"""\
accelerate_config: {REPO / "accelerate-ddp.yaml"}
frameworks:
  hot-lr:
    arguments: {{learning_rate: 0.1}}
matrix:
  max_seq_len: [64]
  packing: [true]
scenarios:
  - name: est
    device: cpu
    framework_config: [null, hot-lr]
    num_gpus: [1]
    arguments:
      model_name_or_path: tiny-llama
      max_steps: {steps}
      logging_steps: 1
"""


def run(folder: Path, scenario_file: Path, batch: int) -> float:
    """Run the matrix; the sum of its experiments' wall time × processes, in hours."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "orchestrator", "run", "--scenarios", str(scenario_file)]
    cmd += ["--device", "cpu", "--results", str(folder), "--effective-batch-size", str(batch)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"the run failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    with (folder / "raw_summary.csv").open() as f:
        rows = list(csv.DictReader(f))
    return sum(float(r["wall_s"]) * float(r["num_gpus"]) for r in rows) / 3600


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=10, help="steps of the first matrix")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        results = root / "res"
        first = root / "first.yaml"
        first.write_text(scenarios(args.steps))
        longer = root / "longer.yaml"
        longer.write_text(scenarios(2 * args.steps))
        run(results, first, 4)
        print(f"history: one run of 2 cells, {args.steps} steps, batch 4 (tiny-llama, CPU)")
        print(f"{'matrix':<10} {'basis':<22} {'estimate h':>11} {'actual h':>10} {'error':>8}")
        for name, scenario_file, batch in (("own", first, 4), ("similar", longer, 8)):
            plan = api.plan(scenario_file, device="cpu", effective_batch_size=batch)
            estimate = estimate_plan(plan.experiments, ResultsLayout(results).history)
            basis = f"{estimate.count('own')} own, {estimate.count('similar')} similar"
            actual = run(results, scenario_file, batch)
            error = estimate.device_hours / actual - 1
            print(
                f"{name:<10} {basis:<22} {estimate.device_hours:>11.5f} {actual:>10.5f} "
                f"{100 * error:>+7.1f}%"
            )


if __name__ == "__main__":
    main()
