"""What a profile costs. Target (issue: frameworks and insight): the profile adds
nothing to the throughput window — a profiled run's measured steps run as fast as
an unprofiled run's, profiled / plain tokens/s ≥ 0.99.

Usage: python benchmarks/bench_profile.py [--pairs N] [--steps S] [--processes P]
       [--profile-steps K] [--warmup W]

Runs the same CPU cell (a small Llama, random weights, packed blocks; gloo DDP
with ``--processes`` ranks) again and again through ``run_experiment``, each run
a fresh ``accelerate launch``, alternating a profiled run (``K`` steps recorded
after a warm-up of ``W``) with a plain one, A B B A ... so drift hits both
alike. Both measure the same steps: the plain run's warm-up is ``W + K``, so the
comparison is of the same step indices, with and without a profile before them.

Prints, per variant, the measured window's median step time and tokens/s (and
their medians), the ratio of the medians and the spread of the pairs' ratios;
then what the profile itself costs in wall time: its steps (the slowest rank's
profiled steps less as many median measured steps: the profiler's overhead, the
stop and the trace export) and the export alone (``profile_export_s``), and the
job's wall time (``job_s``) of each variant. Exit code 1 if the ratio misses
the target.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from abcell import CELL, plan_cell, ratio_line, run_alternated, spread_line

TARGET = 0.99


def _figures(result: dict[str, Any], job_s: float | None, profiled: bool) -> dict[str, Any]:
    metrics = result["metrics"]
    ranks = result["ranks"]
    steps = metrics["steps"]
    start = steps - metrics["steps_measured"]
    # the slowest rank sets each step's pace, as the window's figures count it
    paced = [max(r["step_times_s"][i] for r in ranks) for i in range(steps)]
    median = statistics.median(paced[start:])
    figures = {
        "tps": float(metrics["tokens_per_second_global"]),
        "step_median_s": float(metrics["step_time_median_s"]),
        "job_s": float(job_s or 0.0),
        "paced": paced,
    }
    if profiled:
        first = metrics["warmup_steps_excluded"]
        k = metrics["profiled_steps"]
        figures["profile_steps_s"] = sum(paced[first : first + k])
        figures["profile_cost_s"] = figures["profile_steps_s"] - k * median
        figures["export_s"] = float(metrics["profile_export_s"])
        figures["comm_pct"] = float(metrics["comm_time_pct"])
    return figures


def ab_runs(
    folder: Path, pairs: int, steps: int, processes: int, profile_steps: int, warmup: int
) -> dict[str, list[dict[str, Any]]]:
    """Each variant's runs: tokens/s, median step time, job time, the profile's cost."""
    (experiment,) = plan_cell(folder, steps=steps, processes=processes)
    variants = {
        # the same measured steps: the plain run's warm-up covers the profiled steps too
        "profiled": dataclasses.replace(
            experiment,
            profile_steps=profile_steps,
            arguments={**experiment.arguments, "warmup_steps_excluded": warmup},
        ),
        "plain": dataclasses.replace(
            experiment,
            arguments={**experiment.arguments, "warmup_steps_excluded": warmup + profile_steps},
        ),
    }

    def figures(variant: str, outcome: Any, run: Any, result: dict[str, Any]) -> dict[str, Any]:
        found = _figures(result, outcome.job_s, variant == "profiled")
        steps = " ".join(f"{1000 * t:.0f}" for t in found["paced"])
        print(f"  {variant:<9} step times (ms, slowest rank): {steps}", flush=True)
        if variant == "profiled":
            assert run.profile_trace(0).is_file(), "the profiled run left no trace"
        return found

    return run_alternated(folder, variants, pairs, figures)


def _ms(seconds: float) -> str:
    return f"{1000 * seconds:.1f} ms"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=6, help="profiled/plain pairs of runs")
    parser.add_argument("--steps", type=int, default=40, help="training steps per run")
    parser.add_argument("--processes", type=int, default=2, help="training processes per run")
    parser.add_argument("--profile-steps", type=int, default=3, help="steps a profile records")
    parser.add_argument("--warmup", type=int, default=3, help="warm-up steps before the profile")
    args = parser.parse_args()
    if args.steps <= args.warmup + args.profile_steps:
        parser.error("--steps must leave a measured step after --warmup and --profile-steps")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    with tempfile.TemporaryDirectory() as tmp:
        runs = ab_runs(
            Path(tmp), args.pairs, args.steps, args.processes, args.profile_steps, args.warmup
        )

    on = [r["tps"] for r in runs["profiled"]]
    off = [r["tps"] for r in runs["plain"]]
    ratio, line = ratio_line(on, off, "profiled / plain tokens/s")
    measured = args.steps - args.warmup - args.profile_steps
    print(
        f"cell: {CELL}, {args.steps} steps, {args.processes} process(es), CPU gloo DDP, "
        f"{args.pairs} pairs; both measure steps {args.warmup + args.profile_steps}.."
        f"{args.steps - 1} ({measured}); the profiled runs record {args.profile_steps} steps "
        f"after {args.warmup} (OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'default')})"
    )
    for name, rs in runs.items():
        print(
            f"{spread_line(name, [r['tps'] for r in rs], width=9)}; step time median "
            f"{_ms(statistics.median(r['step_median_s'] for r in rs))}; job "
            f"{statistics.median(r['job_s'] for r in rs):.1f} s"
        )
    print(line)
    prof = runs["profiled"]
    print(
        f"the profile's wall time: its {args.profile_steps} steps "
        f"{_ms(statistics.median(r['profile_steps_s'] for r in prof))}, of which above as many "
        f"measured steps {_ms(statistics.median(r['profile_cost_s'] for r in prof))}; the "
        f"stop and export alone {_ms(statistics.median(r['export_s'] for r in prof))}; "
        f"comm_time_pct {statistics.median(r['comm_pct'] for r in prof):.1f}"
    )
    good = ratio >= TARGET
    print(f"tokens/s profiled / plain >= {TARGET}: {'met' if good else 'MISSED'}")
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main())
