"""How fast is planning? Targets (issue: plan the matrix):

- planning a 10,000-experiment matrix (load + validate + expand + ids) < 1 s
- ``DRY_RUN=true bash run_benchmarks.sh`` on the shipped files < 1.5 s wall

Usage: python benchmarks/bench_plan.py [--runs N]

Prints the median (and min/max) of N runs for each measurement and whether it
meets its target. Exit code 1 if a target is missed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from orchestrator.config.scenarios import load_config  # noqa: E402
from orchestrator.matrix.expand import Selection, build_plan  # noqa: E402


def big_scenarios(n_scenarios: int = 25) -> str:
    """25 scenarios × 5 models × 5 swept learning rates × 16 axis cells = 10,000."""
    models = "\n".join(f"        - org/model-{i}" for i in range(5))
    blocks = []
    for s in range(n_scenarios):
        blocks.append(
            f"""  - name: scenario-{s}
    framework_config: [fsdp]
    arguments:
      peft_method: lora
      r: {8 + s}
      target_modules: [q_proj, k_proj, v_proj, o_proj]
      model_name_or_path:
{models}
    sweep:
      learning_rate: [1e-5, 2e-5, 5e-5, 1e-4, 2e-4]
"""
        )
    return (
        "frameworks:\n  fsdp: {accelerate_config: " + str(REPO / "accelerate.yaml") + "}\n"
        "matrix:\n  num_gpus: [1, 2]\n  effective_batch_size: [8, 16]\n"
        "  max_seq_len: [1024, 2048]\n  packing: [true, false]\n"
        "scenarios:\n" + "".join(blocks)
    )


def measure(fn: Callable[[], object], runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def report(name: str, times: list[float], target: float) -> bool:
    med = statistics.median(times)
    ok = med < target
    print(
        f"{name:<58} median {med * 1000:7.1f} ms  "
        f"(min {min(times) * 1000:.1f}, max {max(times) * 1000:.1f}, n={len(times)})  "
        f"target < {target * 1000:.0f} ms: {'met' if ok else 'MISSED'}"
    )
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()

    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        scenarios = Path(tmp) / "scenarios.yaml"
        scenarios.write_text(big_scenarios())

        def plan_10k() -> int:
            config = load_config(scenarios, defaults_file=REPO / "defaults.yaml")
            plan = build_plan(config, Selection(device="gpu"), gpu_count=0)
            return len(plan.experiments)

        count = plan_10k()
        assert count == 10_000, count
        ok &= report(f"plan {count:,} experiments (in process)", measure(plan_10k, args.runs), 1.0)

        env = {**os.environ, "PYTHON": sys.executable, "DRY_RUN": "true"}
        env.pop("DEVICE", None)

        def dry_run() -> None:
            subprocess.run(
                ["bash", str(REPO / "run_benchmarks.sh")],
                cwd=tmp,
                env=env,
                check=True,
                stdout=subprocess.DEVNULL,
            )

        dry_run()  # warm the file cache and bytecode
        ok &= report(
            "DRY_RUN=true bash run_benchmarks.sh (shipped files, wall)",
            measure(dry_run, args.runs),
            1.5,
        )

        def cli_10k() -> None:
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "orchestrator",
                    "plan",
                    "--scenarios",
                    str(scenarios),
                    "--device",
                    "gpu",
                    "--output",
                    str(Path(tmp) / "plan.csv"),
                ],
                cwd=REPO,
                check=True,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )

        report(
            "tunematrix plan --output plan.csv, 10,000 rows (wall)",
            measure(cli_10k, max(3, args.runs // 2)),
            3.0,
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
