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
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from orchestrator.config.scenarios import load_config  # noqa: E402
from orchestrator.matrix.expand import Selection, build_plan  # noqa: E402
from orchestrator.running.runner import RunOptions  # noqa: E402

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
#: the least tokens/s with eval over tokens/s without it (medians)
TARGET_RATIO = 0.98


def scenarios_text(arch: Path, steps: int, holdout: int) -> str:
    return f"""\
frameworks:
  ddp: {{accelerate_config: {REPO / "accelerate-ddp.yaml"}}}
matrix:
  effective_batch_size: [4]
  max_seq_len: [256]
  packing: [true]
scenarios:
  - name: bench
    device: cpu
    framework_config: [ddp]
    arguments:
      model_name_or_path: "config:{arch}"
      trainer: hf
      max_steps: {steps}
      logging_steps: 1
      holdout: {holdout}
    sweep:
      eval: [false, true]
"""


def interleaved(folder: Path, pairs: int) -> dict[bool, list[dict[str, float]]]:
    """Per eval setting, each run's tokens/s, job time and eval time, run A B B A ..."""
    from orchestrator.job.execute import run_experiment
    from orchestrator.running.resultsdir import open_results

    config = load_config(folder / "scenarios.yaml", defaults_file=None)
    plan = build_plan(config, Selection(device="cpu", num_gpus=(1,)), gpu_count=0)
    by_eval = {bool(e.arguments.get("eval")): e for e in plan.experiments}
    runs: dict[bool, list[dict[str, float]]] = {False: [], True: []}
    with open_results(folder / "runs", resume=False) as opened:
        for i in range(pairs):
            for setting in (False, True) if i % 2 == 0 else (True, False):
                run = opened.layout.run(f"ab-{i}-{int(setting)}")
                outcome = run_experiment(by_eval[setting], run, opened.layout, RunOptions())
                assert outcome.status == "ok", outcome
                metrics = json.loads(run.result.read_text())["metrics"]
                runs[setting].append(
                    {
                        "tps": metrics["tokens_per_second_global"],
                        "job_s": outcome.job_s or 0.0,
                        "eval_s": metrics.get("eval_runtime") or 0.0,
                        "tokens": metrics["tokens_measured"],
                    }
                )
    return runs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=4, help="eval off/on pairs of runs")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--holdout", type=int, default=64, help="held-out documents")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        arch = folder / "arch.json"
        arch.write_text(json.dumps(ARCH))
        (folder / "scenarios.yaml").write_text(scenarios_text(arch, args.steps, args.holdout))
        runs = interleaved(folder, args.pairs)

    off, on = runs[False], runs[True]
    tps_off, tps_on = [r["tps"] for r in off], [r["tps"] for r in on]
    ratio = statistics.median(tps_on) / statistics.median(tps_off)
    noise = statistics.pstdev(tps_off) / statistics.fmean(tps_off)
    eval_s = statistics.median(r["eval_s"] for r in on)
    job_on = statistics.median(r["job_s"] for r in on)
    job_off = statistics.median(r["job_s"] for r in off)
    print(
        f"one cell (llama 256×4, {args.steps} steps, packed rows of 256, CPU, 1 process), "
        f"eval on {args.holdout} held-out documents:"
    )
    print(f"eval off: tokens/s {[round(t) for t in tps_off]}  (run-to-run CV {100 * noise:.1f}%)")
    print(f"eval on : tokens/s {[round(t) for t in tps_on]}")
    print(
        "tokens measured, off / on: "
        f"{sorted({r['tokens'] for r in off})} / {sorted({r['tokens'] for r in on})}"
    )
    print(
        f"eval_runtime (median) {eval_s:.2f} s = {100 * eval_s / job_on:.1f}% of the job "
        f"({job_on:.1f} s); median job time on - off: {job_on - job_off:+.2f} s"
    )
    good = ratio >= TARGET_RATIO
    print(
        f"{'tokens/s with eval / without (medians)':<44} {ratio:8.4f}   "
        f"target >= {TARGET_RATIO}: {'met' if good else 'MISSED'}"
    )
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main())
