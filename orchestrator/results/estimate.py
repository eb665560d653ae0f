"""What a plan will cost before it runs, from the results history of earlier runs.

Per planned experiment, from the ok runs in ``history.sqlite``:

1. **its own cell** (the same ``cell_id``: same configuration, same id): the
   median wall time of its ok runs;
2. else **similar cells** (same model, device, GPU count and framework): each
   such run's measured tokens/s scaled to this experiment's tokens (steps ×
   effective batch × sequence length, times the share of real tokens that run
   had), plus that run's measured time outside the steady training steps
   (wall time − its tokens ÷ its tokens/s: start-up, model load, warm-up,
   teardown); the median over those runs;
3. else **unknown**, left out of the totals, and counted.

Device-hours are the wall time × the GPU count (on the CPU, the process
count: process-hours). In steady-state mode (``measure: {until: steady}``) the
step count is not known beforehand: a similar cell is scaled to the step cap,
so its figure is an upper bound.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from orchestrator.contract.columns import JOB_S, TOKENS_PER_SECOND, WALL_S
from orchestrator.results import history
from orchestrator.results.numbers import number

Basis = Literal["own", "similar", "none"]


class Planned(Protocol):
    """What the estimate reads of a planned experiment (``matrix.experiment.Experiment``)."""

    @property
    def experiment_id(self) -> str: ...
    @property
    def cell_id(self) -> str: ...
    @property
    def framework(self) -> str: ...
    @property
    def model_name_or_path(self) -> str: ...
    @property
    def device(self) -> str: ...
    @property
    def num_gpus(self) -> int: ...
    @property
    def effective_batch_size(self) -> int: ...
    @property
    def max_seq_len(self) -> int | None: ...
    @property
    def arguments(self) -> Mapping[str, Any]: ...


@dataclass(frozen=True)
class Estimated:
    """One experiment's estimate."""

    experiment_id: str
    basis: Basis
    #: the job's wall time, s (None: unknown)
    seconds: float | None = None
    #: wall time × GPUs (processes on the CPU), h
    device_hours: float | None = None
    #: how many earlier runs it rests on
    runs: int = 0
    #: an upper bound (steady-state mode scaled to its step cap)
    upper_bound: bool = False


@dataclass
class PlanEstimate:
    """Every experiment's estimate and their totals."""

    experiments: list[Estimated]
    history: Path
    #: ``gpu``, ``cpu`` or both: what a device-hour is here
    devices: set[str] = field(default_factory=set)

    def count(self, basis: Basis) -> int:
        return sum(1 for e in self.experiments if e.basis == basis)

    @property
    def device_hours(self) -> float:
        return sum(e.device_hours or 0.0 for e in self.experiments)

    @property
    def seconds(self) -> float:
        return sum(e.seconds or 0.0 for e in self.experiments)

    @property
    def unit(self) -> str:
        if self.devices == {"cpu"}:
            return "process-hours"
        return "GPU-hours" if self.devices <= {"gpu"} else "device-hours (GPU or CPU process)"

    def lines(self, usd_per_gpu_hour: float | None) -> list[str]:
        """What ``tunematrix plan`` prints."""
        n = len(self.experiments)
        known = n - self.count("none")
        if not known:
            return [
                f"estimate: unknown; no earlier ok run of these or similar cells in "
                f"{self.history}" + ("" if self.history.is_file() else " (no history there)")
            ]
        bound = any(e.upper_bound for e in self.experiments)
        text = (
            f"estimate: {_hours(self.device_hours)} {self.unit} for {known} of {n} "
            f"experiment(s) ({_duration(self.seconds)} of jobs one after another)"
            + (", at most (steady-state cells scaled to their step cap)" if bound else "")
        )
        if usd_per_gpu_hour is not None:
            cost = self.device_hours * usd_per_gpu_hour
            text += f"; ${cost:,.2f} at ${usd_per_gpu_hour:g} per GPU-hour" + (
                " (applied to process-hours)" if self.devices == {"cpu"} else ""
            )
        lines = [
            text,
            f"  based on: {self.count('own')} experiment(s) from their own earlier runs, "
            f"{self.count('similar')} from similar cells (same model, device, "
            f"{'process' if self.devices == {'cpu'} else 'GPU'} count and "
            f"framework), {self.count('none')} with no history ({self.history})",
        ]
        if self.count("none"):
            lines.append(
                f"  the totals leave out the {self.count('none')} experiment(s) with no "
                "history: the whole matrix costs more"
            )
        return lines


def _number(value: Any) -> float | None:
    """A finite number, else None."""
    found = number(value)
    return found if found is not None and math.isfinite(found) else None


def _wall(row: Mapping[str, Any]) -> float | None:
    """A run's wall time: the experiment's start to its cleanup, else the job's."""
    for name in (WALL_S, JOB_S):
        value = _number(row.get(name))
        if value is not None and value > 0:
            return value
    return None


def _steps(experiment: Planned) -> tuple[int | None, bool]:
    """The steps it will run, and whether that is only a cap (steady-state mode)."""
    measure = getattr(experiment, "measure", None)
    cap = getattr(measure, "max_steps", None)
    if isinstance(cap, int) and cap > 0:
        return cap, True
    steps = _number(experiment.arguments.get("max_steps"))
    return (int(steps), False) if steps is not None and steps > 0 else (None, False)


def _real_share(row: Mapping[str, Any]) -> float:
    """The share of its batch × sequence slots a run filled with real tokens (1 packed)."""
    tokens = _number(row.get("tokens_total"))
    steps = _number(row.get("steps"))
    batch = _number(row.get("effective_batch_size"))
    seq = _number(row.get("max_seq_len"))
    if not (tokens and steps and batch and seq):
        return 1.0
    return min(1.0, tokens / (steps * batch * seq))


def _scaled(row: Mapping[str, Any], tokens: float) -> float | None:
    """A similar run's time for ``tokens`` slots: its time outside the steady steps plus
    the tokens (at its share of real ones) at its measured tokens/s."""
    wall = _wall(row)
    tps = _number(row.get(TOKENS_PER_SECOND))
    done = _number(row.get("tokens_total"))
    if wall is None or not tps or tps <= 0 or not done or done <= 0:
        return None
    overhead = max(0.0, wall - done / tps)
    return overhead + tokens * _real_share(row) / tps


def _similar(row: Mapping[str, Any], experiment: Planned) -> bool:
    return (
        str(row.get("model_name_or_path")) == experiment.model_name_or_path
        and str(row.get("device")) == experiment.device
        and str(row.get("framework_config")) == experiment.framework
        and _number(row.get("num_gpus")) == experiment.num_gpus
    )


def estimate_one(experiment: Planned, rows: Sequence[Mapping[str, Any]]) -> Estimated:
    """One experiment's estimate from the ok ``rows`` on record."""
    own = [w for r in rows if str(r.get("cell_id")) == experiment.cell_id if (w := _wall(r))]
    gpus = experiment.num_gpus
    if own:
        seconds = statistics.median(own)
        return Estimated(
            experiment.experiment_id, "own", seconds, seconds * gpus / 3600, runs=len(own)
        )
    steps, bounded = _steps(experiment)
    if steps is None or not experiment.max_seq_len:
        return Estimated(experiment.experiment_id, "none")
    tokens = float(steps * experiment.effective_batch_size * experiment.max_seq_len)
    scaled = [s for r in rows if _similar(r, experiment) if (s := _scaled(r, tokens)) is not None]
    if not scaled:
        return Estimated(experiment.experiment_id, "none")
    seconds = statistics.median(scaled)
    return Estimated(
        experiment.experiment_id,
        "similar",
        seconds,
        seconds * gpus / 3600,
        runs=len(scaled),
        upper_bound=bounded,
    )


def estimate_plan(experiments: Iterable[Planned], db: Path) -> PlanEstimate:
    """Every planned experiment's estimate from the ok runs in the history ``db``."""
    rows = history.ok_rows(db)
    planned = list(experiments)
    return PlanEstimate(
        experiments=[estimate_one(e, rows) for e in planned],
        history=db,
        devices={e.device for e in planned},
    )


def _hours(value: float) -> str:
    return f"{value:.3g}" if value < 10 else f"{value:,.1f}"


def _duration(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.0f} s"
