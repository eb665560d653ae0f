"""The training child's own cost. Targets (issue: the trainer entry):

- with all measurement on, the child keeps at least 99% of the throughput of
  the same training loop with measurement off (``instrumentation: false``:
  no step clock, no token counting, no memory metrics); "on" includes the
  memory stages of the default ``MEMORY_LOGGING=all`` (torch.cuda counters read
  at stage boundaries, no thread; HF's polling tracker only with ``hf-tracker``);
- the time from process start to the first training step, broken down.

Usage: python benchmarks/bench_child.py [--runs N] [--steps S]

Both variants train the same small Llama architecture (random weights, built
here) on packed blocks, so each run's token count is exactly steps × batch ×
length, and each is timed by the trainer's own ``train_runtime``, the one
clock both have. Runs alternate (A B A B ...) so drift hits both alike; the
median of each is compared, and the spread is reported as the ratio of each
adjacent pair (instrumented run over the bare run right after it): on a
machine whose run-to-run noise is larger than the effect, the pair ratios
straddle 1 and more runs are needed. Exit code 1 if the target is missed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from orchestrator.values import MEMORY_LOGGING

REPO = Path(__file__).resolve().parent.parent
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


def run_once(folder: Path, arch: Path, steps: int, instrumented: bool) -> dict:
    spec = {
        "device": "cpu",
        # what the default MEMORY_LOGGING=all writes into every spec
        "memory_stages": MEMORY_LOGGING["all"][1],
        "arguments": {
            "model_name_or_path": f"config:{arch}",
            "max_seq_len": 256,
            "packing": True,
            "per_device_train_batch_size": 4,
            "max_steps": steps,
            "logging_steps": 1,
            "instrumentation": instrumented,
        },
    }
    (folder / "spec.json").write_text(json.dumps(spec))
    (folder / "result.json").unlink(missing_ok=True)
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "2"}
    subprocess.run(
        [sys.executable, "-m", "trainer_entry", "--spec", str(folder / "spec.json")],
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return json.loads((folder / "result.json").read_text())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=8, help="runs of each variant")
    parser.add_argument("--steps", type=int, default=80)
    args = parser.parse_args()
    tokens = args.steps * 4 * 256

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        arch = folder / "arch.json"
        arch.write_text(json.dumps(ARCH))
        run_once(folder, arch, 2, True)  # build the tiny tokenizer and the data cache
        bare: list[float] = []
        instrumented: list[float] = []
        results: list[dict] = []
        for _ in range(args.runs):
            for flag, sink in ((True, instrumented), (False, bare)):
                result = run_once(folder, arch, args.steps, flag)
                sink.append(tokens / result["metrics"]["train_runtime"])
                if flag:
                    results.append(result)

    ratio = statistics.median(instrumented) / statistics.median(bare)
    print(
        f"model: llama, hidden {ARCH['hidden_size']}, {ARCH['num_hidden_layers']} layers; "
        f"{args.steps} steps × 4 × 256 tokens, {args.runs} runs each, CPU"
    )
    print(
        f"  bare          tokens/s (tokens / train_runtime): median {statistics.median(bare):9.0f}  "
        f"runs {[round(x) for x in bare]}"
    )
    print(
        f"  instrumented  tokens/s (tokens / train_runtime): median {statistics.median(instrumented):9.0f}  "
        f"runs {[round(x) for x in instrumented]}"
    )
    steady = [r["metrics"]["tokens_per_second_global"] for r in results]
    print(
        f"  instrumented  steady-state tokens/s (warm-up excluded): median {statistics.median(steady):9.0f}"
    )
    pairs = sorted(i / b for i, b in zip(instrumented, bare, strict=True))
    quartiles = statistics.quantiles(pairs, n=4) if len(pairs) > 1 else [pairs[0]] * 3
    print(
        f"  instrumented / bare = {ratio:.4f}  (target ≥ {TARGET}: "
        f"{'met' if ratio >= TARGET else 'MISSED'})"
    )
    print(
        f"  spread: pair ratios min {pairs[0]:.3f}, quartiles {quartiles[0]:.3f} / "
        f"{quartiles[1]:.3f} / {quartiles[2]:.3f}, max {pairs[-1]:.3f}; run-to-run CV "
        f"bare {statistics.stdev(bare) / statistics.fmean(bare):.1%}, instrumented "
        f"{statistics.stdev(instrumented) / statistics.fmean(instrumented):.1%}"
    )

    print("time to first step (median of the instrumented runs, seconds):")
    keys = (
        "interpreter_start_s",
        "import_s",
        "model_load_s",
        "data_prep_s",
        "trainer_init_s",
        "first_step_s",
    )
    for key in keys:
        print(f"  {key:<22} {statistics.median(r['timings'][key] for r in results):7.3f}")
    total = statistics.median(r["timings"]["time_to_first_step_s"] for r in results)
    print(f"  {'time_to_first_step_s':<22} {total:7.3f}  (process start to the end of step 1)")
    return 0 if ratio >= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
