"""The run order of a plan: smaller cells first, variants counterbalanced. Pure.

Within each scenario (in file order), experiments run in blocks of one model
and GPU count (in the order expansion first met them). Inside a block, the
cells are grouped by their size (per-device batch, sequence length, packing,
effective batch, gradient accumulation) and the groups run smallest first,
by ``orchestrator.matrix.prune.Size.order_key`` then the effective batch and
accumulation: a linear extension of "needs at least as much memory", so
within any pruning ladder a cell always runs before every cell that needs at
least as much memory, and an out-of-memory cell can prune the larger ones
before they launch.

Inside a group, the variants (framework × sweep values × environment: every
cell of that size) run counterbalanced by repeat: repeat 0 in plan order
A B C, repeat 1 reversed C B A, repeat 2 forward again, so with two variants
and two repeats A B B A. A machine that warms up or drifts over the run then
favours no variant, and ``orchestrator.results.drift`` can tell a trend with
position from a variant's own speed.

Each experiment gets its 1-based ``position`` in this order (``plan.csv``,
``raw_summary.csv``). Ids do not depend on the order.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Sequence

from orchestrator.matrix.experiment import Experiment
from orchestrator.matrix.prune import Size, size_of


def size_order_key(
    size: Size, effective_batch_size: int, gradient_accumulation_steps: int
) -> tuple[int, ...]:
    """The sort key of a size group: smaller cells first (see the module); ties on the
    memory size broken by the effective batch, then the accumulation."""
    return (*size.order_key(), effective_batch_size, gradient_accumulation_steps)


def group_key(experiment: Experiment) -> tuple[int, ...]:
    """The sort key of a cell's size group."""
    return size_order_key(
        size_of(experiment),
        experiment.effective_batch_size,
        experiment.gradient_accumulation_steps,
    )


def counterbalance(cells: Sequence[Sequence[Experiment]]) -> list[Experiment]:
    """The repeats of ``cells`` (each a cell's experiments by repeat) interleaved:
    repeat 0 in the given order, repeat 1 reversed, repeat 2 forward, …"""
    out: list[Experiment] = []
    rounds = max((len(c) for c in cells), default=0)
    for r in range(rounds):
        row = [c[r] for c in cells if r < len(c)]
        out.extend(row if r % 2 == 0 else reversed(row))
    return out


def order_experiments(experiments: Sequence[Experiment]) -> tuple[Experiment, ...]:
    """``experiments`` (in expansion order) in run order, each with its ``position``."""
    blocks: dict[Hashable, dict[tuple[int, ...], dict[str, list[Experiment]]]] = {}
    for e in experiments:
        block = blocks.setdefault((e.scenario, e.model_name_or_path, e.num_gpus), {})
        block.setdefault(group_key(e), {}).setdefault(e.cell_id, []).append(e)
    ordered: list[Experiment] = []
    # dicts keep first-seen order: scenarios in file order, then model × GPU count blocks
    for block in blocks.values():
        for key in sorted(block):
            cells = [sorted(runs, key=lambda e: e.repeat) for runs in block[key].values()]
            ordered.extend(counterbalance(cells))
    return tuple(dataclasses.replace(e, position=i) for i, e in enumerate(ordered, 1))
