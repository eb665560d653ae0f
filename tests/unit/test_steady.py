"""Steady-state measuring: the batch-means interval, the stop decision, the result's figures."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from types import SimpleNamespace

import pytest

from orchestrator.contract.spec import RunSpec
from orchestrator.contract.steady import (
    MIN_BATCHES,
    MIN_STOP_BATCHES,
    STOP_QUANTILE,
    SteadyMeasure,
    batch_means_interval,
    measure_problem,
    naive_interval,
    precision_pct,
    settled,
    t975,
    t_quantile,
    window_start,
)
from trainer_entry.measure.hooks import StepHooks
from trainer_entry.measure.steadystop import SteadyStop, measure_figures, steady_stop, with_step_cap
from trainer_entry.measure.steps import StepRecorder, summarize


def _iid(n: int, seed: int, mean: float = 1.0, sd: float = 0.05) -> list[float]:
    rng = random.Random(seed)
    return [rng.gauss(mean, sd) for _ in range(n)]


def _ar1(n: int, seed: int, phi: float = 0.9, mean: float = 1.0, sd: float = 0.05) -> list[float]:
    """Autocorrelated step times: each deviation carries ``phi`` of the last one."""
    rng = random.Random(seed)
    x, out = rng.gauss(0, sd / math.sqrt(1 - phi * phi)), []
    for _ in range(n):
        x = phi * x + rng.gauss(0, sd)
        out.append(mean + x)
    return out


# ---------------------------------------------------------------------------
# Student's t and the interval
# ---------------------------------------------------------------------------


def _t_tail(q: float, df: int, n: int = 20000) -> float:
    """P(T > q) by the midpoint rule on x = q + u/(1-u)."""
    c = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)
    total = 0.0
    for i in range(n):
        u = (i + 0.5) / n
        x = q + u / (1 - u)
        total += c * (1 + x * x / df) ** (-(df + 1) / 2) / (1 - u) ** 2
    return total / n


@pytest.mark.parametrize("df", [1, 2, 4, 9, 30, 31, 60, 500])
def test_t_quantile_leaves_2_5_percent_above_it(df: int) -> None:
    assert _t_tail(t975(df), df) == pytest.approx(0.025, abs=2e-5)
    # the stop's quantile, from its table (to 3 decimals) and the expansion beyond
    assert _t_tail(t_quantile(0.995, df), df) == pytest.approx(0.005, abs=2e-5)


def test_interval_of_a_known_series() -> None:
    # 9 steps: 3 batches of 3 with means 2, 5, 8 -> sd 3, half-width t(2)·3/√3
    interval = batch_means_interval([1, 2, 3, 4, 5, 6, 7, 8, 9])
    assert interval is not None
    assert (interval.batches, interval.batch_size) == (3, 3)
    assert interval.mean == 5
    assert interval.half_width == pytest.approx(4.3027 * 3 / math.sqrt(3))
    assert interval.relative == pytest.approx(4.3027 * 3 / math.sqrt(3) / 5)


def test_the_oldest_steps_are_left_out_when_batches_do_not_divide() -> None:
    # 11 steps -> 3 batches of 3: the first two (nearest the warm-up) are not used
    interval = batch_means_interval([100.0, 100.0, *range(1, 10)])
    assert interval is not None and interval.mean == 5


def test_no_interval_under_three_batches() -> None:
    assert MIN_BATCHES**2 == 9
    assert batch_means_interval([1.0] * 8) is None
    assert precision_pct([1.0] * 8) is None
    assert precision_pct([1.0] * 9) == 0


def test_iid_noise_converges_and_the_interval_covers_the_mean() -> None:
    times = _iid(400, seed=1)
    widths = [batch_means_interval(times[:n]).relative for n in (16, 64, 144, 400)]  # type: ignore[union-attr]
    assert widths == sorted(widths, reverse=True)
    assert widths[-1] < 0.01
    # ±2% of a 5% noise is reached well before 200 steps
    assert any(settled(times[:n], SteadyMeasure()) for n in range(10, 200))
    # a 95% interval covers the true mean about 95% of the time
    covered = 0
    for seed in range(300):
        interval = batch_means_interval(_iid(100, seed=1000 + seed))
        assert interval is not None
        covered += abs(interval.mean - 1.0) <= interval.half_width
    assert 0.88 <= covered / 300 <= 0.995


def test_a_trending_series_does_not_settle() -> None:
    # step times that keep growing (a machine warming up, a leak): never steady
    times = [1.0 + 0.01 * i for i in range(200)]
    settings = SteadyMeasure(precision=0.02, min_steps=10, max_steps=200)
    assert not any(
        settled(times[window_start(n, None) : n], settings) for n in range(1, len(times) + 1)
    )


def test_autocorrelation_widens_the_interval_over_the_naive_one() -> None:
    wider = 0
    batch_covered = naive_covered = 0
    for seed in range(200):
        times = _ar1(196, seed=seed)
        batch, naive = batch_means_interval(times), naive_interval(times)
        assert batch is not None and naive is not None
        wider += batch.half_width > naive.half_width
        batch_covered += abs(batch.mean - 1.0) <= batch.half_width
        naive_covered += abs(naive.mean - 1.0) <= naive.half_width
    # the naive interval ignores the correlation: too narrow, it misses the mean often
    assert wider / 200 > 0.9
    assert naive_covered / 200 < 0.7
    assert batch_covered / 200 > naive_covered / 200 + 0.15


# ---------------------------------------------------------------------------
# The stop decision
# ---------------------------------------------------------------------------


def test_no_stop_before_min_steps_even_when_precise() -> None:
    settings = SteadyMeasure(precision=0.5, min_steps=30, max_steps=100)
    assert not settled([1.0] * 29, settings)
    assert settled([1.0] * 30, settings)


def test_no_stop_on_fewer_than_five_batches_even_when_precise() -> None:
    # 24 measured steps make 4 batches: enough for the reported interval, not for a stop
    settings = SteadyMeasure(precision=0.5, min_steps=1, max_steps=100)
    assert MIN_STOP_BATCHES == 5 and batch_means_interval([1.0] * 24) is not None
    assert not settled([1.0] * 24, settings)
    assert settled([1.0] * 25, settings)


def test_the_stop_takes_the_99_percent_interval() -> None:
    # a window whose 95% interval is within the precision but whose 99% one is not
    times = _iid(100, seed=3, sd=0.2)
    wide = batch_means_interval(times, STOP_QUANTILE, MIN_STOP_BATCHES)
    narrow = batch_means_interval(times)
    assert wide is not None and narrow is not None
    assert wide.relative is not None and narrow.relative is not None
    between = (wide.relative + narrow.relative) / 2
    assert not settled(times, SteadyMeasure(precision=between, min_steps=10))
    assert settled(times, SteadyMeasure(precision=wide.relative * 1.001, min_steps=10))


def test_a_flat_run_stops_once_min_steps_are_measured_after_the_warm_up() -> None:
    stop = SteadyStop(SteadyMeasure(min_steps=30), warmup=None)
    ended = [stop.step_ended(1.0) for _ in range(50)]
    # 34 steps: the warm-up of a 34-step run is 4, which leaves 30 measured
    assert ended.index(True) == 33 and stop.stopped_at == 34
    assert window_start(34, None) == 4
    # a trainer that went on is told again
    assert all(ended[33:])


def test_profiled_steps_delay_the_window() -> None:
    stop = SteadyStop(SteadyMeasure(min_steps=10), warmup=2, profile_end=lambda: 20)
    ended = [stop.step_ended(1.0) for _ in range(60)]
    # a stop needs 25 measured steps: 20 + 25
    assert stop.stopped_at == 45 and ended.index(True) == 44


def test_every_rank_stops_at_the_same_step() -> None:
    # two ranks with their own noise; each decides from the slowest rank's times, as the
    # all-reduce gives them, so both stop after the same step
    ranks = [_iid(200, seed=7, sd=0.1), _iid(200, seed=8, sd=0.1)]
    step = [0, 0]

    def share_for(rank: int) -> Callable[[float], float]:
        def share(value: float) -> float:
            assert value == ranks[rank][step[rank]]
            slowest = max(r[step[rank]] for r in ranks)
            step[rank] += 1
            return slowest

        return share

    settings = SteadyMeasure(precision=0.05, min_steps=10, max_steps=200)
    stops = [SteadyStop(settings, warmup=None, share=share_for(r)) for r in (0, 1)]
    for i in range(200):
        decisions = {stops[r].step_ended(ranks[r][i]) for r in (0, 1)}
        assert len(decisions) == 1
        if decisions == {True}:
            break
    assert stops[0].stopped_at == stops[1].stopped_at is not None
    assert stops[0].times == [max(a, b) for a, b in zip(*ranks, strict=True)][: i + 1]


def test_the_hooks_tell_the_trainer_to_stop() -> None:
    clock = iter(float(i) for i in range(100))
    recorder = StepRecorder(0, clock=lambda: next(clock))
    hooks = StepHooks(recorder, steady=SteadyStop(SteadyMeasure(min_steps=10), warmup=None))
    hooks.train_begin(200)
    ended = [hooks.step_end(step) for step in range(1, 40)]
    # 28 steps: the warm-up 3 leaves the 25 measured steps a stop needs
    assert ended.index(True) == 27

    from trainer_entry.backends.hf import MeasureCallback

    clock2 = iter(float(i) for i in range(100))
    hooks = StepHooks(
        StepRecorder(0, clock=lambda: next(clock2)),
        steady=SteadyStop(SteadyMeasure(min_steps=10), warmup=None),
    )
    callback = MeasureCallback(hooks)
    state = SimpleNamespace(max_steps=200, global_step=0)
    control = SimpleNamespace(should_training_stop=False)
    callback.on_train_begin(None, state, control)
    for step in range(1, 29):
        state.global_step = step
        callback.on_step_end(None, state, control)
        assert control.should_training_stop == (step == 28)


def test_no_steady_stop_without_measure() -> None:
    assert steady_stop(RunSpec(), None, None, on_gpu=False) is None
    spec = RunSpec(measure=SteadyMeasure(), arguments={"max_steps": 20})
    assert isinstance(steady_stop(spec, None, None, on_gpu=False), SteadyStop)
    assert with_step_cap(spec).arguments["max_steps"] == 200
    assert with_step_cap(RunSpec(arguments={"max_steps": 20})).arguments["max_steps"] == 20


# ---------------------------------------------------------------------------
# The result's figures
# ---------------------------------------------------------------------------


def _metrics(steps: int, times: list[float]) -> dict[str, object]:
    from trainer_entry.measure.steps import RankStats

    rank = RankStats(rank=0, step_times_s=times, step_tokens=[10] * steps)
    return summarize([rank])


def test_a_steady_run_reports_how_it_stopped() -> None:
    settings = SteadyMeasure(precision=0.5, min_steps=10, max_steps=50)
    stop = SteadyStop(settings, warmup=None)
    times = _iid(50, seed=3)
    n = next(i + 1 for i, t in enumerate(times) if stop.step_ended(t))
    metrics = _metrics(n, times[:n])
    figures, notes = measure_figures(RunSpec(measure=settings), stop, metrics)
    assert figures == {"measure_until": "steady", "measure_stopped": "steady"}
    assert notes == []
    # the result's precision is the one the stop decided on, over the same window
    assert metrics["step_time_ci_pct"] <= 50
    start = window_start(n, None)
    assert metrics["step_time_ci_pct"] == pytest.approx(precision_pct(stop.times[start:]))


def test_a_run_that_never_settles_says_so() -> None:
    settings = SteadyMeasure(precision=0.001, min_steps=3, max_steps=12)
    stop = SteadyStop(settings, warmup=None)
    times = _iid(12, seed=4)
    assert not any(stop.step_ended(t) for t in times)
    metrics = _metrics(12, times)
    figures, notes = measure_figures(RunSpec(measure=settings), stop, metrics)
    assert figures == {"measure_until": "steady", "measure_stopped": "max_steps"}
    (note,) = notes
    assert note.startswith("did not settle: after 12 steps (9 measured) the 95% interval")
    assert "not within the ±0.1% asked; stopped at max_steps 12" in note


def test_a_fixed_run_reports_its_mode_and_precision() -> None:
    times = _iid(20, seed=5)
    metrics = _metrics(20, times)
    spec = RunSpec(arguments={"max_steps": 20})
    assert measure_figures(spec, None, metrics) == (
        {"measure_until": "steps", "measure_stopped": "max_steps"},
        [],
    )
    assert metrics["step_time_ci_pct"] == pytest.approx(precision_pct(times[3:]))
    # ended before its max_steps (the data ran out): neither
    short = RunSpec(arguments={"max_steps": 40})
    assert measure_figures(short, None, metrics)[0]["measure_stopped"] is None
    # too few measured steps for an interval: no figure
    assert _metrics(6, times[:6])["step_time_ci_pct"] is None


# ---------------------------------------------------------------------------
# What the planner refuses
# ---------------------------------------------------------------------------


def test_settings_that_could_never_stop_are_refused() -> None:
    assert measure_problem(SteadyMeasure(), None) is None
    assert "min_steps 30 is above max_steps 20" in str(
        measure_problem(SteadyMeasure(min_steps=30, max_steps=20), None)
    )
    # 40 steps: warm-up 4 leaves 36 measured, fewer than min_steps 38
    problem = measure_problem(SteadyMeasure(min_steps=38, max_steps=40), None)
    assert problem is not None and "leaves 36 measured steps" in problem
    # a profile after the warm-up leaves no measured step at all
    problem = measure_problem(SteadyMeasure(min_steps=1, max_steps=6), None, profile_steps=3)
    assert problem is not None and "no measured step" in problem
    problem = measure_problem(SteadyMeasure(min_steps=10, max_steps=30), None, profile_steps=3)
    assert problem is not None and "and the profiled steps" in problem
    # a stop needs 25 measured steps whatever min_steps says
    problem = measure_problem(SteadyMeasure(min_steps=2, max_steps=27), None)
    assert problem is not None and "a stop needs 25" in problem
    assert measure_problem(SteadyMeasure(min_steps=2, max_steps=28), None) is None


def test_the_settings_are_strict() -> None:
    with pytest.raises(ValueError):
        SteadyMeasure(precision=0)
    with pytest.raises(ValueError):
        SteadyMeasure(precision=1.5)
    with pytest.raises(ValueError):
        SteadyMeasure(min_steps=0)
    with pytest.raises(ValueError):
        SteadyMeasure(max_steps="200")  # type: ignore[arg-type]
