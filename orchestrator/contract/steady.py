"""Steady-state measuring: stop a run once its mean step time is known to a precision.

A scenario's ``measure: {until: steady, precision: 0.02, min_steps: 10,
max_steps: 200}`` (or ``--until steady``) runs a cell until the 95% confidence
interval of its mean step time is within ``precision`` of the mean, rather than
for a fixed ``max_steps``. One module for the planner (which checks the
settings), the child (which decides when to stop) and the report and the
benchmark (which read the achieved precision), so they all use one formula.

The interval is a batch-means interval, which stays honest when consecutive
step times are correlated (a slow step tends to follow a slow step: clocks,
caches, a neighbour's load), where the textbook interval of independent
samples would be too narrow:

- the ``n`` measured step times (after the warm-up and any profiled steps) are
  cut into ``k = floor(sqrt(n))`` batches of ``m = floor(n / k)`` consecutive
  steps; the ``n - k·m`` oldest steps (those nearest the warm-up) are left out;
- with fewer than ``MIN_BATCHES`` batches (``n < 9``) there is no interval;
- the half-width is Student's t (0.975 quantile, ``k - 1`` degrees of freedom)
  times the standard deviation of the batch means over ``sqrt(k)``;
- the precision is the half-width over the mean of the batch means.

The stop is stricter than the precision it reports. Checking after every step
and stopping at the first interval narrow enough favours the steps whose few
batch means happen to agree (``benchmarks/bench_steady_rule.py`` simulates step
times with a 15% spread, independent or correlated step to step): stopping on
the 95% interval of 3 batches left the mean within ±precision of the true one
in 45–87% of the runs that stopped (5% when strongly correlated). So a run
stops at the first step where at least ``min_steps`` steps are measured, the
interval has at least ``MIN_STOP_BATCHES`` batches (25 measured steps), and the
**99%** batch-means interval (``STOP_QUANTILE``) is within ``precision``: then
81–98% of the runs that stopped (2 of the 5 that stopped at φ 0.5 and ±2%);
strongly correlated step times mostly run to the cap instead.
Otherwise it runs to ``max_steps``. The reported precision (``step_time_ci_pct``) stays the 95%
interval. No rule inside one run can foresee a later change of the machine's
speed: the interval assumes the step time is steady after the warm-up.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from orchestrator.contract.window import profile_problem, warmup_of

#: ``measure.until``: a fixed number of steps (``max_steps``, as ever) or steady state
Until = Literal["steps", "steady"]
UNTILS: tuple[Until, ...] = ("steps", "steady")

DEFAULT_PRECISION = 0.02
DEFAULT_MIN_STEPS = 10
DEFAULT_MAX_STEPS = 200
#: the fewest batches an interval is computed from (so at least 9 measured steps)
MIN_BATCHES = 3
#: the fewest batches a run may stop on (so at least 25 measured steps)
MIN_STOP_BATCHES = 5
#: the quantile of Student's t the stop's interval is taken at (a 99% interval): see
#: the module's text on why the stop is stricter than the 95% it reports
STOP_QUANTILE = 0.995
CONFIDENCE = 0.95

#: how a run ended, as its ``measure_stopped`` column says: the interval was within
#: the precision (``steady``), or the run reached its step cap (``max_steps``)
STOPPED_STEADY = "steady"
STOPPED_MAX_STEPS = "max_steps"


class SteadyMeasure(BaseModel):
    """``measure: {until: steady, ...}`` resolved: every setting has its value."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    until: Literal["steady"] = "steady"
    #: the 95% interval's half-width over the mean at which a run stops (0.02: ±2%)
    precision: float = Field(default=DEFAULT_PRECISION, gt=0, lt=1)
    #: measured steps (after the warm-up and any profile) before a run may stop
    min_steps: int = Field(default=DEFAULT_MIN_STEPS, ge=1)
    #: the step cap: the trainer's ``max_steps`` in this mode
    max_steps: int = Field(default=DEFAULT_MAX_STEPS, ge=1)

    def identity(self) -> dict[str, Any]:
        """What an experiment id hashes of it (every setting, defaults included)."""
        return self.model_dump(mode="json")

    def describe(self) -> str:
        return (
            f"until the 95% interval of the mean step time is within ±{self.precision:.1%} "
            f"(at least {self.min_steps} measured steps, at most {self.max_steps} steps)"
        )


# ---------------------------------------------------------------------------
# The interval
# ---------------------------------------------------------------------------

# Student's t, 0.975 quantile, for 1 to 30 degrees of freedom
_T975 = (
    12.7062, 4.3027, 3.1824, 2.7764, 2.5706, 2.4469, 2.3646, 2.3060, 2.2622, 2.2281,
    2.2010, 2.1788, 2.1604, 2.1448, 2.1314, 2.1199, 2.1098, 2.1009, 2.0930, 2.0860,
    2.0796, 2.0739, 2.0687, 2.0639, 2.0595, 2.0555, 2.0518, 2.0484, 2.0452, 2.0423,
)  # fmt: skip
_Z975 = 1.959963984540054
# Student's t, 0.995 quantile, for 1 to 30 degrees of freedom
_T995 = (
    63.657, 9.925, 5.841, 4.604, 4.032, 3.707, 3.499, 3.355, 3.250, 3.169,
    3.106, 3.055, 3.012, 2.977, 2.947, 2.921, 2.898, 2.878, 2.861, 2.845,
    2.831, 2.819, 2.807, 2.797, 2.787, 2.779, 2.771, 2.763, 2.756, 2.750,
)  # fmt: skip
_Z995 = 2.5758293035489004


def t975(df: int) -> float:
    """Student's t 0.975 quantile for ``df`` degrees of freedom (a table to 30, then the
    Cornish-Fisher expansion, within 1e-4)."""
    return t_quantile(0.975, df)


def t_quantile(p: float, df: int) -> float:
    """Student's t quantile ``p`` (0.975 or 0.995) for ``df`` degrees of freedom."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be at least 1, got {df}")
    table, z = {0.975: (_T975, _Z975), 0.995: (_T995, _Z995)}[p]
    if df <= len(table):
        return table[df - 1]
    g1 = (z**3 + z) / 4
    g2 = (5 * z**5 + 16 * z**3 + 3 * z) / 96
    g3 = (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384
    g4 = (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160
    return z + g1 / df + g2 / df**2 + g3 / df**3 + g4 / df**4


@dataclass(frozen=True)
class Interval:
    """A 95% confidence interval of a mean step time."""

    mean: float
    half_width: float
    #: the batches (or, for the naive interval, the samples) it was computed from
    batches: int
    batch_size: int

    @property
    def relative(self) -> float | None:
        """The half-width over the mean (0.02: ±2%); None for a mean of 0."""
        return self.half_width / self.mean if self.mean > 0 else None


def batch_means_interval(
    times: Sequence[float], quantile: float = 0.975, min_batches: int = MIN_BATCHES
) -> Interval | None:
    """The batch-means interval of the mean of ``times`` (see the module's text), 95%
    by default; None with fewer than ``min_batches`` batches."""
    n = len(times)
    k = math.isqrt(n)
    if k < min_batches:
        return None
    m = n // k
    used = times[n - k * m :]
    means = [statistics.fmean(used[i * m : (i + 1) * m]) for i in range(k)]
    mean = statistics.fmean(means)
    half = t_quantile(quantile, k - 1) * statistics.stdev(means) / math.sqrt(k)
    return Interval(mean, half, k, m)


def naive_interval(times: Sequence[float]) -> Interval | None:
    """The textbook interval, as if the step times were independent (for comparison:
    too narrow when they are correlated); None with fewer than two."""
    n = len(times)
    if n < 2:
        return None
    return Interval(
        statistics.fmean(times), t975(n - 1) * statistics.stdev(times) / math.sqrt(n), n, 1
    )


def precision_pct(times: Sequence[float]) -> float | None:
    """The achieved precision of a run's measured step times: the batch-means interval's
    half-width over the mean, in percent (the ``step_time_ci_pct`` column)."""
    interval = batch_means_interval(times)
    relative = interval.relative if interval is not None else None
    return 100 * relative if relative is not None else None


# ---------------------------------------------------------------------------
# The window and the stop
# ---------------------------------------------------------------------------


def window_start(steps: int, warmup: int | None, profile_end: int = 0) -> int:
    """The first measured step after ``steps`` steps: after the warm-up (the same rule as
    a fixed run of ``steps`` steps, ``orchestrator.contract.window``) and after the
    profiled steps (``profile_end``: the step after the last profiled one; 0 none)."""
    return max(warmup_of(steps, warmup), profile_end)


def settled(window: Sequence[float], settings: SteadyMeasure) -> bool:
    """Whether a run whose measured step times are ``window`` may stop now: the stricter
    stop interval (``STOP_QUANTILE``, ``MIN_STOP_BATCHES``) within the precision."""
    if len(window) < settings.min_steps:
        return False
    interval = batch_means_interval(window, STOP_QUANTILE, MIN_STOP_BATCHES)
    relative = interval.relative if interval is not None else None
    return relative is not None and relative <= settings.precision


def measure_problem(
    settings: SteadyMeasure, warmup: int | None, profile_steps: int = 0
) -> str | None:
    """Why a steady cell could never stop on its precision; None when it can.

    ``max_steps`` must leave ``min_steps`` measured steps after the warm-up and the
    profiled steps (and at least the ``MIN_STOP_BATCHES²`` a stop needs).
    """
    if settings.min_steps > settings.max_steps:
        return f"min_steps {settings.min_steps} is above max_steps {settings.max_steps}"
    problem = profile_problem(settings.max_steps, warmup, profile_steps)
    if problem is not None:
        return problem
    profiled_end = warmup_of(settings.max_steps, warmup) + profile_steps if profile_steps else 0
    left = settings.max_steps - window_start(settings.max_steps, warmup, profiled_end)
    needed = max(settings.min_steps, MIN_STOP_BATCHES**2)
    if left < needed:
        return (
            f"max_steps {settings.max_steps} leaves {left} measured steps after the warm-up"
            + (" and the profiled steps" if profile_steps else "")
            + f", fewer than the {needed} steady-state measuring needs"
            + (
                f" (min_steps {settings.min_steps})"
                if needed == settings.min_steps
                else f" (a stop needs {needed})"
            )
            + "; raise max_steps"
        )
    return None
