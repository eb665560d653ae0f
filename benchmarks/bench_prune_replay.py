"""OOM pruning replayed on fms-acceleration's published A100-80GB table.

Usage: python benchmarks/bench_prune_replay.py [--table CSV] [--oom-cost median|SECONDS]...

The table (``benchmarks/fixtures/fms_acceleration_a100_80gb.csv``: its source,
commit and licence are in its header) gives, per cell, whether the run
finished and how long it trained (``train_runtime``). A row without figures
is taken as out of memory when its reserved memory reached
``LIKELY_OOM_FRACTION`` of the device's 80 GiB, as the report's likely-OOM
rule says (every such row of this table does, at 95-99%); one that did not
would count as failed and prune nothing.

Each row becomes a ``Footprint`` with the same pure functions the runner uses
(``orchestrator.matrix.prune``): its ladder is every configuration column of
the table (model, framework config, PEFT method and its settings, GPU count,
dtype, learning rate…) but the per-device batch, and its size is the per-device
batch (the table has no sequence-length or packing column: one length
throughout). Each ladder runs in our plan order
(``orchestrator.matrix.order.size_order_key``), and each cell either launches
(costing its published runtime, or the OOM cost below) or is pruned by an
earlier out-of-memory cell of its ladder (``pruned_by``), as ``RunContext.prepare``
decides.

Cost of an out-of-memory launch: the table has none (the run crashed after the
model load, which the published runtimes leave out). Each ``--oom-cost`` gives a
line: a fixed number of seconds, or ``median``, the median published runtime of
the finished cells of the same model and GPU count (a crash charged as much as
a finished run); default 60 s, 300 s and median. The launch counts do not
depend on it.

"Same answers": every pruned cell must be one the table says ran out of
memory; a pruned cell the table has as finished is a wrong prune, listed, and
the script exits 1.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from orchestrator.matrix.order import size_order_key  # noqa: E402
from orchestrator.matrix.prune import Footprint, Size, pruned_by  # noqa: E402
from orchestrator.results.capacity import LIKELY_OOM_FRACTION  # noqa: E402
from orchestrator.results.tablecolumns import is_output  # noqa: E402

TABLE = REPO / "benchmarks" / "fixtures" / "fms_acceleration_a100_80gb.csv"
DEVICE_MIB = 80 * 1024
#: the table's columns that make a cell's size
SIZE_COLUMNS = ("per_device_train_batch_size",)


@dataclass(frozen=True)
class Cell:
    row: int
    cell: Footprint
    num_gpus: int
    model: str
    #: ok, oom, or failed (no figures, memory below the likely-OOM mark)
    status: str
    runtime_s: float | None


def read_table(path: Path) -> list[dict[str, str]]:
    """The rows of a CSV whose leading ``#`` lines are its header comment."""
    with path.open(newline="", encoding="utf-8") as f:
        lines = [line for line in f if not line.startswith("#")]
    return list(csv.DictReader(lines))


def cells_of(rows: Sequence[dict[str, str]]) -> list[Cell]:
    config = [c for c in rows[0] if not is_output(c) and c not in SIZE_COLUMNS]
    out = []
    for i, row in enumerate(rows):
        runtime = float(row["train_runtime"]) if row["train_runtime"] else None
        if runtime is not None:
            status = "ok"
        else:
            reserved = float(row["mem_nvidia_mem_reserved"] or 0)
            status = "oom" if reserved >= LIKELY_OOM_FRACTION * DEVICE_MIB else "failed"
        ladder = tuple((c, row[c]) for c in config)
        size = Size(per_device=int(row["per_device_train_batch_size"]))
        out.append(
            Cell(
                row=i,
                cell=Footprint(f"row{i + 2}", ladder, size),
                num_gpus=int(row["num_gpus"]),
                model=row["model_name_or_path"],
                status=status,
                runtime_s=runtime,
            )
        )
    return out


def oom_costs(cells: Sequence[Cell], oom_cost: str) -> dict[int, float]:
    """What each unfinished cell's launch is charged (see the module)."""
    if oom_cost != "median":
        return {c.row: float(oom_cost) for c in cells if c.runtime_s is None}
    medians: dict[tuple[str, int], float] = {}
    for key in {(c.model, c.num_gpus) for c in cells}:
        finished = [c.runtime_s for c in cells if (c.model, c.num_gpus) == key and c.runtime_s]
        if finished:
            medians[key] = statistics.median(finished)
    every = statistics.median(c.runtime_s for c in cells if c.runtime_s)
    return {c.row: medians.get((c.model, c.num_gpus), every) for c in cells if c.runtime_s is None}


@dataclass
class Replay:
    launched: list[Cell]
    pruned: list[tuple[Cell, str]]


def replay(cells: Sequence[Cell]) -> Replay:
    """Run each ladder in plan order, pruning as the runner does."""
    ladders: dict[object, list[Cell]] = {}
    for c in cells:
        ladders.setdefault(c.cell.ladder, []).append(c)
    done = Replay([], [])
    for members in ladders.values():
        # the table has no effective batch or accumulation column: per-device × GPUs, 1
        members.sort(key=lambda c: size_order_key(c.cell.size, c.cell.size.per_device, 1))
        out_of_memory: list[Footprint] = []
        for c in members:
            culprit = pruned_by(c.cell, out_of_memory)
            if culprit is not None:
                done.pruned.append((c, culprit))
                continue
            done.launched.append(c)
            if c.status == "oom":
                out_of_memory.append(c.cell)
    return done


def _cost_label(oom_cost: str) -> str:
    if oom_cost == "median":
        return "median of its model × GPUs"
    return f"{float(oom_cost):g} s"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table", type=Path, default=TABLE, help="the published table")
    parser.add_argument(
        "--oom-cost",
        action="append",
        help="seconds an out-of-memory launch costs, or 'median': the median runtime of "
        "the finished cells of the same model and GPU count; repeatable, each gives a "
        "line (default: 60, 300 and median)",
    )
    args = parser.parse_args()
    oom_cost_options = args.oom_cost or ["60", "300", "median"]
    for option in oom_cost_options:
        if option != "median":
            try:
                float(option)
            except ValueError:
                parser.error(f"--oom-cost must be 'median' or seconds, got {option!r}")

    cells = cells_of(read_table(args.table))
    result = replay(cells)
    ooms = [c for c in cells if c.status == "oom"]
    failed = [c for c in cells if c.status == "failed"]
    wrong = [(c, by) for c, by in result.pruned if c.status != "oom"]
    ladders = len({c.cell.ladder for c in cells})
    ok_s = sum(c.runtime_s or 0.0 for c in cells)

    shown = args.table.relative_to(REPO) if args.table.is_relative_to(REPO) else args.table
    print(f"table: {shown}")
    print(
        f"  {len(cells)} cells in {ladders} families (same configuration but the per-device "
        f"batch); {len(cells) - len(ooms) - len(failed)} finished, {len(ooms)} out of memory "
        f"(no figures, reserved memory ≥ {100 * LIKELY_OOM_FRACTION:.0f}% of 80 GiB), "
        f"{len(failed)} failed otherwise; the finished cells trained {ok_s / 3600:.2f} h"
    )
    print()
    print(
        f"launches: every cell {len(cells)}, with pruning {len(result.launched)}; "
        f"ratio {len(result.launched) / len(cells):.3f} "
        f"({len(result.pruned)} launches avoided)"
    )
    print()
    print("hours (finished runs at their published runtime, an OOM launch at the cost shown):")
    print(f"  {'OOM launch costs':<28}{'every cell':>12}{'with pruning':>14}{'ratio':>8}")
    for option in oom_cost_options:
        costs = oom_costs(cells, option)

        def cost(c: Cell, costs: dict[int, float] = costs) -> float:
            return c.runtime_s if c.runtime_s is not None else costs[c.row]

        every_s = sum(cost(c) for c in cells)
        pruned_s = sum(cost(c) for c in result.launched)
        print(
            f"  {_cost_label(option):<28}{every_s / 3600:>12.2f}{pruned_s / 3600:>14.2f}"
            f"{pruned_s / every_s:>8.3f}"
        )
    print()
    print(
        f"out-of-memory rows avoidable: {len(result.pruned) - len(wrong)} of {len(ooms)} "
        "(each of the others is the smallest OOM of its family, which pruning has to see)"
    )
    print(f"wrong prunes (pruned, but finished in the table): {len(wrong)}")
    for c, by in wrong:
        print(f"  {c.cell.experiment_id} pruned by {by}: {c.model}, {c.num_gpus} GPU(s)")
    same = not wrong
    print(f"same answers: {'yes' if same else 'NO'}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
