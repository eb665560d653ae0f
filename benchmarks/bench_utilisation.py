"""What utilisation sampling costs. Target (issue: frameworks and insight): the
sidecar's utilisation sampling (NVML utilisation rates, the job tree's CPU time)
costs under 1% of training throughput, instrumented / bare.

Usage: python benchmarks/bench_utilisation.py [--pairs N] [--steps S] [--processes P]
       [--samples K]

Runs the same tiny CPU cell (a small Llama, random weights, packed blocks) again
and again through ``run_experiment``, each run a fresh ``accelerate launch``
and a fresh sidecar, alternating the sidecar with utilisation sampling
("instrumented", the default) and without it ("bare": memory sampling only,
``TUNEMATRIX_SIDECAR_UTILISATION=0`` in the sidecar's environment, a switch for
this measurement only), A B B A ... so drift hits both alike. Prints each
variant's tokens/s (``tokens_per_second_global``, the measured steps) and
median, the ratio of the medians and the spread of the pairs' ratios.

It also prints what one sample costs the sidecar: from each run's
``sidecar.log`` (the sidecar's CPU time over its samples, both variants), and
from a microbenchmark of the tree pass alone (``--samples`` passes over a
tree of three idle processes, with and without the CPU-time reading), so the
figure does not rest on the end-to-end ratio alone, which on a small machine
is noisier than 1%. Exit code 1 if the ratio misses the target.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from abcell import CELL, plan_cell, ratio_line, run_alternated, spread_line

from orchestrator.job import utilisation

TARGET = 0.99
_SIDECAR_LINE = re.compile(r"sidecar: (\d+) samples \(([^)]*)\), ([0-9.]+) s CPU")


def ab_runs(
    folder: Path, pairs: int, steps: int, processes: int
) -> dict[str, list[dict[str, Any]]]:
    """Each variant's runs: tokens/s, cpu_util_mean_pct, the sidecar's samples and CPU."""
    (experiment,) = plan_cell(folder, steps=steps, processes=processes)

    def switch(variant: str) -> None:
        if variant == "bare":
            os.environ[utilisation.OFF_ENV] = "0"
        else:
            os.environ.pop(utilisation.OFF_ENV, None)

    def figures(variant: str, outcome: Any, run: Any, result: dict[str, Any]) -> dict[str, Any]:
        found = {"tps": float(result["metrics"]["tokens_per_second_global"])}
        if "cpu_util_mean_pct" in outcome.memory:
            found["cpu_util"] = float(outcome.memory["cpu_util_mean_pct"])
        match = _SIDECAR_LINE.search(run.sidecar_log.read_text())
        if match:
            found["samples"] = float(match.group(1))
            found["sidecar_cpu_s"] = float(match.group(3))
        return found

    try:
        variants = {"instrumented": experiment, "bare": experiment}
        return run_alternated(folder, variants, pairs, figures, before=switch)
    finally:
        os.environ.pop(utilisation.OFF_ENV, None)


def tree_pass_cost(samples: int) -> dict[str, float]:
    """CPU seconds per pass over a tree of three idle processes, RSS alone and RSS + CPU time."""
    from orchestrator.job.sidecar import _Tree

    code = (
        "import subprocess, sys, time; "
        "kids = [subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']) "
        "for _ in range(2)]; time.sleep(600)"
    )
    import psutil

    root = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.monotonic() + 30
        while len(psutil.Process(root.pid).children()) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        out = {}
        for name, cpu in (("rss", False), ("rss+cpu", True)):
            tree = _Tree(root.pid, cpu=cpu)
            tree.rss()
            assert len(tree.members) == 3, tree.members
            began = time.process_time()
            for _ in range(samples):
                tree.rss()
            out[name] = (time.process_time() - began) / samples
        return out
    finally:
        # the sleepers this started, by pid, then their parent
        for child in psutil.Process(root.pid).children():
            child.kill()
        root.kill()
        root.wait()


def _ms(seconds: float) -> str:
    return f"{1e3 * seconds:.3f} ms"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=6, help="instrumented/bare pairs of runs")
    parser.add_argument("--steps", type=int, default=40, help="training steps per run")
    parser.add_argument("--processes", type=int, default=1, help="training processes per run")
    parser.add_argument("--samples", type=int, default=2000, help="tree passes to time")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    with tempfile.TemporaryDirectory() as tmp:
        runs = ab_runs(Path(tmp), args.pairs, args.steps, args.processes)
    passes = tree_pass_cost(args.samples)

    on = [r["tps"] for r in runs["instrumented"]]
    off = [r["tps"] for r in runs["bare"]]
    ratio, line = ratio_line(on, off, "instrumented / bare")
    print(
        f"cell: {CELL}, {args.steps} steps, {args.processes} process(es), CPU, "
        f"{args.pairs} pairs (OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'default')})"
    )
    print(spread_line("instrumented", on))
    print(spread_line("bare", off))
    print(line)
    utils = [r["cpu_util"] for r in runs["instrumented"] if "cpu_util" in r]
    if utils:
        print(f"cpu_util_mean_pct of the instrumented runs: {[round(x, 1) for x in utils]}")
    for name, rs in runs.items():
        per = [r["sidecar_cpu_s"] / r["samples"] for r in rs if r.get("samples")]
        if per:
            print(f"sidecar CPU per sample, {name:<13}: median {_ms(statistics.median(per))}")
    print(
        f"one pass over a 3-process tree: RSS {_ms(passes['rss'])}, RSS + CPU time "
        f"{_ms(passes['rss+cpu'])} (utilisation adds {_ms(passes['rss+cpu'] - passes['rss'])}"
        " per sample; at the default 0.1 s interval that is "
        f"{100 * (passes['rss+cpu'] - passes['rss']) / 0.1:.3f}% of one core)"
    )
    good = ratio >= TARGET
    print(f"tokens/s instrumented / bare >= {TARGET}: {'met' if good else 'MISSED'}")
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main())
