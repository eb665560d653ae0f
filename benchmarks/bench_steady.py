"""What steady-state stopping saves. Measured (issue: fewer GPU-hours per answer):

- the CPU-seconds the shipped tiny CPU matrix (``scenarios.yaml``, the cells
  ``tox -e run-benches`` runs without a GPU) takes run twice: every cell for a
  fixed 100 steps, and every cell until its mean step time is known to ±2%
  (``--until steady --precision 0.02``, at most 200 steps);
- per cell and in total: the CPU-seconds of both modes, their ratio
  steady / fixed, the steps each ran and the precision each reached (the
  half-width of the batch-means 95% interval of the mean step time, in % of it:
  ``step_time_ci_pct``), and whether the fixed 100 steps themselves reached ±2%;
- per cell, steady's tokens/s over fixed's: the interval is of one run's mean
  step time under the assumption that the step time is stationary after the
  warm-up; where the machine's speed shifts within or between runs, another run
  differs by more, and this column shows by how much.

Usage: python benchmarks/bench_steady.py [--fixed-steps 100] [--precision 0.02]
       [--max-steps 200] [--min-steps 10] [--keep DIR]
       python benchmarks/bench_steady.py --quick      (two small cells: does it work)

Each mode is one ``tunematrix run`` of the whole matrix (fixed first, then
steady), each cell a real ``accelerate launch`` with the sidecar on. A cell's
CPU-seconds are the job's wall time × its processes (what GPU-hours are on a
GPU); where the sidecar sampled the job tree's CPU time over the whole job
(util_window ``job``: ``cpu_util_mean_pct`` × ``cpu_allowed`` × ``job_s``) that
total is printed too.
Model loading and start-up are in both modes alike, so the ratio of training
time alone (``train_runtime`` × processes) is printed too. Exit code 1 if a
run failed.
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent

#: the quick mode: two cells of one scenario, few steps, a loose precision
QUICK = {
    "filter": "tiny-lora",
    "effective_batch_size": "4 8",
    "fixed_steps": 15,
    "precision": 0.2,
    "min_steps": 9,
    "max_steps": 30,
}

#: what tells two cells of a mode apart (ids differ between modes: steady hashes its settings)
KEYS = ("scenario", "framework_config", "model_name_or_path", "num_gpus", "effective_batch_size")
EXTRA_KEYS = ("trainer", "peft_method", "max_seq_len", "packing")


def _float(value: Any) -> float | None:
    try:
        return float(value) if value not in (None, "") else None
    except ValueError:
        return None


def cpu_seconds(row: dict[str, str]) -> float | None:
    """Process-seconds of the job: its wall time × its processes (GPU-hours' analogue)."""
    processes = _float(row.get("processes")) or _float(row.get("num_gpus")) or 1.0
    wall = _float(row.get("job_s"))
    wall = wall if wall is not None else _float(row.get("wall_s"))
    return wall * processes if wall is not None else None


def tree_cpu_seconds(row: dict[str, str]) -> float | None:
    """The job tree's CPU time, where the sidecar sampled it over the whole job."""
    util, allowed, job = (_float(row.get(k)) for k in ("cpu_util_mean_pct", "cpu_allowed", "job_s"))
    if row.get("util_window") != "job" or util is None or allowed is None or job is None:
        return None
    return util / 100 * allowed * job


def run_mode(
    folder: Path, scenarios: Path, defaults: Path, selection: list[str], mode: list[str]
) -> dict[tuple[str, ...], dict[str, str]]:
    """One ``tunematrix run`` of the matrix; its rows by cell."""
    results = folder / "results"
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    command = [
        *(sys.executable, "-m", "orchestrator", "run", "--scenarios", str(scenarios)),
        *("--defaults", str(defaults), "--device", "cpu", "--results", str(results)),
        *selection,
        *mode,
    ]
    print("$ " + " ".join(command[2:]), flush=True)
    done = subprocess.run(command, cwd=folder, env=env, text=True, capture_output=True)
    if done.returncode != 0:
        print(done.stdout[-3000:] + done.stderr[-3000:], file=sys.stderr)
        raise SystemExit(f"bench_steady: the run failed (exit {done.returncode})")
    with (results / "raw_summary.csv").open() as f:
        rows = list(csv.DictReader(f))
    return {tuple(row.get(k, "") for k in (*KEYS, *EXTRA_KEYS)): row for row in rows}


def _label(key: tuple[str, ...]) -> str:
    scenario, framework, _model, gpus, eb, trainer, *_ = key
    return f"{scenario} {framework} g{gpus} eb{eb} {trainer}"


def _fmt(value: float | None, spec: str) -> str:
    return format(value, spec) if value is not None else "—"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fixed-steps", type=int, default=100)
    parser.add_argument("--precision", type=float, default=0.02)
    parser.add_argument("--min-steps", type=int, default=10)
    parser.add_argument("--max-steps", type=int, default=200)
    parser.add_argument("--scenarios", type=Path, default=REPO / "scenarios.yaml")
    parser.add_argument(
        "--quick", action="store_true", help="two small cells with few steps: a check it works"
    )
    parser.add_argument("--keep", type=Path, help="leave both results folders here")
    args = parser.parse_args()
    selection: list[str] = []
    if args.quick:
        selection = [
            "--filter",
            QUICK["filter"],
            "--effective-batch-size",
            QUICK["effective_batch_size"],
        ]
        args.fixed_steps, args.precision = QUICK["fixed_steps"], QUICK["precision"]
        args.min_steps, args.max_steps = QUICK["min_steps"], QUICK["max_steps"]

    with tempfile.TemporaryDirectory() as tmp:
        base = args.keep or Path(tmp)
        base.mkdir(parents=True, exist_ok=True)
        # the shipped defaults with the fixed step count asked for
        defaults = yaml.safe_load((args.scenarios.parent / "defaults.yaml").read_text())
        defaults["max_steps"] = args.fixed_steps
        (base / "defaults.yaml").write_text(yaml.safe_dump(defaults, sort_keys=False))
        fixed_dir, steady_dir = base / "fixed", base / "steady"
        fixed_dir.mkdir(exist_ok=True)
        steady_dir.mkdir(exist_ok=True)
        fixed = run_mode(
            fixed_dir, args.scenarios, base / "defaults.yaml", selection, ["--until", "steps"]
        )
        steady = run_mode(
            steady_dir,
            args.scenarios,
            base / "defaults.yaml",
            selection,
            [
                *("--until", "steady", "--precision", str(args.precision)),
                *("--min-steps", str(args.min_steps), "--max-steps", str(args.max_steps)),
            ],
        )

    target = 100 * args.precision
    print(
        f"\nthe {'quick' if args.quick else 'shipped'} CPU matrix ({args.scenarios.name}), "
        f"{len(fixed)} cells: fixed {args.fixed_steps} steps vs steady state at "
        f"±{target:g}% (min {args.min_steps} measured steps, max {args.max_steps} steps)"
    )
    header = (
        f"{'cell':44} {'fixed steps':>11} {'CPU-s':>7} {'±%':>6}   "
        f"{'steady steps':>12} {'stopped':>9} {'CPU-s':>7} {'±%':>6} {'ratio':>6} "
        f"{'tok/s s/f':>9}"
    )
    print(header)
    print("-" * len(header))
    totals = dict.fromkeys(
        ("fixed", "steady", "fixed_train", "steady_train", "fixed_tree", "steady_tree"), 0.0
    )
    tree_missing = False
    reached = settled = 0
    failed = False
    #: per cell: how far steady's tokens/s is from fixed's, in %
    differences: list[float] = []
    for key in sorted(set(fixed) | set(steady)):
        a, b = fixed.get(key), steady.get(key)
        if a is None or b is None or a.get("status") != "ok" or b.get("status") != "ok":
            failed = True
            print(
                f"{_label(key):44} not ok in both modes: {a and a.get('status')} / {b and b.get('status')}"
            )
            continue
        cpu_a, cpu_b = cpu_seconds(a), cpu_seconds(b)
        tree_a, tree_b = tree_cpu_seconds(a), tree_cpu_seconds(b)
        if tree_a is None or tree_b is None:
            tree_missing = True
        else:
            totals["fixed_tree"] += tree_a
            totals["steady_tree"] += tree_b
        ci_a, ci_b = _float(a.get("step_time_ci_pct")), _float(b.get("step_time_ci_pct"))
        reached += ci_a is not None and ci_a <= target
        settled += b.get("measure_stopped") == "steady"
        if cpu_a is not None and cpu_b is not None:
            totals["fixed"] += cpu_a
            totals["steady"] += cpu_b
        for mode, row in (("fixed_train", a), ("steady_train", b)):
            runtime = _float(row.get("train_runtime"))
            totals[mode] += (runtime or 0.0) * (_float(row.get("processes")) or 1.0)
        ratio = cpu_b / cpu_a if cpu_a and cpu_b is not None else None
        tps_a = _float(a.get("tokens_per_second_global"))
        tps_b = _float(b.get("tokens_per_second_global"))
        speed = tps_b / tps_a if tps_a and tps_b is not None else None
        if speed is not None:
            differences.append(100 * abs(speed - 1))
        print(
            f"{_label(key):44} {a.get('steps', ''):>11} {_fmt(cpu_a, '7.1f')} {_fmt(ci_a, '6.2f')}   "
            f"{b.get('steps', ''):>12} {b.get('measure_stopped', ''):>9} {_fmt(cpu_b, '7.1f')} "
            f"{_fmt(ci_b, '6.2f')} {_fmt(ratio, '6.2f')} {_fmt(speed, '9.3f')}"
        )
    print("-" * len(header))
    n = len(fixed)
    if totals["fixed"]:
        print(
            f"total CPU-seconds (job wall × processes): fixed {totals['fixed']:.1f}, "
            f"steady {totals['steady']:.1f}; steady / fixed = "
            f"{totals['steady'] / totals['fixed']:.2f}"
        )
    if not tree_missing and totals["fixed_tree"]:
        print(
            f"the job trees' CPU time (sidecar): fixed {totals['fixed_tree']:.1f} s, steady "
            f"{totals['steady_tree']:.1f} s; steady / fixed = "
            f"{totals['steady_tree'] / totals['fixed_tree']:.2f}"
        )
    if totals["fixed_train"]:
        print(
            f"training alone (train_runtime × processes): fixed {totals['fixed_train']:.1f} s, "
            f"steady {totals['steady_train']:.1f} s; steady / fixed = "
            f"{totals['steady_train'] / totals['fixed_train']:.2f}"
        )
    print(f"fixed {args.fixed_steps} steps reached ±{target:g}% in {reached} of {n} cells")
    print(f"steady state settled within ±{target:g}% in {settled} of {n} cells")
    if differences:
        # the interval is of one run's mean step time; another run (the fixed one) may
        # differ by more when the machine's speed changes between or within runs
        within = sum(d <= target for d in differences)
        print(
            f"steady's tokens/s against fixed's: within ±{target:g}% in {within} of "
            f"{len(differences)} cells; |difference| median {statistics.median(differences):.1f}%, "
            f"largest {max(differences):.1f}%"
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
