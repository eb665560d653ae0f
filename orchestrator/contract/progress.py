"""``progress.json``: where a training child is, written by its rank 0 while it trains.

The child writes it (``trainer_entry.measure.progressfile``); the parent reads it on its
progress tick (``orchestrator.executors.console``) for step counters and the ETA.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

#: What a child reports it is doing: the warmup steps the measurement leaves out,
#: the measured steps, or training over.
PHASES = ("warmup", "measuring", "done")

#: A progress file written this long before its job began is an earlier run's
#: (the allowance is for the clock of another node, under SLURM).
STALE_BEFORE_BEGIN_S = 5.0


@dataclass(frozen=True)
class StepProgress:
    """Where a training child is, as it writes it to ``progress.json``."""

    #: optimizer steps done
    step: int
    #: optimizer steps it will run
    max_steps: int
    #: rank 0's real tokens (padding excluded) per second over the steps since the
    #: previous write; per device, since no rank waits on the others to report it.
    #: None before the first step
    tokens_per_second_rank0: float | None
    #: training processes of the job
    world_size: int
    #: one of ``PHASES``
    phase: str
    #: Unix time of this write
    updated: float
    #: Unix time training began (after loading, before the first step)
    train_started: float

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True) + "\n"

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StepProgress | None:
        """The record in ``data``, or None unless every field is there and makes sense."""

        def count(value: Any) -> int | None:
            return value if isinstance(value, int) and not isinstance(value, bool) else None

        def seconds(value: Any) -> float | None:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            return float(value) if ok and math.isfinite(value) else None

        step, max_steps, world = (count(data.get(k)) for k in ("step", "max_steps", "world_size"))
        updated, began = seconds(data.get("updated")), seconds(data.get("train_started"))
        tps = data.get("tokens_per_second_rank0")
        rate = None if tps is None else seconds(tps)
        if (
            step is None
            or max_steps is None
            or world is None
            or updated is None
            or began is None
            or not 0 <= step <= max_steps
            or max_steps < 1
            or world < 1
            or data.get("phase") not in PHASES
            or (tps is not None and (rate is None or rate < 0))
        ):
            return None
        return cls(step, max_steps, rate, world, str(data["phase"]), updated, began)

    @classmethod
    def read(cls, path: Path) -> StepProgress | None:
        """The record at ``path``; None when there is none or it cannot be read."""
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return cls.from_dict(data) if isinstance(data, dict) else None

    def seconds_left(self, now: float) -> float | None:
        """Training time left at Unix time ``now``, at the pace of the steps so far."""
        if self.phase == "done":
            return 0.0
        spent = self.updated - self.train_started
        if self.step == 0 or spent <= 0:
            return None
        left = spent * (self.max_steps - self.step) / self.step
        return max(0.0, left - max(0.0, now - self.updated))

    def describe(self) -> str:
        """``step 37/100, 1,234 tok/s`` (``tok/s/device`` for several processes)."""
        text = f"step {self.step}/{self.max_steps}"
        if self.tokens_per_second_rank0 is not None:
            unit = "tok/s" if self.world_size == 1 else "tok/s/device"
            text += f", {self.tokens_per_second_rank0:,.0f} {unit}"
        if self.phase == "warmup":
            text += ", warmup"
        return text
