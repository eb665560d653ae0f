"""What ``eval: true`` costs. Targets (issue: eval after training):

- training is measured as without eval: the steady-state tokens/s of a cell with
  eval is at least 98% of the same cell without it (medians of interleaved runs;
  eval runs after the measured steps, so only noise should separate them);
- the wall time eval adds is reported, not bounded: ``eval_runtime`` (the
  trainer's ``evaluate()`` on the held-out split, dataset preparation included)
  against the job's whole lifetime, and the difference of the median job times.

Usage: python benchmarks/bench_eval.py [--pairs N] [--steps S] [--holdout H]

Runs one cell (a 4-layer llama, 256 wide, packed rows of 256 tokens, one CPU
process, the sidecar on) with ``eval`` off and on, interleaved A B B A ... so
that drift hits both alike, each run a real ``accelerate launch``. Packed rows
make every step the same number of tokens with or without the held-out
documents. Exit code 1 if a target is missed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from abcell import CELL, plan_cell, ratio_line, run_alternated, spread_line

#: the least tokens/s with eval over tokens/s without it (medians)
TARGET_RATIO = 0.98


def interleaved(
    folder: Path, pairs: int, steps: int, holdout: int
) -> dict[str, list[dict[str, Any]]]:
    """Per eval setting ("off", "on"), each run's tokens/s, job time and eval time, A B B A ..."""
    experiments = plan_cell(
        folder,
        steps=steps,
        arguments={"trainer": "hf", "holdout": holdout},
        sweep={"eval": [False, True]},
    )
    by_eval = {"on" if e.arguments.get("eval") else "off": e for e in experiments}

    def figures(variant: str, outcome: Any, run: Any, result: dict[str, Any]) -> dict[str, Any]:
        metrics = result["metrics"]
        return {
            "tps": metrics["tokens_per_second_global"],
            "job_s": outcome.job_s or 0.0,
            "eval_s": metrics.get("eval_runtime") or 0.0,
            "tokens": metrics["tokens_measured"],
        }

    return run_alternated(folder, {"off": by_eval["off"], "on": by_eval["on"]}, pairs, figures)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=4, help="eval off/on pairs of runs")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--holdout", type=int, default=64, help="held-out documents")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    with tempfile.TemporaryDirectory() as tmp:
        runs = interleaved(Path(tmp), args.pairs, args.steps, args.holdout)

    off, on = runs["off"], runs["on"]
    tps_off, tps_on = [r["tps"] for r in off], [r["tps"] for r in on]
    ratio, line = ratio_line(tps_on, tps_off, "tokens/s with eval / without")
    eval_s = statistics.median(r["eval_s"] for r in on)
    job_on = statistics.median(r["job_s"] for r in on)
    job_off = statistics.median(r["job_s"] for r in off)
    print(
        f"one cell ({CELL}, {args.steps} steps, CPU, 1 process, trainer hf), "
        f"eval on {args.holdout} held-out documents:"
    )
    print(spread_line("eval off", tps_off, width=8))
    print(spread_line("eval on", tps_on, width=8))
    print(line)
    print(
        "tokens measured, off / on: "
        f"{sorted({r['tokens'] for r in off})} / {sorted({r['tokens'] for r in on})}"
    )
    print(
        f"eval_runtime (median) {eval_s:.2f} s = {100 * eval_s / job_on:.1f}% of the job "
        f"({job_on:.1f} s); median job time on - off: {job_on - job_off:+.2f} s"
    )
    good = ratio >= TARGET_RATIO
    print(f"tokens/s with eval / without >= {TARGET_RATIO}: {'met' if good else 'MISSED'}")
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main())
