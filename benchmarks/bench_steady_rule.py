"""How often steady-state stopping stops on a mean that is as good as it claims.

A pure simulation of the stop rule (``orchestrator.contract.steady``), no training:
step times with a known true mean (1.0) and a 15% spread, independent or
correlated from step to step (AR(1) with φ = 0.5 and 0.8, the way a slow step
tends to follow a slow one), each run checked after every step exactly as the
child checks it. For each setting it prints how many runs stopped before the
step cap, the share of those whose mean was within ±precision of the true mean
(what a user reads the precision as), and the median step they stopped at;
once for the rule tunematrix uses (the 99% batch-means interval, at least 5
batches) and once for the plain 95% interval with 3 batches, which checking
after every step makes too optimistic.

    python benchmarks/bench_steady_rule.py              # 300 runs per setting (~1 min)
    python benchmarks/bench_steady_rule.py --runs 100
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from orchestrator.contract import steady


def series(n: int, phi: float, spread: float, rng: random.Random) -> list[float]:
    """AR(1) step times around 1.0 with standard deviation ``spread``."""
    x, out = 0.0, []
    for _ in range(n):
        x = phi * x + rng.gauss(0.0, spread * (1 - phi * phi) ** 0.5)
        out.append(1.0 + x)
    return out


def stops_on(window: list[float], precision: float, quantile: float, batches: int) -> bool:
    interval = steady.batch_means_interval(window, quantile, batches)
    relative = interval.relative if interval is not None else None
    return relative is not None and relative <= precision


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=300, help="runs per setting (default 300)")
    parser.add_argument("--max-steps", type=int, default=steady.DEFAULT_MAX_STEPS)
    parser.add_argument("--min-steps", type=int, default=steady.DEFAULT_MIN_STEPS)
    args = parser.parse_args()
    rules = {
        "tunematrix (99%, ≥5 batches)": (steady.STOP_QUANTILE, steady.MIN_STOP_BATCHES),
        "plain 95%, ≥3 batches": (0.975, steady.MIN_BATCHES),
    }
    print(
        f"{args.runs} simulated runs per line, step times 1.0 ± 15%, warm-up as a run's, "
        f"min_steps {args.min_steps}, max_steps {args.max_steps}"
    )
    print(
        f"{'rule':30} {'φ':>4} {'prec':>5} {'stopped':>8} {'within ±prec':>13} {'median step':>12}"
    )
    for name, (quantile, batches) in rules.items():
        for phi in (0.0, 0.5, 0.8):
            for precision in (0.02, 0.05):
                rng = random.Random(7)
                stopped, good, at = 0, 0, []
                for _ in range(args.runs):
                    times = series(args.max_steps, phi, 0.15, rng)
                    for n in range(1, args.max_steps + 1):
                        window = times[steady.window_start(n, None) : n]
                        if len(window) >= args.min_steps and stops_on(
                            window, precision, quantile, batches
                        ):
                            stopped += 1
                            good += abs(statistics.fmean(window) - 1.0) <= precision
                            at.append(n)
                            break
                share = f"{good / stopped:.2f}" if stopped else "–"
                median = f"{statistics.median(at):.0f}" if at else "–"
                print(
                    f"{name:30} {phi:>4} {precision:>5} {stopped:>4}/{args.runs:<3} "
                    f"{share:>13} {median:>12}"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
