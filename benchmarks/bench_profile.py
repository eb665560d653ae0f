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
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from orchestrator.config.scenarios import load_config  # noqa: E402
from orchestrator.matrix.expand import Selection, build_plan  # noqa: E402
from orchestrator.running.runner import RunOptions  # noqa: E402

TARGET = 0.99
ARCH = {
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 688,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "vocab_size": 1024,
    "max_position_embeddings": 1024,
}


def scenarios_text(arch: Path, steps: int, processes: int) -> str:
    return f"""\
frameworks:
  ddp: {{accelerate_config: {REPO / "accelerate-ddp.yaml"}}}
matrix:
  effective_batch_size: [{4 * processes}]
  num_gpus: [{processes}]
scenarios:
  - name: bench
    device: cpu
    framework_config: [ddp]
    arguments:
      model_name_or_path: "config:{arch}"
      max_seq_len: 256
      max_steps: {steps}
      logging_steps: 1
"""


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
    folder: Path, pairs: int, processes: int, profile_steps: int, warmup: int
) -> dict[str, list[dict[str, Any]]]:
    """Each variant's runs: tokens/s, median step time, job time, the profile's cost."""
    from orchestrator.job.execute import run_experiment
    from orchestrator.running.resultsdir import open_results

    config = load_config(folder / "scenarios.yaml", defaults_file=None)
    (experiment, *_) = build_plan(
        config, Selection(device="cpu", num_gpus=(processes,)), gpu_count=0
    ).experiments
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
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in variants}
    with open_results(folder / "ab", resume=False) as opened:
        for i in range(pairs):
            for name in ("profiled", "plain") if i % 2 == 0 else ("plain", "profiled"):
                run = opened.layout.run(f"ab-{i}-{name}")
                outcome = run_experiment(variants[name], run, opened.layout, RunOptions())
                assert outcome.status == "ok", outcome
                result = json.loads(run.result.read_text())
                runs[name].append(_figures(result, outcome.job_s, name == "profiled"))
                steps = " ".join(f"{1000 * t:.0f}" for t in runs[name][-1]["paced"])
                print(f"  {name:<9} step times (ms, slowest rank): {steps}", flush=True)
                if name == "profiled":
                    assert run.profile_trace(0).is_file(), "the profiled run left no trace"
    return runs


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
        folder = Path(tmp)
        arch = folder / "arch.json"
        arch.write_text(json.dumps(ARCH))
        (folder / "scenarios.yaml").write_text(scenarios_text(arch, args.steps, args.processes))
        runs = ab_runs(folder, args.pairs, args.processes, args.profile_steps, args.warmup)

    on = [r["tps"] for r in runs["profiled"]]
    off = [r["tps"] for r in runs["plain"]]
    ratios = [a / b for a, b in zip(on, off, strict=True)]
    ratio = statistics.median(on) / statistics.median(off)
    measured = args.steps - args.warmup - args.profile_steps
    print(
        f"cell: llama 256×4, {args.steps} steps, {args.processes} process(es), CPU gloo DDP, "
        f"{args.pairs} pairs; both measure steps {args.warmup + args.profile_steps}.."
        f"{args.steps - 1} ({measured}); the profiled runs record {args.profile_steps} steps "
        f"after {args.warmup} (OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'default')})"
    )
    for name, rs in runs.items():
        values = [r["tps"] for r in rs]
        cv = statistics.pstdev(values) / statistics.fmean(values)
        print(
            f"{name:<9} tokens/s {[round(t) for t in values]}  median "
            f"{statistics.median(values):,.0f}  (CV {100 * cv:.1f}%); step time median "
            f"{_ms(statistics.median(r['step_median_s'] for r in rs))}; job "
            f"{statistics.median(r['job_s'] for r in rs):.1f} s"
        )
    print(
        f"profiled / plain tokens/s (medians): {ratio:.4f}; per pair: median "
        f"{statistics.median(ratios):.4f}, min {min(ratios):.4f}, max {max(ratios):.4f}"
    )
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
