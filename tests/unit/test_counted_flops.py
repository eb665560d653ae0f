"""Counted FLOPs (``trainer_entry.measure.counted``): the fit, the recorded sums, the figures.

The fit is checked on FLOPs made by hand from known coefficients, a law it
cannot fit is refused, the step recorder's sums and counts are checked by hand,
and on the causal LM (one length) the counted figure is held to the analytic
formula, which the FLOPs architecture tests hold to PyTorch's counter.
"""

from __future__ import annotations

import pytest
import torch

from trainer_entry.measure import counted
from trainer_entry.measure.counted import (
    PER_SAMPLE,
    CountedFlops,
    _solve,
    count_flops,
    monomials,
    probe_lengths,
)
from trainer_entry.measure.flops import FlopsUnavailable, estimate_flops
from trainer_entry.measure.steps import (
    RankStats,
    StepRecorder,
    length_moments,
    summarize,
)
from trainer_entry.tasks.causal_lm import CausalLMTask


def test_the_probes_fit_every_term_and_one_more() -> None:
    for typical in ({"tokens": 100.0}, {"source": 40.0, "target": 9.0}, {"a": 5, "b": 6, "c": 7}):
        points = probe_lengths(typical)
        keys = monomials(list(typical))
        assert len(points) > len(keys)
        # never longer than the run's mean, never empty
        assert all(0 < p[d] <= max(4, round(typical[d])) for p in points for d in typical)
        a = torch.tensor([[counted._terms(p)[k] for k in keys] for p in points])
        assert torch.linalg.matrix_rank(a.double()) == len(keys)


def test_the_fit_recovers_coefficients_made_by_hand() -> None:
    truth = {PER_SAMPLE: 7e6, "source": 3e5, "target": 5e5}
    truth.update({"source*source": 1e3, "source*target": 2e3, "target*target": 1.5e3})
    points = probe_lengths({"source": 60, "target": 20})
    flops = [
        CountedFlops.total(truth, 1, length_moments({d: [n] for d, n in p.items()})) for p in points
    ]
    fitted, miss = _solve(points, flops, monomials(["source", "target"]))
    assert miss < 1e-9
    assert fitted == pytest.approx(truth, rel=1e-6)


def test_a_law_of_another_degree_is_refused() -> None:
    def cubic(lengths):
        n = lengths["tokens"]
        return {"x": torch.zeros((n, n, n), device="meta")}

    class Cubed(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.config = None
            self.w = torch.nn.Parameter(torch.ones(1))

        def forward(self, x):
            # FLOPs n³ (a matrix product of n×n by n×n): no polynomial of degree two
            m = x[0] * self.w
            return {"loss": (m @ m).sum()}

    model = Cubed()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(counted, "meta_clone", lambda m, **_: m.to("meta"))
        with pytest.raises(FlopsUnavailable, match="polynomial of degree two"):
            count_flops(model, cubic, {"tokens": 40}, checkpointing=False)


def test_the_recorder_keeps_the_counts_and_the_length_sums() -> None:
    ticks = iter([0.0, 1.0, 2.0, 4.0])
    recorder = StepRecorder(rank=0, clock=lambda: next(ticks))
    recorder.train_begin()
    recorder.add_batch(
        30,
        40,
        [20, 10],
        counts={"source_tokens": 18, "target_tokens": 12},
        dims={"source": [12, 6], "target": [8, 4]},
    )
    recorder.step_end()
    recorder.add_batch(
        9,
        9,
        [9],
        counts={"source_tokens": 5, "target_tokens": 4},
        dims={"source": [5], "target": [4]},
    )
    recorder.step_end()
    recorder.add_batch(
        9,
        9,
        [9],
        counts={"source_tokens": 5, "target_tokens": 4},
        dims={"source": [5], "target": [4]},
    )
    recorder.step_end()
    s = recorder.stats
    assert s.step_counts == {"source_tokens": [18, 5, 5], "target_tokens": [12, 4, 4]}
    assert s.step_moments["source"] == [18, 5, 5]
    assert s.step_moments["source*target"] == [12 * 8 + 6 * 4, 20, 20]
    assert s.step_moments["target*target"] == [64 + 16, 16, 16]
    # the counts per second over the measured steps (the first left out): 10 / 3 s
    figures = summarize([s], warmup=1)
    assert figures["source_tokens_per_second_global"] == pytest.approx(10 / 3)
    assert figures["target_tokens_per_second_global"] == pytest.approx(8 / 3)
    assert "audio_seconds_per_second_global" not in figures


def test_a_task_without_counts_reports_none() -> None:
    stats = RankStats(
        rank=0,
        step_times_s=[1.0, 1.0],
        step_tokens=[5, 5],
        step_padded_tokens=[5, 5],
        step_rows=[1, 1],
    )
    assert not any(
        k.endswith("_per_second_global") and k.startswith(("source", "audio"))
        for k in summarize([stats], warmup=0)
    )


def test_on_a_causal_lm_the_count_agrees_with_the_formula() -> None:
    """One length: the counted step against the analytic formula (itself held to PyTorch's
    counter by the FLOPs architecture tests). The formula counts the first layer's input
    gradient and leaves out the norms and the loss: within 5%."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=512,
    )
    model = LlamaForCausalLM(config).train()
    task = CausalLMTask()
    rows = [50, 20, 64]
    fit = count_flops(
        model,
        lambda lengths: task.probe_batch(config, lengths),
        {"tokens": sum(rows) / len(rows)},
        checkpointing=False,
    )
    total = CountedFlops.total(fit.model, len(rows), length_moments({"tokens": rows}))
    from trainer_entry.measure.steps import SequenceLengths

    formula = estimate_flops(model, SequenceLengths.of(rows), None).model_flops_per_token
    assert total / sum(rows) == pytest.approx(formula, rel=0.05)
    # the parts with FLOPs: the decoder layers and the head (the base model opened up)
    assert {name for name, c in fit.components.items() if any(c.values())} == {
        "model.layers",
        "lm_head",
    }


def test_every_count_has_its_column_in_the_result() -> None:
    """A count a task reports (COUNT_UNITS) is a field of the typed record and a declared
    column: a result with it validates, and the tables show it."""
    from orchestrator.contract import columns
    from orchestrator.contract.result import ChildMetrics
    from orchestrator.contract.trainers import COUNT_UNITS, TASK_LINES, count_column

    for count in COUNT_UNITS:
        assert count_column(count) in ChildMetrics.model_fields
        assert columns.find(count_column(count)) is not None
    assert {c for line in TASK_LINES for c in line.counts} <= set(COUNT_UNITS)
