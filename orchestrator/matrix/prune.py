"""Out-of-memory pruning: which cells an out-of-memory cell makes certain to fail. Pure.

A *ladder* is a set of cells that differ only in their size: the per-device
batch, the sequence length, packing, the effective batch and the gradient
accumulation. Everything else that can change the memory a run needs (the
scenario, model, task, trainer, framework overlay and its accelerate config and
environment, the PEFT method and its rank, gradient checkpointing, the dtype,
the GPU count, the device, the interpreter, a profile) is part of the ladder,
so cells that differ in it are never compared. The key is built from the
whole spec of a cell, less its ids, repeat, position and size, so a setting
added later splits ladders rather than being silently ignored.

Within a ladder, cell B *needs at least as much memory* as cell A when B's
per-device batch ≥ A's, B's sequence length ≥ A's, B's packing ≥ A's (on ≥
off) and B accumulates gradients wherever A does (accumulation > 1 keeps the
gradients alive through the next micro-batch's forward, and under FSDP keeps
them unsharded, so a cell without it may fit where one with it ran out). Once
A ran out of memory, B is certain to as well, so it is recorded as pruned
instead of being launched, unless a cell of the ladder that needs at least
A's memory has run ok in the meantime (an OOM an ok run contradicts was
transient: fragmentation, another process on the device). The effective batch
does not enter the test. The same cell's other repeats need exactly as much,
so they are pruned too.

``orchestrator.matrix.order`` puts the smaller cells of a ladder first, so
pruning can act; ``benchmarks/bench_prune_replay.py`` replays a published
table through the same functions.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from typing import Any

from orchestrator.config.values import canonical_json
from orchestrator.matrix.experiment import Experiment

#: the arguments that make a cell's size, the only ones a ladder's cells differ in
SIZE_ARGUMENTS = (
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "effective_batch_size",
    "max_seq_len",
    "packing",
)
#: fields of a spec that name a run rather than what it needs: left out of the ladder
_NOT_LADDER = ("experiment_id", "cell_id", "repeat", "position", "swept", *SIZE_ARGUMENTS)


@dataclass(frozen=True, order=True)
class Size:
    """What of a cell's size sets its memory: per-device batch, sequence length, packing.

    ``max_seq_len`` and ``packing`` are None where the task takes none (an image
    task): read as 1 and off, which compares them among themselves.
    """

    per_device: int
    max_seq_len: int | None = None
    packing: bool | None = None
    #: gradient accumulation > 1 (gradients held across micro-batches)
    accumulates: bool = False

    @property
    def seq(self) -> int:
        return 1 if self.max_seq_len is None else self.max_seq_len

    @property
    def packed(self) -> int:
        return 1 if self.packing else 0

    def needs_at_least(self, other: Size) -> bool:
        """Whether a cell of this size needs at least the memory of one of ``other``'s."""
        return (
            self.per_device >= other.per_device
            and self.seq >= other.seq
            and self.packed >= other.packed
            and self.accumulates >= other.accumulates
        )

    def order_key(self) -> tuple[int, int, int, int, int]:
        """A sort key that is a linear extension of ``needs_at_least``: whenever
        ``b.needs_at_least(a)`` and the sizes differ, ``a.order_key() < b.order_key()``.

        The tokens of a device's batch first (what activations grow with), then
        the batch, the sequence length, packing and accumulation, each of which
        only grows along the partial order.
        """
        return (
            self.per_device * self.seq,
            self.per_device,
            self.seq,
            self.packed,
            int(self.accumulates),
        )


@dataclass(frozen=True)
class Footprint:
    """A cell as pruning sees it: its id, its ladder and its size."""

    experiment_id: str
    ladder: Hashable
    size: Size


def size_of(experiment: Experiment) -> Size:
    return Size(
        per_device=experiment.per_device_train_batch_size,
        max_seq_len=experiment.max_seq_len,
        packing=experiment.packing,
        accumulates=experiment.gradient_accumulation_steps > 1,
    )


def ladder_key(experiment: Experiment) -> str:
    """The ladder of a cell: its whole spec but its ids, repeat, position and size,
    as canonical JSON (two cells share it exactly when only their size differs)."""
    spec: dict[str, Any] = {k: v for k, v in experiment.spec().items() if k not in _NOT_LADDER}
    spec["arguments"] = {
        k: v for k, v in spec.get("arguments", {}).items() if k not in SIZE_ARGUMENTS
    }
    return canonical_json(spec)


def footprint(experiment: Experiment) -> Footprint:
    return Footprint(experiment.experiment_id, ladder_key(experiment), size_of(experiment))


def pruned_by(
    cell: Footprint, out_of_memory: Iterable[Footprint], fitted: Iterable[Footprint] = ()
) -> str | None:
    """The id of the first out-of-memory cell that makes ``cell`` certain to run out of
    memory too (same ladder, and ``cell`` needs at least as much); None if there is none.

    An out-of-memory cell counts only while no cell of ``fitted`` (those that ran ok) of
    its ladder needs at least its memory: an ok run of that size shows the OOM was not
    the size's."""
    ok = [f for f in fitted if f.ladder == cell.ladder]
    for failed in out_of_memory:
        if failed.ladder != cell.ladder or not cell.size.needs_at_least(failed.size):
            continue
        if any(f.size.needs_at_least(failed.size) for f in ok):
            continue
        return failed.experiment_id
    return None
