"""Which experiment runs next, on which devices. Pure: no processes here.

Exclusive (the default) runs one job at a time on the first devices it
needs. Packing hands each job the devices it needs from a pool and starts jobs
while devices are free, largest first, so that a job needing every GPU is not
starved by a stream of one-GPU jobs; jobs of equal size keep plan order (the
repeats of a cell, for instance, start in order).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")


class DevicePool:
    """Devices (CUDA_VISIBLE_DEVICES entries, or CPU slots) handed out and given back."""

    def __init__(self, devices: Sequence[str]) -> None:
        self._order = {d: i for i, d in enumerate(devices)}
        self.size = len(devices)
        self.free: list[str] = list(devices)

    def take(self, n: int) -> list[str] | None:
        """``n`` free devices (the lowest first), or None if fewer are free."""
        if n > len(self.free):
            return None
        taken, self.free = self.free[:n], self.free[n:]
        return taken

    def give(self, devices: Sequence[str]) -> None:
        for d in devices:
            if d not in self._order or d in self.free:
                raise ValueError(f"device {d!r} was not handed out by this pool")
        self.free = sorted([*self.free, *devices], key=self._order.__getitem__)


@dataclass
class PackQueue(Generic[T]):
    """Jobs waiting for devices, largest first; ``start`` pops what fits now."""

    pool: DevicePool
    pending: list[tuple[int, T]] = field(default_factory=list)

    @classmethod
    def of(cls, jobs: Sequence[tuple[int, T]], pool: DevicePool) -> PackQueue[T]:
        too_big = [size for size, _ in jobs if size > pool.size]
        if too_big:
            raise ValueError(f"a job needs {max(too_big)} devices; the pool has {pool.size}")
        # stable: equal sizes keep plan order
        ordered = sorted(jobs, key=lambda job: -job[0])
        return cls(pool=pool, pending=ordered)

    def start(self) -> list[tuple[T, list[str]]]:
        """Every waiting job that fits in the free devices now, in queue order.

        A smaller job may start ahead of a larger one that does not fit yet, but
        only while no larger job is waiting for devices that are merely busy:
        when the largest waiting job could run on the whole pool, smaller ones
        wait too, so it is not starved.
        """
        started: list[tuple[T, list[str]]] = []
        remaining: list[tuple[int, T]] = []
        blocked_size: int | None = None
        for size, job in self.pending:
            if blocked_size is not None and size < blocked_size:
                remaining.append((size, job))
                continue
            devices = self.pool.take(size)
            if devices is None:
                blocked_size = size if blocked_size is None else blocked_size
                remaining.append((size, job))
                continue
            started.append((job, devices))
        self.pending = remaining
        return started

    def __len__(self) -> int:
        return len(self.pending)
