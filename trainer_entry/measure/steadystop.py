"""Steady-state stopping in the child: stop training once the mean step time is known.

With a spec's ``measure`` (``orchestrator.contract.steady.SteadyMeasure``), the
measurement hooks hand ``SteadyStop`` each optimizer step's time as it ends.
It keeps the step times of the slowest rank (one all-reduce of one float per
step, the same series the result's step-time figures use), and after each
step computes the batch-means interval over the measured window: the steps
after the warm-up (the fixed rule applied to the steps run so far, so the
window is exactly the one the result measures) and after any profiled steps.
Once at least ``min_steps`` steps are measured and the interval's half-width
is within ``precision`` of the mean, it tells the trainer to stop
(``control.should_training_stop``), which ends training after this step: the
tokens, the loss log and the window all end at the same step.

Every rank computes the decision from the same all-reduced numbers with the
same code, so every rank stops at the same step; no rank can wait in a
collective that another has left.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from orchestrator.contract.steady import (
    STOPPED_MAX_STEPS,
    STOPPED_STEADY,
    SteadyMeasure,
    settled,
    window_start,
)

if TYPE_CHECKING:
    from orchestrator.contract.spec import RunSpec
    from trainer_entry.measure.profile import StepProfiler


class SteadyStop:
    """Decides, at each step end, whether the run has reached steady state.

    ``share``: the slowest rank's value of a float (an all-reduce; None alone);
    ``profile_end``: the step after the last profiled one, once known (0: none).
    """

    def __init__(
        self,
        settings: SteadyMeasure,
        *,
        warmup: int | None,
        share: Callable[[float], float] | None = None,
        profile_end: Callable[[], int] | None = None,
    ) -> None:
        self.settings = settings
        self.warmup = warmup
        self._share = share
        self._profile_end = profile_end or (lambda: 0)
        #: every step's time, the slowest rank's
        self.times: list[float] = []
        #: the step count at which the interval was within the precision (None: never)
        self.stopped_at: int | None = None

    def step_ended(self, step_time: float) -> bool:
        """This rank's time of the step that just ended; whether training stops now."""
        self.times.append(self._share(step_time) if self._share is not None else step_time)
        if self.stopped_at is not None:
            # a trainer that did not stop when told: keep saying so
            return True
        steps = len(self.times)
        start = window_start(steps, self.warmup, self._profile_end())
        if settled(self.times[start:], self.settings):
            self.stopped_at = steps
            return True
        return False


def slowest_rank(on_gpu: bool) -> Callable[[float], float] | None:
    """An all-reduce (max) of one float over every rank; None in a single process.

    The float is a float64 on the device the process group's backend talks to
    (NCCL: this rank's GPU), so the ranks get bit-identical values back.
    """
    import torch
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized() or dist.get_world_size() == 1:
        return None
    device = (
        torch.device("cuda", torch.cuda.current_device())
        if on_gpu and dist.get_backend() == "nccl"
        else torch.device("cpu")
    )
    buffer = torch.zeros(1, dtype=torch.float64, device=device)

    def share(value: float) -> float:
        buffer.fill_(value)
        dist.all_reduce(buffer, op=dist.ReduceOp.MAX)
        return float(buffer.item())

    return share


class _LazyShare:
    """``slowest_rank`` made at the first step, when the process group exists for sure."""

    def __init__(self, on_gpu: bool) -> None:
        self.on_gpu = on_gpu
        self._share: Callable[[float], float] | None = None
        self._made = False

    def __call__(self, value: float) -> float:
        if not self._made:
            self._share, self._made = slowest_rank(self.on_gpu), True
        return self._share(value) if self._share is not None else value


def steady_stop(
    spec: RunSpec, warmup: int | None, profiler: StepProfiler | None, *, on_gpu: bool
) -> SteadyStop | None:
    """The run's ``SteadyStop``; None unless the spec measures until steady state."""
    if spec.measure is None:
        return None

    def profile_end() -> int:
        if profiler is None or profiler.first is None:
            return 0
        return profiler.first + profiler.steps

    return SteadyStop(
        spec.measure, warmup=warmup, share=_LazyShare(on_gpu), profile_end=profile_end
    )


def with_step_cap(spec: RunSpec) -> RunSpec:
    """The spec whose trainer trains at most ``measure.max_steps`` steps in steady mode."""
    if spec.measure is None or spec.arguments.get("max_steps") == spec.measure.max_steps:
        return spec
    return spec.model_copy(
        update={"arguments": {**spec.arguments, "max_steps": spec.measure.max_steps}}
    )


def measure_figures(
    spec: RunSpec, steady: SteadyStop | None, metrics: Mapping[str, Any]
) -> tuple[dict[str, Any], list[str]]:
    """The result's ``measure_until`` and ``measure_stopped`` (``step_time_ci_pct`` comes
    with the step-time figures), and a note for a steady run that never settled.

    ``measure_stopped`` is ``steady`` where the run stopped on its precision, and
    ``max_steps`` where it ran to its step cap; None where it ended otherwise (the
    data ran out first, or no step was timed).
    """
    steps = metrics.get("steps") or 0
    cap = spec.measure.max_steps if spec.measure is not None else spec.arguments.get("max_steps")
    stopped: str | None = None
    if steady is not None and steady.stopped_at is not None and steady.stopped_at == steps:
        stopped = STOPPED_STEADY
    elif isinstance(cap, int) and steps and steps >= cap:
        stopped = STOPPED_MAX_STEPS
    figures = {
        "measure_until": "steady" if spec.measure is not None else "steps",
        "measure_stopped": stopped,
    }
    notes: list[str] = []
    if spec.measure is not None and stopped != STOPPED_STEADY:
        achieved = metrics.get("step_time_ci_pct")
        reached = (
            f"the 95% interval of the mean step time was ±{achieved:.1f}%"
            if isinstance(achieved, (int, float))
            else "too few steps were measured for an interval"
        )
        notes.append(
            f"did not settle: after {steps} steps ({metrics.get('steps_measured') or 0} "
            f"measured) {reached}, not within the ±{100 * spec.measure.precision:g}% asked; "
            + (
                f"stopped at max_steps {cap}"
                if stopped == STOPPED_MAX_STEPS
                else "training ended before max_steps"
            )
        )
    return figures, notes
