"""Progress of a run: a live line on a terminal, plain log lines otherwise."""

from __future__ import annotations

import shutil
import sys
import time
from typing import TextIO


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m:d}:{s:02d}"


class Progress:
    """done/total, the current experiment, elapsed time and an ETA from finished jobs."""

    def __init__(self, total: int, stream: TextIO | None = None) -> None:
        self.total = total
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty()
        self.done = 0
        self.start = time.monotonic()
        self.durations: list[float] = []
        self.current: str | None = None
        self.current_start = 0.0

    def _eta(self) -> str:
        if not self.durations:
            return "?"
        remaining = self.total - self.done
        mean = sum(self.durations) / len(self.durations)
        return _clock(
            mean * remaining - (time.monotonic() - self.current_start if self.current else 0)
        )

    def _clear(self) -> None:
        if self.live:
            self.stream.write("\r\033[K")

    def begin(self, experiment_id: str) -> None:
        self.current = experiment_id
        self.current_start = time.monotonic()
        if self.live:
            self.tick()
        else:
            self.stream.write(f"[{self.done + 1}/{self.total}] start {experiment_id}\n")
            self.stream.flush()

    def tick(self) -> None:
        """Redraw the live line (a no-op in log mode)."""
        if not self.live or self.current is None:
            return
        width = shutil.get_terminal_size((100, 20)).columns
        line = (
            f"[{self.done}/{self.total}] elapsed {_clock(time.monotonic() - self.start)} "
            f"eta {self._eta()} | {self.current} {_clock(time.monotonic() - self.current_start)}"
        )
        self._clear()
        self.stream.write(line[: width - 1])
        self.stream.flush()

    def finish(
        self, experiment_id: str, status: str, seconds: float, note: str = "", counted: bool = True
    ) -> None:
        self.done += 1
        if counted:
            self.durations.append(seconds)
        self.current = None
        self._clear()
        detail = f"  {note}" if note else ""
        self.stream.write(
            f"[{self.done}/{self.total}] {status:<11} {experiment_id}  {seconds:.1f}s{detail}\n"
        )
        self.stream.flush()

    def message(self, text: str) -> None:
        self._clear()
        self.stream.write(text + "\n")
        self.stream.flush()
