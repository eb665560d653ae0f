"""Progress of a run: a live line on a terminal, plain log lines otherwise."""

from __future__ import annotations

import shutil
import sys
import threading
import time
from typing import TextIO


def _clock(seconds: float) -> str:
    seconds = max(0, int(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m:d}:{s:02d}"


class Progress:
    """done/total, the running experiments, elapsed time and an ETA from finished jobs.

    Safe to call from the threads of packed jobs.
    """

    def __init__(self, total: int, stream: TextIO | None = None, *, parallel: int = 1) -> None:
        self.total = total
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty()
        self.parallel = max(1, parallel)
        self.done = 0
        self.start = time.monotonic()
        self.durations: list[float] = []
        self.running: dict[str, float] = {}
        self._lock = threading.Lock()

    def _eta(self) -> str:
        if not self.durations:
            return "?"
        remaining = self.total - self.done
        mean = sum(self.durations) / len(self.durations)
        return _clock(mean * remaining / self.parallel)

    def _clear(self) -> None:
        if self.live:
            self.stream.write("\r\033[K")

    def begin(self, experiment_id: str) -> None:
        with self._lock:
            self.running[experiment_id] = time.monotonic()
            if self.live:
                self._draw()
            else:
                self.stream.write(f"[{self.done + 1}/{self.total}] start {experiment_id}\n")
                self.stream.flush()

    def tick(self) -> None:
        """Redraw the live line (a no-op in log mode)."""
        with self._lock:
            if self.live and self.running:
                self._draw()

    def _draw(self) -> None:
        width = shutil.get_terminal_size((100, 20)).columns
        now = time.monotonic()
        current = ", ".join(f"{eid} {_clock(now - t)}" for eid, t in self.running.items())
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
        with self._lock:
            self.done += 1
            if counted:
                self.durations.append(seconds)
            self.running.pop(experiment_id, None)
            self._clear()
            detail = f"  {note}" if note else ""
            self.stream.write(
                f"[{self.done}/{self.total}] {status:<11} {experiment_id}  {seconds:.1f}s{detail}\n"
            )
            if self.live and self.running:
                self._draw()
            self.stream.flush()

    def message(self, text: str) -> None:
        with self._lock:
            self._clear()
            self.stream.write(text + "\n")
            self.stream.flush()
