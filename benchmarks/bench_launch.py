"""A launch per cell against one launch per family (``--launch family``), the same matrix.

Usage: python benchmarks/bench_launch.py [--pairs N] [--scenarios FILE] [--out FILE]
       [-- more `tunematrix run` arguments, e.g. --filter tiny-lora --device cpu]

Runs the whole matrix (default: the shipped scenarios file, this machine's scenarios)
with ``--launch cell`` and with ``--launch family``, alternating which goes first in
each pair (A B, B A, ...), each into a fresh results folder, each timed as a whole
command. Then reports:

- the matrix's wall time, family over cell: the median of the pairs' ratios, for the
  whole command (planning and the check against the installed libraries included, the
  same in both modes) and for running its cells (from the first experiment's start to
  the last one's end, as their outcomes record them; target: at most 0.5 on the
  shipped CPU matrix);
- per experiment: the median tokens/s of its family runs over the median of its cell
  runs, and the same for its training peak memory (torch's reserved peak where there
  is a GPU, else the training process's peak RSS), with their ranges over the pairs;
- whether every run's loss curve is equal (the same seed: they must be) and every
  status the same;
- where the experiments' wall time went in each mode (their phases, summed), and their
  wall over their training: the CPU counterpart of the GPU targets (a fresh cell at most
  2x its training, a family matrix at most 1.3x).

Until the tokens/s and peaks are within 2% the default stays ``cell``. Exit code 1 when
the statuses or losses differ, or the wall ratio is above the target.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
WALL_TARGET = 0.5
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
from orchestrator.contract.columns import PHASE_COLUMNS  # noqa: E402

#: where a run's wall time goes (orchestrator/job/phases.py), in order
PHASES = tuple(PHASE_COLUMNS)
#: within this the shared launch measures what a launch of its own does
SAME_WITHIN = 0.02


def run_matrix(mode: str, results: Path, scenarios: Path, extra: list[str]) -> float:
    """The whole command's wall time, in seconds."""
    argv = [
        sys.executable,
        *("-m", "orchestrator", "run", "--launch", mode, "--no-report"),
        *("--scenarios", str(scenarios), "--results", str(results), *extra),
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    start = time.monotonic()
    proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True)
    wall = time.monotonic() - start
    if proc.returncode not in (0, 1):  # 1: some cell did not finish, which is reported
        sys.exit(f"bench_launch: {mode} run failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    return wall


def cells_wall(results: Path) -> float:
    """From the first experiment's start to the last one's end (their outcomes)."""
    starts, ends = [], []
    for outcome_path in (results / "runs").glob("*/outcome.json"):
        outcome = json.loads(outcome_path.read_text())
        if outcome.get("started_at") and outcome.get("finished_at"):
            starts.append(datetime.fromisoformat(outcome["started_at"]))
            ends.append(datetime.fromisoformat(outcome["finished_at"]))
    return (max(ends) - min(starts)).total_seconds()


def read_runs(results: Path) -> dict[str, dict[str, Any]]:
    """Per experiment: its status, tokens/s, training peak and loss curve."""
    with (results / "raw_summary.csv").open() as f:
        rows = list(csv.DictReader(f))
    out: dict[str, dict[str, Any]] = {}
    for row in rows:
        eid = row["experiment_id"]
        result_path = results / "runs" / eid / "result.json"
        result = json.loads(result_path.read_text()) if result_path.exists() else {}
        peak_name = (
            "torch_max_memory_reserved_bytes"
            if row.get("torch_max_memory_reserved_bytes")
            else "mem_peak_rss_bytes"
        )
        out[eid] = {
            "status": row["status"],
            "tokens_per_second": _number(row.get("tokens_per_second_global")),
            "peak": _number(row.get(peak_name)),
            "peak_name": peak_name,
            "loss_history": result.get("loss_history"),
            "launch_overhead_s": _number(row.get("launch_overhead_s")),
            "wall_s": _number(row.get("wall_s")),
            "phases": {p: _number(row.get(f"phase_{p}_s")) for p in PHASES},
        }
    return out


def _number(text: str | None) -> float | None:
    try:
        return float(text) if text not in (None, "") else None
    except ValueError:
        return None


def _ratio(shared: list[float | None], fresh: list[float | None]) -> float | None:
    a = [v for v in shared if v is not None]
    b = [v for v in fresh if v is not None]
    if not a or not b or statistics.median(b) == 0:
        return None
    return statistics.median(a) / statistics.median(b)


def _span(values: list[float | None]) -> str:
    present = [v for v in values if v is not None]
    if not present:
        return "–"
    return f"{min(present):,.0f}–{max(present):,.0f}"


def _walls(pairs: list[dict[str, Any]], key: str) -> list[str]:
    ratios = [p[f"family_{key}"] / p[f"cell_{key}"] for p in pairs]
    rows = []
    for mode in ("cell", "family"):
        values = [p[f"{mode}_{key}"] for p in pairs]
        rows.append(
            f"| {mode} | {statistics.median(values):.1f} | {min(values):.1f}–{max(values):.1f} |"
        )
    rows.append(
        f"| family ÷ cell | {statistics.median(ratios):.3f} | {min(ratios):.3f}–{max(ratios):.3f} |"
    )
    return rows


def report(pairs: list[dict[str, Any]]) -> tuple[str, bool]:
    cells_ratio = statistics.median(p["family_cells"] / p["cell_cells"] for p in pairs)
    ids = list(pairs[0]["cell"])
    lines = [
        f"{len(pairs)} pair(s), alternating which mode runs first",
        "",
        "| the whole command, s | median | range |",
        "|---|---|---|",
        *_walls(pairs, "wall"),
        "",
        "| running its cells (first start to last end), s | median | range |",
        "|---|---|---|",
        *_walls(pairs, "cells"),
        "",
        f"target for running the cells: family ÷ cell ≤ {WALL_TARGET}",
        "",
        "| experiment | status cell / family | tokens/s family ÷ cell | tokens/s cell | "
        "tokens/s family | peak family ÷ cell | peak | losses equal |",
        "|---|---|---|---|---|---|---|---|",
    ]
    same_status = same_losses = True
    within = True
    for eid in ids:
        cell = [p["cell"][eid] for p in pairs]
        family = [p["family"][eid] for p in pairs]
        statuses = {r["status"] for r in cell} | {r["status"] for r in family}
        same_status &= len(statuses) == 1
        curves = {json.dumps(r["loss_history"]) for r in cell + family}
        equal = len(curves) == 1
        same_losses &= equal
        tps = _ratio(
            [r["tokens_per_second"] for r in family], [r["tokens_per_second"] for r in cell]
        )
        peak = _ratio([r["peak"] for r in family], [r["peak"] for r in cell])
        for value in (tps, peak):
            within &= value is not None and abs(value - 1) <= SAME_WITHIN
        lines.append(
            f"| `{eid}` | {'/'.join(sorted(statuses))} | {_fmt(tps)} | "
            f"{_span([r['tokens_per_second'] for r in cell])} | "
            f"{_span([r['tokens_per_second'] for r in family])} | {_fmt(peak)} | "
            f"{cell[0]['peak_name']} | {'yes' if equal else 'NO'} |"
        )
    overheads = [
        r["launch_overhead_s"]
        for p in pairs
        for r in p["family"].values()
        if r["launch_overhead_s"] is not None
    ]
    lines += [
        "",
        f"statuses the same: {'yes' if same_status else 'NO'}; "
        f"loss curves equal: {'yes' if same_losses else 'NO'}; "
        f"tokens/s and peaks within {SAME_WITHIN:.0%}: {'yes' if within else 'no'} "
        f"({'family could be the default' if within else 'the default stays cell'})",
    ]
    if overheads:
        lines.append(
            f"a launch's start-up (launch_overhead_s): median {statistics.median(overheads):.1f} s"
        )
    lines += ["", *phase_table(pairs)]
    ok = same_status and same_losses and cells_ratio <= WALL_TARGET
    return "\n".join(lines), ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Example: python benchmarks/bench_launch.py --pairs 5 --out launch.md",
    )
    parser.add_argument("--pairs", type=int, default=3, help="cell/family pairs (default 3)")
    parser.add_argument("--scenarios", type=Path, default=REPO / "scenarios.yaml")
    parser.add_argument("--out", type=Path, help="also write the report here (markdown)")
    parser.add_argument("extra", nargs="*", help="more `tunematrix run` arguments, after --")
    args = parser.parse_args(argv)
    pairs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-launch-") as work:
        for i in range(args.pairs):
            order = ("cell", "family") if i % 2 == 0 else ("family", "cell")
            pair: dict[str, Any] = {}
            for mode in order:
                results = Path(work) / f"{i}-{mode}"
                pair[f"{mode}_wall"] = run_matrix(mode, results, args.scenarios, args.extra)
                pair[f"{mode}_cells"] = cells_wall(results)
                pair[mode] = read_runs(results)
                print(
                    f"pair {i + 1}: {mode} {pair[f'{mode}_wall']:.1f} s, its cells "
                    f"{pair[f'{mode}_cells']:.1f} s",
                    file=sys.stderr,
                )
            pairs.append(pair)
    text, ok = report(pairs)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0 if ok else 1


def phase_table(pairs: list[dict[str, Any]]) -> list[str]:
    """Where the experiments' wall time went, per mode: each phase summed over the
    experiments (median over the pairs), and the wall over the training (the H100's
    targets: a fresh cell at most 2x its training, a family matrix at most 1.3x)."""
    lines = [
        "| where the wall went, s (Σ over the experiments) | "
        + " | ".join(PHASES)
        + " | wall | wall ÷ training |",
        "|---|" + "---|" * (len(PHASES) + 2),
    ]
    for mode in ("cell", "family"):
        sums: dict[str, list[float]] = {p: [] for p in (*PHASES, "wall")}
        for pair in pairs:
            runs = list(pair[mode].values())
            if any(r["wall_s"] is None or None in r["phases"].values() for r in runs):
                continue  # a run that did not record its phases (one that failed)
            for p in PHASES:
                sums[p].append(sum(r["phases"][p] for r in runs))
            sums["wall"].append(sum(r["wall_s"] for r in runs))
        if not sums["wall"]:
            lines.append(f"| {mode} | " + " | ".join("–" for _ in (*PHASES, 1, 2)) + " |")
            continue
        medians = {k: statistics.median(v) for k, v in sums.items()}
        ratio = medians["wall"] / medians["training"] if medians["training"] else None
        lines.append(
            f"| {mode} | "
            + " | ".join(f"{medians[p]:.1f}" for p in (*PHASES, "wall"))
            + f" | {_fmt(ratio)} |"
        )
    return lines


def _fmt(value: float | None) -> str:
    return "–" if value is None else f"{value:.3f}"


if __name__ == "__main__":
    sys.exit(main())
