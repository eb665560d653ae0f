"""The steps a run measures: the warm-up, the profiled steps, then the measured window.

Shared by the planner, which refuses a run too short to leave a measured step
after its warm-up and profile, and the child, which measures throughput over
the window (``trainer_entry.measure.steps.measured_window``). One formula on both
sides, so the plan and the result agree on which steps are measured.
"""

from __future__ import annotations

import math

#: steps a profiled run records with torch.profiler, after its warm-up
DEFAULT_PROFILE_STEPS = 3
#: the name of the measured steps' span of time, where a row's utilisation and energy
#: figures cover it (``orchestrator.job.utilisation``, read by the report)
WINDOW_MEASURED = "measured"


def default_warmup(steps: int) -> int:
    """max(3, 10% of the steps), always leaving at least one step measured."""
    return max(0, min(max(3, math.ceil(0.1 * steps)), steps - 1))


def warmup_of(steps: int, warmup: int | None) -> int:
    """The warm-up of a run of ``steps`` steps: ``warmup`` if given (capped to leave a
    step), else the default."""
    return default_warmup(steps) if warmup is None else max(0, min(warmup, steps - 1))


def profile_problem(max_steps: int, warmup: int | None, profile_steps: int) -> str | None:
    """Why a profiled run of ``max_steps`` steps would measure nothing; None when it can.

    The profiled steps follow the warm-up and are left out of the window, so a
    run needs more steps than both together.
    """
    if profile_steps <= 0 or max_steps <= 0:
        return None
    w = warmup_of(max_steps, warmup)
    if w + profile_steps < max_steps:
        return None
    return (
        f"max_steps {max_steps} leaves no measured step after the warm-up ({w} steps) "
        f"and the profiled steps ({profile_steps}); raise max_steps above "
        f"{w + profile_steps}, or lower warmup_steps_excluded or profile_steps"
    )
