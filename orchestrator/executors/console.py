"""Progress of a run: a live line on a terminal, plain log lines otherwise.

While it trains, a job's child (rank 0) keeps a small JSON file in its run
folder up to date (``progress.json``, see ``StepProgress``): the step it has
reached, the steps it will run and its recent tokens/s. ``Progress`` reads that
file on its tick, never the child's output, to show each running experiment's
step counter and to estimate the ETA. A missing, stale or unreadable file only
means no step figures for that experiment.
"""

from __future__ import annotations

import shutil
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from orchestrator.contract.progress import STALE_BEFORE_BEGIN_S, StepProgress


def _clock(seconds: float) -> str:
    seconds = max(0, int(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m:d}:{s:02d}"


@dataclass
class _Running:
    #: monotonic and Unix time of ``begin``
    began: float
    began_wall: float
    progress_file: Path | None
    reading: StepProgress | None = None
    #: the last plain step line: when (monotonic) and at which step
    said_at: float = 0.0
    said_step: int = 0


class Progress:
    """done/total, the running experiments with their steps, elapsed time and an ETA.

    On a terminal one line is redrawn in place; otherwise each event is a plain
    line, and a running experiment gets a step line only when both
    ``plain_every_s`` have passed and ``plain_every_fraction`` of its steps
    were done since its previous one (so a long matrix does not flood a log).
    Safe to call from the threads of packed jobs.
    """

    def __init__(
        self,
        total: int,
        stream: TextIO | None = None,
        *,
        parallel: int = 1,
        plain_every_s: float = 30.0,
        plain_every_fraction: float = 0.1,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.total = total
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty()
        self.parallel = max(1, parallel)
        self.plain_every_s = plain_every_s
        self.plain_every_fraction = plain_every_fraction
        self._now = clock
        self._wall = wall
        self.done = 0
        self.start = clock()
        self.durations: list[float] = []
        self.running: dict[str, _Running] = {}
        self._lock = threading.Lock()

    # -- reading the children's files ------------------------------------------

    def _read(self, entry: _Running) -> StepProgress | None:
        if entry.progress_file is None:
            return None
        reading = StepProgress.read(entry.progress_file)
        if reading is None or reading.updated < entry.began_wall - STALE_BEFORE_BEGIN_S:
            return None
        return reading

    def _refresh(self, only: str | None = None) -> None:
        """Read the progress files of the running experiments (outside the lock).

        ``only``: that experiment's, which just ended; an unreadable last read
        keeps what was read before.
        """
        with self._lock:
            entries = [(e, r) for e, r in self.running.items() if only is None or e == only]
        readings = [(eid, entry, self._read(entry)) for eid, entry in entries]
        with self._lock:
            for eid, entry, reading in readings:
                # the same run of it still (not ended and begun again meanwhile)
                if self.running.get(eid) is entry and (reading is not None or only is None):
                    entry.reading = reading

    # -- the estimate ----------------------------------------------------------

    def eta_s(self) -> float | None:
        """Seconds until every experiment is done; None until there is anything to go on.

        A running experiment with step figures has its own estimate (its pace so
        far); the others, and those not started, take the mean duration of the
        finished jobs, or before any finished, the projected duration of the
        running ones.
        """
        with self._lock:
            return self._eta_s()

    def _eta_s(self) -> float | None:
        now, wall = self._now(), self._wall()
        left: dict[str, float | None] = {
            eid: r.reading.seconds_left(wall) if r.reading else None
            for eid, r in self.running.items()
        }
        durations = self.durations or [
            now - self.running[eid].began + s for eid, s in left.items() if s is not None
        ]
        if not durations:
            return None
        mean = sum(durations) / len(durations)
        work = 0.0
        for eid, s in left.items():
            work += s if s is not None else max(0.0, mean - (now - self.running[eid].began))
        work += max(0, self.total - self.done - len(self.running)) * mean
        longest = max((s for s in left.values() if s is not None), default=0.0)
        return max(longest, work / self.parallel)

    def _eta(self) -> str:
        seconds = self._eta_s()
        return "?" if seconds is None else _clock(seconds)

    # -- events ----------------------------------------------------------------

    def _clear(self) -> None:
        if self.live:
            self.stream.write("\r\033[K")

    def begin(self, experiment_id: str, progress_file: Path | None = None) -> None:
        """An experiment started; ``progress_file`` is where its child reports its steps."""
        with self._lock:
            now = self._now()
            self.running[experiment_id] = _Running(now, self._wall(), progress_file, said_at=now)
            if self.live:
                self._draw()
            else:
                self.stream.write(f"[{self.done + 1}/{self.total}] start {experiment_id}\n")
                self.stream.flush()

    def tick(self) -> None:
        """Read the running experiments' steps; redraw the live line, or write due step lines."""
        self._refresh()
        with self._lock:
            if not self.running:
                return
            if self.live:
                self._draw()
            else:
                self._plain_steps()

    def _plain_steps(self) -> None:
        now = self._now()
        due = []
        for eid, r in self.running.items():
            p = r.reading
            if p is None or p.phase == "done" or p.step <= r.said_step:
                continue
            if (
                now - r.said_at >= self.plain_every_s
                and p.step - r.said_step >= self.plain_every_fraction * p.max_steps
            ):
                due.append((eid, r, p))
        if not due:
            return
        eta = self._eta()
        for eid, r, p in due:
            r.said_at, r.said_step = now, p.step
            self.stream.write(
                f"[{self.done}/{self.total}] {'running':<11} {eid}  {p.describe()}, "
                f"{_clock(now - r.began)} in; eta {eta}\n"
            )
        self.stream.flush()

    def _draw(self) -> None:
        width = shutil.get_terminal_size((100, 20)).columns
        now = self._now()
        current = " | ".join(
            (f"{r.reading.describe()}, " if r.reading else "") + f"{_clock(now - r.began)} {eid}"
            for eid, r in self.running.items()
        )
        line = (
            f"[{self.done}/{self.total}] elapsed {_clock(now - self.start)} "
            f"eta {self._eta()} | {current}"
        )
        self._clear()
        self.stream.write(line[: width - 1])
        self.stream.flush()

    def finish(
        self, experiment_id: str, status: str, seconds: float, note: str = "", counted: bool = True
    ) -> None:
        """An experiment ended; its line says the step it reached, if its child said."""
        self._refresh(only=experiment_id)
        with self._lock:
            self.done += 1
            if counted:
                self.durations.append(seconds)
            ended = self.running.pop(experiment_id, None)
            reading = ended.reading if ended else None
            self._clear()
            steps = f", step {reading.step}/{reading.max_steps}" if reading else ""
            detail = f"  {note}" if note else ""
            self.stream.write(
                f"[{self.done}/{self.total}] {status:<11} {experiment_id}  "
                f"{seconds:.1f}s{steps}{detail}\n"
            )
            if self.live and self.running:
                self._draw()
            self.stream.flush()

    def message(self, text: str) -> None:
        with self._lock:
            self._clear()
            self.stream.write(text + "\n")
            self.stream.flush()
