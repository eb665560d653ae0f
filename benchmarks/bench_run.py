"""The runner's own cost. Targets (issue: run the matrix):

- orchestration overhead per experiment — the matrix's wall time minus the
  sum of the children's own lifetimes, divided by the number of experiments —
  under 0.5 s;
- the memory sidecar keeps at least 99% of the child's steady-state tokens/s
  (runs with the sidecar against runs without it, ``MEMORY_LOGGING`` all vs
  huggingface);
- the parent does not busy-wait: its own CPU time stays under 2% of the wall.

Usage: python benchmarks/bench_run.py [--pairs N] [--steps S] [--cells C]

Runs a real matrix in this process (``run_plan``) for the overhead and the
parent's CPU time; then runs one cell again and again with the sidecar on and
off, interleaved A B B A ... so that drift hits both alike; and measures the
sidecar's own CPU time, which bounds what it can take from training. Exit code
1 if a target is missed.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from abcell import ARCH  # noqa: E402

from orchestrator.config.scenarios import load_config  # noqa: E402
from orchestrator.executors.console import Progress  # noqa: E402
from orchestrator.matrix.expand import Selection, build_plan  # noqa: E402
from orchestrator.running.runner import RunOptions, run_plan  # noqa: E402


def scenarios_text(arch: Path, steps: int, cells: int) -> str:
    rates = ", ".join(f"{(i + 1) * 1e-4:.0e}" for i in range(cells))
    return f"""\
frameworks:
  ddp: {{accelerate_config: {REPO / "accelerate-ddp.yaml"}}}
matrix:
  effective_batch_size: [4]
scenarios:
  - name: bench
    device: cpu
    framework_config: [ddp]
    arguments:
      model_name_or_path: "config:{arch}"
      max_seq_len: 256
      max_steps: {steps}
      logging_steps: 1
    sweep:
      learning_rate: [{rates}]
"""


def run_matrix(folder: Path, results: str, memory_logging: str) -> dict[str, float | list[float]]:
    config = load_config(folder / "scenarios.yaml", defaults_file=None)
    plan = build_plan(config, Selection(device="cpu", num_gpus=(1,)), gpu_count=0)
    before = resource.getrusage(resource.RUSAGE_SELF)
    start = time.monotonic()
    report = run_plan(
        plan,
        folder / results,
        RunOptions(memory_logging=memory_logging),
        argv=["bench_run"],
        progress=Progress(len(plan.experiments), io.StringIO()),
    )
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    assert all(o.status == "ok" for o in report.outcomes.values()), report.counts()
    job = sum(o.job_s or 0.0 for o in report.outcomes.values())
    tps = []
    for e in plan.experiments:
        result = json.loads((report.layout.run(e.experiment_id).result).read_text())
        tps.append(result["metrics"]["tokens_per_second_global"])
    n = len(plan.experiments)
    return {"wall": wall, "cpu": cpu, "job": job, "n": n, "overhead": (wall - job) / n, "tps": tps}


def sidecar_cpu_share(seconds: float = 20.0) -> float:
    """CPU time of a sidecar watching a process tree, as a share of one core."""
    import subprocess

    import psutil

    job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    with tempfile.TemporaryDirectory() as tmp:
        side = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "orchestrator.job.sidecar",
                "--out",
                f"{tmp}/m.csv",
                "--interval",
                "0.1",
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        assert side.stdout is not None and side.stdin is not None
        side.stdout.readline()
        side.stdin.write(f"{job.pid}\n")
        side.stdin.flush()
        proc = psutil.Process(side.pid)
        before = sum(proc.cpu_times()[:2])
        time.sleep(seconds)
        used = sum(proc.cpu_times()[:2]) - before
        side.stdin.close()
        side.wait()
    job.kill()
    job.wait()
    return used / seconds


def ab_throughput(folder: Path, pairs: int) -> tuple[list[float], list[float]]:
    """Steady-state tokens/s of the same cell with and without the sidecar, interleaved A B B A ..."""
    from orchestrator.job.execute import run_experiment
    from orchestrator.running.resultsdir import open_results

    config = load_config(folder / "scenarios.yaml", defaults_file=None)
    (experiment, *_) = build_plan(
        config, Selection(device="cpu", num_gpus=(1,)), gpu_count=0
    ).experiments
    on, off = RunOptions(memory_logging="all"), RunOptions(memory_logging="huggingface")
    with_sidecar: list[float] = []
    without: list[float] = []
    with open_results(folder / "ab", resume=False) as opened:
        for i in range(pairs):
            order = (on, off) if i % 2 == 0 else (off, on)
            for options in order:
                run = opened.layout.run(f"ab-{len(with_sidecar) + len(without)}")
                outcome = run_experiment(experiment, run, opened.layout, options)
                assert outcome.status == "ok", outcome
                tps = json.loads(run.result.read_text())["metrics"]["tokens_per_second_global"]
                (with_sidecar if options is on else without).append(tps)
    return with_sidecar, without


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=4, help="sidecar on/off pairs of runs")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--cells", type=int, default=4, help="experiments in the overhead matrix")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        arch = folder / "arch.json"
        arch.write_text(json.dumps(ARCH))
        (folder / "scenarios.yaml").write_text(scenarios_text(arch, args.steps, args.cells))
        matrix = run_matrix(folder, "matrix", "all")
        on, off = ab_throughput(folder, args.pairs)
    share = sidecar_cpu_share()

    cores = os.cpu_count() or 1
    cpu_share = float(matrix["cpu"]) / float(matrix["wall"])
    ratio = statistics.median(on) / statistics.median(off)
    noise = statistics.pstdev(off) / statistics.fmean(off)
    print(
        f"matrix of {matrix['n']} experiments (llama 256×4, {args.steps} steps, CPU, sidecar on):"
    )
    print(
        f"  wall {float(matrix['wall']):.1f} s, children {float(matrix['job']):.1f} s, "
        f"parent CPU {float(matrix['cpu']):.2f} s"
    )
    print(f"sidecar on : tokens/s {[round(t) for t in on]}")
    print(f"sidecar off: tokens/s {[round(t) for t in off]}  (run-to-run CV {100 * noise:.1f}%)")
    print(
        f"sidecar's own CPU: {100 * share:.2f}% of one core, at most {100 * share / cores:.2f}% "
        f"of this machine's {cores} cores"
    )
    ok = True
    for name, value, target, good in (
        (
            "overhead per experiment (s)",
            float(matrix["overhead"]),
            "< 0.5",
            float(matrix["overhead"]) < 0.5,
        ),
        ("parent CPU / wall", cpu_share, "< 0.02", cpu_share < 0.02),
        ("tokens/s with sidecar / without (medians)", ratio, ">= 0.99", ratio >= 0.99),
    ):
        ok &= good
        print(f"{name:<44} {value:8.4f}   target {target}: {'met' if good else 'MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
