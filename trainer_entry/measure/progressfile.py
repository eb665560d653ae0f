"""The child's progress file: which step training has reached, for the parent's progress line.

Rank 0 alone writes it (no rank waits on another for it), from the step
records it keeps anyway: at the start of training, after the first step, then
after the first step that ends a second or more after the previous write, and
at the end. A write is a small JSON record put in place with ``os.replace``, so
a reader sees the old record or the new one whole; it is not fsynced, as a
progress line needs no durability and an fsync can take milliseconds.

The writes fall inside the steps' timed region (nothing falls between steps),
so their cost is bounded: between writes a step costs two additions and a
comparison (about 0.15 µs); a write costs about 0.4 ms on a local ext4 disk
(the rename over the old file is most of it), 0.04% of a second; and where
writes are slower (a network filesystem), the interval grows so that writing
never takes more than ``MAX_SHARE`` of the training time.

A file that cannot be written is said once on stderr; training goes on.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

from orchestrator.contract.progress import StepProgress
from orchestrator.contract.window import warmup_of

#: at most one write per this much training time (besides the first step and the end)
INTERVAL_S = 1.0
#: the most of the training time writes may take: a slow write spaces the next one out
MAX_SHARE = 0.001


class ProgressFile:
    """Keeps ``path`` up to date with a ``StepProgress`` record while training runs."""

    def __init__(
        self,
        path: Path,
        *,
        world_size: int,
        warmup_steps: int | None = None,
        interval_s: float = INTERVAL_S,
        wall: Callable[[], float] = time.time,
        clock: Callable[[], float] = time.perf_counter,
        may_write: Callable[[], bool] = lambda: True,
    ) -> None:
        self.path = path
        #: whether this attempt still owns the run folder (``results.ownership``)
        self._may_write = may_write
        self.world_size = world_size
        #: the measurement's warmup (``warmup_steps_excluded``); None: its default
        self.warmup_steps = warmup_steps
        self.interval_s = interval_s
        self._wall = wall
        self._clock = clock
        self._tmp = path.with_name(f".{path.name}.tmp")
        self._max_steps = 1
        self._warmup = 0
        self._started = 0.0
        self._step = 0
        self._tps: float | None = None
        # tokens and step time since the previous write
        self._tokens = 0
        self._seconds = 0.0
        #: the interval now: ``interval_s``, or longer after a slow write
        self._every = interval_s
        self._warned = False

    def begin(self, max_steps: int) -> None:
        """Training starts (before the first step's clock): step 0."""
        self._max_steps = max(1, max_steps)
        # as the measurement counts it: at least one step measured
        self._warmup = warmup_of(self._max_steps, self.warmup_steps)
        self._started = self._wall()
        self._write("warmup" if self._warmup > 0 else "measuring")

    def step(self, step: int, tokens: int, seconds: float) -> None:
        """Step ``step`` ended, having fed ``tokens`` real tokens in ``seconds`` (rank 0's)."""
        self._step = step
        self._tokens += tokens
        self._seconds += seconds
        if self._seconds >= self._every or step == 1:
            self._tps = self._tokens / self._seconds if self._seconds > 0 else None
            self._tokens, self._seconds = 0, 0.0
            start = self._clock()
            self._write("warmup" if step <= self._warmup else "measuring")
            self._every = max(self.interval_s, (self._clock() - start) / MAX_SHARE)

    def end(self, step: int) -> None:
        """Training is over (after the last step's clock)."""
        self._step = step
        self._max_steps = max(self._max_steps, step)
        self._write("done")

    def _write(self, phase: str) -> None:
        if not self._may_write():
            return
        record = StepProgress(
            step=min(self._step, self._max_steps),
            max_steps=self._max_steps,
            tokens_per_second_rank0=self._tps,
            world_size=self.world_size,
            phase=phase,
            updated=self._wall(),
            train_started=self._started,
        )
        try:
            with open(self._tmp, "w", encoding="utf-8") as f:
                f.write(record.to_json())
            os.replace(self._tmp, self.path)
        except OSError as exc:
            if not self._warned:
                self._warned = True
                print(
                    f"trainer_entry: cannot write the progress file {self.path} ({exc}); "
                    "training goes on without it",
                    file=sys.stderr,
                    flush=True,
                )
