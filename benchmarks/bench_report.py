"""How fast are report, compare and history? Targets (issue: results at scale), on a
2-core machine:

- ``tunematrix report`` over 10,000 experiment folders, plots included: under 3 s,
  without importing torch (checked in the same process); and how its time grows
  from 2,500 folders to 10,000;
- ``tunematrix compare`` of two 10,000-row tables: under 0.5 s;
- ``tunematrix history`` of a results folder holding 100 recorded runs: under 1 s.

Usage: python benchmarks/bench_report.py [--experiments N] [--runs R]

The folders are synthetic but shaped like real ones (spec.json, outcome.json,
result.json with per-rank step times and a loss history; some failed and
out-of-memory cells; repeats). Times are wall clock of the CLI in a fresh
process, median of R runs. Exit code 1 if a target is missed. No check runs
this: run it before and after a change to report, compare or history.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
#: the targets, in seconds of wall clock for the CLI in a fresh process
REPORT_TARGET_S = 3.0
COMPARE_TARGET_S = 0.5
HISTORY_TARGET_S = 1.0
HISTORY_RUNS = 100

CHECK = """
import sys, time
start = time.perf_counter()
from orchestrator.cli.app import main
code = main(sys.argv[1:])
bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers', 'peft', 'accelerate', 'trl')]
assert not bad, bad
sys.exit(code if code in (0, 1) else code)
"""


def make_folder(root: Path, n: int, seed: int, scale: float = 1.0) -> None:
    rng = random.Random(seed)
    runs = root / "runs"
    runs.mkdir(parents=True)
    for i in range(n):
        cell, repeat = divmod(i, 2)
        eid = f"s{cell % 25}.model-{cell % 7}.fsdp.g{1 + cell % 4}.eb8-{cell:08x}" + (
            f".r{repeat}" if repeat else ""
        )
        run = runs / eid
        run.mkdir()
        gpus = 1 + cell % 4
        spec = {
            "experiment_id": eid,
            "cell_id": eid.split(".r")[0],
            "scenario": f"s{cell % 25}",
            "framework_config": "fsdp" if cell % 3 else "ddp",
            "model_name_or_path": f"org/model-{cell % 7}",
            "device": "gpu",
            "num_gpus": gpus,
            "effective_batch_size": 8,
            "per_device_train_batch_size": 8 // gpus if 8 % gpus == 0 else 1,
            "gradient_accumulation_steps": 1,
            "max_seq_len": 2048,
            "packing": True,
            "repeat": repeat,
            "arguments": {
                "learning_rate": 1e-4,
                "r": 8 + cell % 5,
                "target_modules": ["q_proj", "v_proj"],
            },
            "swept": {"r": 8 + cell % 5, "seed": cell},
        }
        status = "oom" if cell % 50 == 49 else "ok"
        tps = 1000.0 * gpus * scale * rng.uniform(0.97, 1.03)
        (run / "spec.json").write_text(json.dumps(spec))
        (run / "outcome.json").write_text(
            json.dumps(
                {
                    "status": status,
                    "error": None if status == "ok" else "CUDA out of memory",
                    "log": f"runs/{eid}/stderr.log",
                    "job_s": 120.0,
                    "wall_s": 121.0,
                    "memory": {"mem_nvidia_peak_bytes_max": 40e9},
                    # where its wall time went (orchestrator/job/phases.py)
                    "phases": {
                        "launch_s": 4.0,
                        "imports_s": 15.0,
                        "model_s": 4.0,
                        "data_s": 5.0,
                        "first_step_s": 3.0,
                        "training_s": 80.0 if status == "ok" else None,
                        "after_training_s": 10.0 if status == "ok" else None,
                    },
                }
            )
        )
        if status == "ok":
            steps = [rng.uniform(0.4, 0.5) for _ in range(20)]
            result = {
                "status": "ok",
                "metrics": {
                    "tokens_per_second_global": tps,
                    "tokens_per_second_per_device": tps / gpus,
                    "step_time_median_s": statistics.median(steps),
                    "train_tokens_per_second": tps / gpus,
                    "train_loss": 1.2,
                    "mfu": 0.4,
                },
                "ranks": [
                    {"rank": r, "step_times_s": steps, "step_tokens": [16384] * 20}
                    for r in range(gpus)
                ],
                "loss_history": [[s, 2.0 - 0.01 * s] for s in range(1, 21)],
                "data": {"tokens": 5_000_000},
                "gpu_device_name": "NVIDIA H100 80GB HBM3",
            }
            (run / "result.json").write_text(json.dumps(result))


def wall(argv: list[str], runs: int) -> list[float]:
    times = []
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for _ in range(runs):
        start = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-c", CHECK, *argv], env=env, capture_output=True, text=True
        )
        times.append(time.perf_counter() - start)
        if proc.returncode not in (0, 1):
            raise SystemExit(f"{argv[0]} failed: {proc.stderr[-2000:]}")
    return times


def make_history(root: Path, runs: int, table: Path) -> None:
    """A results folder whose history holds ``runs`` recorded runs of 100 experiments each
    (slices of ``table``), as ``tunematrix run`` records them."""
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from orchestrator.results import collect, history\n"
        "root, runs, table = Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])\n"
        "rows = collect.load(table)\n"
        "env = {'host': 'node1', 'tunematrix_git_sha': '0123456789abcdef',\n"
        "       'gpus': {'devices': [{'name': 'NVIDIA H100 80GB HBM3'}] * 4}}\n"
        "for i in range(runs):\n"
        "    part = rows.iloc[(i * 100) % len(rows):][:100]\n"
        "    env['started_at'] = f'2026-11-{1 + i % 28:02d}T{i % 24:02d}:00:00'\n"
        "    history.record(history.path_for(root), part, env, root)\n"
    )
    root.mkdir(parents=True)
    subprocess.run(
        [sys.executable, "-c", code, str(root), str(runs), str(table)],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        check=True,
    )


def _line(what: str, times: list[float], target: float | None = None) -> tuple[str, bool]:
    median = statistics.median(times)
    met = target is None or median < target
    text = f"{what}: median {median:.2f} s {[round(t, 2) for t in times]}"
    if target is not None:
        text += f"  target < {target:g} s: {'met' if met else 'MISSED'}"
    return text, met


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiments", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    ok = True
    n = args.experiments
    with tempfile.TemporaryDirectory() as tmp:
        a, b, quarter = Path(tmp) / "a", Path(tmp) / "b", Path(tmp) / "quarter"
        start = time.perf_counter()
        make_folder(a, n, seed=1)
        make_folder(b, n, seed=2, scale=0.97)
        make_folder(quarter, n // 4, seed=3)
        print(
            f"built 2 × {n:,} and {n // 4:,} experiment folders in "
            f"{time.perf_counter() - start:.1f} s"
        )

        report = wall(["report", str(a)], args.runs)
        text, met = _line(f"report of {n:,} folders (tables and plots)", report, REPORT_TARGET_S)
        ok &= met
        print(text + "; torch not imported")
        small = wall(["report", str(quarter)], args.runs)
        ratio = statistics.median(report) / statistics.median(small)
        print(
            f"  growth: {n // 4:,} folders {statistics.median(small):.2f} s, {n:,} folders "
            f"{statistics.median(report):.2f} s: × {ratio:.2f} for 4 × the folders "
            "(linear, start-up included: under 4)"
        )
        wall(["report", str(b), "--no-plots"], 1)

        tables = wall(
            [
                "compare",
                str(a / "raw_summary.csv"),
                str(b / "raw_summary.csv"),
                "--no-plots",
                "--output",
                tmp,
            ],
            args.runs,
        )
        text, met = _line(f"compare of two {n:,}-row tables", tables, COMPARE_TARGET_S)
        ok &= met
        print(text)
        with_plots = wall(
            ["compare", str(a / "raw_summary.csv"), str(b / "raw_summary.csv"), "--output", tmp],
            args.runs,
        )
        print(_line("  the same with its plots", with_plots)[0])

        recorded = Path(tmp) / "history"
        make_history(recorded, HISTORY_RUNS, a / "raw_summary.csv")
        listed = wall(["history", str(recorded)], args.runs)
        text, met = _line(f"history of {HISTORY_RUNS} recorded runs", listed, HISTORY_TARGET_S)
        ok &= met
        print(text)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
