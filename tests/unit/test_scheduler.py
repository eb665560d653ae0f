"""Packing: no device over-committed, every job run once, largest first, plan order kept."""

from __future__ import annotations

import heapq
import random

import pytest

from orchestrator.executors.scheduler import DevicePool, PackQueue


def simulate(
    jobs: list[tuple[int, str, float]], devices: int
) -> list[tuple[float, float, str, list[str]]]:
    """Run jobs (size, name, duration) through the queue on a simulated clock."""
    pool = DevicePool([str(i) for i in range(devices)])
    queue = PackQueue.of([(size, (name, duration)) for size, name, duration in jobs], pool)
    clock = 0.0
    running: list[tuple[float, str, list[str]]] = []
    log = []
    in_use: set[str] = set()
    while len(queue) or running:
        for (name, duration), got in queue.start():
            assert not in_use & set(got), "a device was handed out twice"
            in_use |= set(got)
            heapq.heappush(running, (clock + duration, name, got))
            log.append((clock, clock + duration, name, got))
        end, name, got = heapq.heappop(running)
        clock = end
        in_use -= set(got)
        pool.give(got)
    return log


def test_every_job_once_and_never_over_committed() -> None:
    rng = random.Random(7)
    jobs = [(rng.choice([1, 1, 2, 4]), f"j{i}", rng.uniform(1, 10)) for i in range(60)]
    log = simulate(jobs, 4)
    assert sorted(name for *_, name, _ in log) == sorted(name for _, name, _ in jobs)
    events = sorted(
        [(s, 1, len(g)) for s, _, _, g in log] + [(e, -1, len(g)) for _, e, _, g in log]
    )
    busy = 0
    for _, kind, n in sorted(events, key=lambda e: (e[0], e[1])):
        busy += kind * n
        assert 0 <= busy <= 4


def test_largest_first_and_not_starved() -> None:
    # a 4-GPU job among many 1-GPU jobs starts first, not after all of them
    jobs = [(1, f"small{i}", 5.0) for i in range(8)] + [(4, "big", 5.0)]
    log = simulate(jobs, 4)
    start = {name: s for s, _, name, _ in log}
    assert start["big"] == 0.0
    assert min(s for n, s in start.items() if n != "big") == 5.0


def test_a_waiting_large_job_holds_back_smaller_ones() -> None:
    # two GPUs busy with an earlier job; a waiting 4-GPU job is not overtaken by a 1-GPU job
    pool = DevicePool(["0", "1", "2", "3"])
    busy = pool.take(2)
    assert busy == ["0", "1"]
    queue = PackQueue.of([(1, "c"), (4, "b")], pool)
    assert queue.start() == []  # b waits for all four; c waits behind b
    pool.give(busy)
    assert queue.start() == [("b", ["0", "1", "2", "3"])]
    pool.give(["0", "1", "2", "3"])
    assert queue.start() == [("c", ["0"])]


def test_equal_sizes_keep_plan_order_and_lowest_devices() -> None:
    pool = DevicePool(["0", "1", "2", "3"])
    queue = PackQueue.of([(1, "r0"), (1, "r1"), (1, "r2"), (1, "r3"), (1, "r4")], pool)
    started = queue.start()
    assert [name for name, _ in started] == ["r0", "r1", "r2", "r3"]
    assert [d for _, d in started] == [["0"], ["1"], ["2"], ["3"]]
    pool.give(["2"])
    assert queue.start() == [("r4", ["2"])]


def test_pool_errors() -> None:
    pool = DevicePool(["0", "1"])
    with pytest.raises(ValueError, match="not handed out"):
        pool.give(["0"])
    with pytest.raises(ValueError, match="a job needs 4 devices; the pool has 2"):
        PackQueue.of([(4, "x")], pool)
