"""``tunematrix fit`` against a linear scan, on a CPU job under a cgroup memory limit.

Usage: sudo python benchmarks/bench_fit.py [--quick] [--max-seq-len L] [--limit-mib M]
                                           [--probe-steps S] [--margin F] [--linear full|none]

Both searches look for the largest per-device batch of the tiny Llama (one CPU
process, packed rows of ``--max-seq-len`` tokens) that fits in a cgroup v1
memory cgroup of ``--limit-mib`` MiB, which this script creates (it needs root
and /sys/fs/cgroup/memory) and removes afterwards, with anything left in it.

- bisection: one ``tunematrix fit`` run inside the cgroup (the lower bound 1,
  doubling to the first out-of-memory, then bisection);
- linear scan: batch 1, 2, 3, ... each a real probe (``tunematrix fit --resume
  --min B --limit B`` into one folder: the same probe of the same number of
  steps, and one prepared-data cache, as the bisection's) until the first that
  does not fit. Each of its probes pays one more start of the orchestrator
  (about a second) than a bisection probe does.

A warm-up probe first (not counted) builds the tiny model and warms the caches,
so neither search pays for that alone.

Each OOM is the kernel's: the probe that does not fit is killed by the OOM killer
(with ``--margin F``, a probe above ``1 - F`` of the limit does not fit either).
A batch at the very edge of the limit may fit in one run and not in the next, so
the two answers can differ by one there; the script says so when they do. It prints both
answers, which must agree, the number of probes and the wall time of each, and
the ratios. ``--quick`` is a smoke test of the script (a limit where the answer is
1, two probes each): its ratios mean nothing. Exit code 1 if the answers differ.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
CGROUP_V1 = Path("/sys/fs/cgroup/memory")

DEFAULTS = "max_steps: 20\nlogging_steps: 1\nreport_to: none\nsave_strategy: 'no'\n"


def scenarios(max_seq_len: int) -> str:
    return (
        "frameworks:\n"
        f"  ddp: {{accelerate_config: {REPO / 'accelerate-ddp.yaml'}}}\n"
        "matrix:\n  effective_batch_size: [1]\n"
        "scenarios:\n"
        "  - name: bench-fit\n"
        "    device: cpu\n"
        "    framework_config: [ddp]\n"
        "    num_gpus: [1]\n"
        "    search: {max: per_device_train_batch_size}\n"
        "    arguments:\n"
        "      model_name_or_path: tiny-llama\n"
        "      torch_dtype: float32\n"
        f"      max_seq_len: {max_seq_len}\n"
    )


class Cgroup:
    """A cgroup v1 memory cgroup of ``limit`` bytes; removed on exit with what ran in it."""

    def __init__(self, limit: int) -> None:
        if os.geteuid() != 0 or not (CGROUP_V1 / "cgroup.procs").exists():
            sys.exit(f"bench_fit.py needs root and the cgroup v1 memory controller at {CGROUP_V1}")
        self.folder = CGROUP_V1 / f"tunematrix-bench-fit-{os.getpid()}"
        self.folder.mkdir()
        (self.folder / "memory.limit_in_bytes").write_text(str(limit))

    def __enter__(self) -> Cgroup:
        return self

    def __exit__(self, *exc: object) -> None:
        for line in (self.folder / "cgroup.procs").read_text().split():
            try:
                os.kill(int(line), signal.SIGKILL)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 10
        while (self.folder / "cgroup.procs").read_text().strip() and time.monotonic() < deadline:
            time.sleep(0.1)
        self.folder.rmdir()

    def fit(self, folder: Path, results: str, *args: str) -> tuple[dict[str, Any], float]:
        """``tunematrix fit`` inside the cgroup; its one family from fit.json, and its wall time."""

        def enter() -> None:
            (self.folder / "cgroup.procs").write_text(str(os.getpid()))

        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "orchestrator", "fit", "--results", results, *args],
            cwd=folder,
            env={
                **os.environ,
                "PYTHONPATH": str(REPO),
                "HF_HUB_OFFLINE": "1",
                "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
            },
            capture_output=True,
            text=True,
            preexec_fn=enter,
        )
        wall = time.monotonic() - started
        if done.returncode not in (0, 1):
            sys.exit(f"tunematrix fit failed ({done.returncode}):\n{done.stderr[-3000:]}")
        (family,) = json.loads((folder / results / "fit.json").read_text())["families"]
        return family, wall


def linear(cgroup: Cgroup, folder: Path, common: list[str]) -> tuple[int | None, int, float, str]:
    """Batch 1, 2, ... until one does not fit: the answer, the probes, the wall time, why it ended."""
    answer: int | None = None
    probes, wall, batch = 0, 0.0, 1
    while True:
        # one folder for the scan, resumed, so its probes share one prepared-data cache
        family, seconds = cgroup.fit(
            folder, "linear", *common, "--resume", "--min", str(batch), "--limit", str(batch)
        )
        probes += 1
        wall += seconds
        if family["ending"] == "stopped":
            return answer, probes, wall, f"stopped at {batch}: {family['stopped_by']}"
        if family["largest_fit"] != batch:
            return answer, probes, wall, f"{batch} did not fit: {family['why_too_big']}"
        answer, batch = batch, batch + 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="a smoke test: answer 1, 2 probes each"
    )
    parser.add_argument(
        "--max-seq-len", type=int, default=512, help="tokens per sample (default 512)"
    )
    parser.add_argument(
        "--limit-mib", type=int, default=1536, help="the cgroup's limit (default 1536)"
    )
    parser.add_argument(
        "--probe-steps", type=int, default=2, help="steps of each probe (default 2)"
    )
    parser.add_argument(
        "--margin",
        type=float,
        default=0.0,
        help="fit's --margin (default 0: only the kernel's OOM kills decide, for both searches)",
    )
    parser.add_argument(
        "--linear",
        choices=("full", "none"),
        default="full",
        help="run the linear scan for real up to its first miss, or not at all",
    )
    args = parser.parse_args()
    if args.quick:
        args.max_seq_len, args.limit_mib = 4096, 1190
    common = [
        "--scenarios",
        "scenarios.yaml",
        "--probe-steps",
        str(args.probe_steps),
        "--margin",
        str(args.margin),
    ]
    with tempfile.TemporaryDirectory() as tmp, Cgroup(args.limit_mib * 2**20) as cgroup:
        folder = Path(tmp)
        (folder / "defaults.yaml").write_text(DEFAULTS)
        (folder / "scenarios.yaml").write_text(scenarios(args.max_seq_len))
        # not counted: builds the tiny model and warms the page cache for both searches
        _, warm_s = cgroup.fit(folder, "warm-up", *common, "--min", "1", "--limit", "1")
        print(f"warm-up probe (not counted): {warm_s:.1f} s")
        family, bisect_s = cgroup.fit(folder, "bisection", *common)
        values = [f"{p['value']}:{p['status']}" for p in family["probes"]]
        print(
            f"tiny-llama, 1 CPU process, max_seq_len {args.max_seq_len}, {args.probe_steps} steps "
            f"a probe, cgroup limit {args.limit_mib} MiB, margin {args.margin:g}"
        )
        print(
            f"bisection: largest batch that fits {family['largest_fit']}, first miss "
            f"{family['first_too_big']} ({family['why_too_big']}); {len(values)} probes "
            f"({', '.join(values)}) in {bisect_s:.1f} s"
        )
        if args.linear == "none":
            print("linear scan: not run (--linear none)")
            return 0
        answer, probes, linear_s, why = linear(cgroup, folder, common)
        print(
            f"linear scan (run for real): largest {answer}, {probes} probes in {linear_s:.1f} s; {why}"
        )
        print(
            f"ratios, bisection / linear: probes {len(values) / probes:.2f}, "
            f"wall time {bisect_s / linear_s:.2f}"
        )
        if answer != family["largest_fit"]:
            print(f"the answers differ: bisection {family['largest_fit']}, linear {answer}")
            return 1
        print("same answer")
    return 0


if __name__ == "__main__":
    sys.exit(main())
