"""The measurement arithmetic, checked against figures computed by hand."""

from __future__ import annotations

import pytest

from orchestrator.contract.window import default_warmup
from trainer_entry.measure.memory import hf_stage_memory
from trainer_entry.measure.steps import (
    RankStats,
    SequenceLengths,
    StepRecorder,
    fed_sequences,
    loss_summary,
    summarize,
)


def test_default_warmup() -> None:
    assert default_warmup(20) == 3  # max(3, 2)
    assert default_warmup(100) == 10  # max(3, 10)
    assert default_warmup(45) == 5  # ceil(4.5)
    assert default_warmup(3) == 2  # at least one step stays measured
    assert default_warmup(1) == 0


def test_summarize_single_rank_by_hand() -> None:
    rank = RankStats(
        rank=0,
        step_times_s=[5.0, 1.0, 1.0, 2.0, 1.0, 1.0],
        step_tokens=[100, 100, 100, 100, 100, 100],
        step_padded_tokens=[120, 120, 120, 120, 120, 120],
    )
    m = summarize([rank], warmup=2)
    assert m["steps"] == 6 and m["steps_measured"] == 4 and m["warmup_steps_excluded"] == 2
    # 400 tokens over 5 s: a total over a total, not a total over a mean step
    assert m["tokens_per_second_global"] == pytest.approx(80.0)
    assert m["tokens_per_second_per_device"] == pytest.approx(80.0)
    assert m["step_time_median_s"] == pytest.approx(1.0)
    assert m["step_time_mean_s"] == pytest.approx(1.25)
    # sample std (n - 1) of [1, 2, 1, 1] is sqrt(0.75 / 3) = 0.5; the population's would be
    # sqrt(0.1875), 13% lower for 4 steps
    assert m["step_time_cv"] == pytest.approx(0.5 / 1.25)
    assert m["tokens_measured"] == 400 and m["tokens_total"] == 600
    assert m["padded_tokens_total"] == 720
    assert m["padding_fraction"] == pytest.approx(1 - 400 / 480)


def test_summarize_two_ranks_uses_the_slowest_window() -> None:
    r0 = RankStats(
        0, step_times_s=[9.0, 1.0, 1.0], step_tokens=[0, 50, 50], step_padded_tokens=[0, 64, 64]
    )
    r1 = RankStats(
        1, step_times_s=[9.0, 1.5, 1.5], step_tokens=[0, 70, 30], step_padded_tokens=[0, 80, 40]
    )
    m = summarize([r0, r1], warmup=1)
    # (100 + 100) tokens over the slower rank's 3 s
    assert m["tokens_per_second_global"] == pytest.approx(200 / 3.0)
    assert m["tokens_per_second_per_device"] == pytest.approx(100 / 3.0)
    assert m["step_time_median_s"] == pytest.approx(1.5)
    assert m["step_time_cv"] == pytest.approx(0.0)


def test_summarize_default_warmup_and_empty() -> None:
    rank = RankStats(
        0, step_times_s=[1.0] * 20, step_tokens=[10] * 20, step_padded_tokens=[10] * 20
    )
    m = summarize([rank])
    assert m["warmup_steps_excluded"] == 3 and m["steps_measured"] == 17
    assert summarize([RankStats(0)]) == {"steps": 0, "profiled_steps": None}


def test_recorder_partitions_time_and_counts_micro_batches() -> None:
    ticks = iter([10.0, 11.0, 11.5, 13.0])
    recorder = StepRecorder(rank=0, clock=lambda: next(ticks))
    recorder.train_begin()
    recorder.add_batch(10, 16)
    recorder.add_batch(12, 16)
    recorder.step_end()
    recorder.add_batch(7, 8)
    recorder.step_end()
    recorder.step_end()
    s = recorder.stats
    assert s.step_times_s == [1.0, 0.5, 1.5]
    assert s.step_tokens == [22, 7, 0]
    assert s.step_padded_tokens == [32, 8, 0]
    assert s.first_step_s == 1.0


def test_recorder_keeps_the_lengths_fed_for_attention() -> None:
    ticks = iter([0.0, 1.0, 2.0, 3.0])
    recorder = StepRecorder(rank=0, clock=lambda: next(ticks))
    recorder.windows = (16,)
    recorder.train_begin()
    recorder.add_batch(40, 80, [30, 10])
    recorder.add_batch(20, 20, [20])
    recorder.step_end()
    recorder.add_batch(5, 8, [5])  # a short last micro-batch: one row
    recorder.step_end()
    recorder.add_batch(3, 4)  # a batch without lengths counts tokens only
    recorder.step_end()
    s = recorder.stats
    assert s.step_rows == [3, 1, 0]
    assert s.step_sq_tokens == [900 + 100 + 400, 25, 0]
    assert s.step_windowed_sq_tokens == {16: [30 * 16 + 10 * 10 + 20 * 16, 25, 0]}


def test_fed_sequences_sums_the_measured_steps_of_every_rank() -> None:
    r0 = RankStats(0, step_tokens=[64, 60, 5], step_rows=[2, 2, 1], step_sq_tokens=[2048, 1800, 25])
    r0.step_windowed_sq_tokens = {16: [1024, 960, 25]}
    r1 = RankStats(1, step_tokens=[64, 40, 0], step_rows=[2, 2, 0], step_sq_tokens=[2048, 800, 0])
    r1.step_windowed_sq_tokens = {16: [1024, 640, 0]}
    fed = fed_sequences([r0, r1], 1, 3)
    assert fed is not None
    assert (fed.rows, fed.tokens, fed.sq_tokens) == (5, 105, 2625)
    assert fed.attention_length(None) == pytest.approx(2625 / 105)  # Σr² / Σr
    assert fed.attention_length(16) == pytest.approx((960 + 25 + 640) / 105)
    with pytest.raises(KeyError, match="sliding window 8"):
        fed.attention_length(8)
    assert fed_sequences([RankStats(0, step_tokens=[5], step_rows=[0])], 0, 1) is None
    uniform = SequenceLengths.uniform(64)
    assert uniform.attention_length(None) == 64 and uniform.attention_length(16) == 16


def test_loss_summary() -> None:
    history = [{"step": i, "loss": float(20 - i)} for i in range(1, 21)] + [{"train_runtime": 3.0}]
    s = loss_summary(history)
    assert s["loss_first"] == 19.0 and s["loss_last"] == 0.0
    assert s["loss_mean_last10pct"] == pytest.approx((1.0 + 0.0) / 2)  # last 2 of 20
    assert loss_summary([])["loss_first"] is None


def test_hf_stage_memory_follows_the_predecessor() -> None:
    metrics = {
        "before_init_mem_gpu": 1000,
        "init_mem_gpu_alloc_delta": 500,
        "init_mem_gpu_peaked_delta": 50,
        "train_mem_gpu_alloc_delta": 200,
        "train_mem_gpu_peaked_delta": 3000,
        "train_mem_cpu_alloc_delta": 7,
    }
    peak, alloc = hf_stage_memory(metrics)
    # running sums 1000, 1500, 1700; peaks 1000, 1550, 4700
    assert (peak, alloc) == (4700, 1700)
    assert hf_stage_memory({"train_mem_cpu_alloc_delta": 1}) == (None, None)
