"""Memory predicted before launch, the parent's side: what a prediction means against a
device's memory, the check asking for it and keeping it, the plan's table and columns,
an ``over`` cell pruned before launch, and a fit starting from the prediction.

The child's side (the step on fake tensors) runs for real in
tests/e2e/test_memory_prediction.py (against torch's own tracker of a real step) and
tests/e2e/test_plan_memory_e2e.py (``tunematrix plan --memory``); here its answer is
given, as it would come back.
"""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from orchestrator.contract.devices import GIB
from orchestrator.contract.gpumemory import (
    CUDA_CONTEXT_BYTES,
    MemoryPrediction,
    MemoryVerdict,
)
from orchestrator.contract.layout import ResultsLayout
from orchestrator.contract.outcome import is_pruned, read_outcome
from orchestrator.executors.base import RunContext
from orchestrator.executors.console import Progress
from orchestrator.job.execute import RunOptions
from orchestrator.matrix.experiment import Experiment
from orchestrator.matrix.fitsearch import decide
from orchestrator.matrix.table import plan_csv
from orchestrator.running.memoryfit import flagged_lines, memory_table, with_memory
from orchestrator.running.stackcheck import check_stack

GB = 10**9
SCENARIOS = """\
matrix:
  effective_batch_size: [8, 64]
scenarios:
  - name: a
    arguments: {model_name_or_path: config:llama-3.2-1b, max_seq_len: 2048}
"""


def _prediction(peak: float, largest: float = 0.0, **terms: float) -> MemoryPrediction:
    return MemoryPrediction(
        peak_bytes=int(peak * GB),
        terms={k.replace("_", " "): int(v * GB) for k, v in terms.items()},
        largest_block=int(largest * GB),
    )


# -- a prediction against a device's memory --------------------------------------------------
def test_headroom_context_and_the_verdicts() -> None:
    hf = _prediction(34.0, largest=8.4, weights=2.5, logits_and_loss=25.2)
    # reserved: the peak and its largest tensor (the allocator keeps what it freed)
    assert hf.reserved_bytes == int(42.4 * GB)
    assert hf.nvml_bytes == int(42.4 * GB) + CUDA_CONTEXT_BYTES
    assert hf.largest_line() == "logits and loss: 25.2 of 34.0 GB"
    # a small largest tensor: 5% of the peak instead
    assert _prediction(12.0, largest=0.1).reserved_bytes == int(12.6 * GB)
    assert hf.verdict(80 * GIB) == "fits"
    assert hf.verdict(45 * GIB) == "close"  # 43.8 GB of NVML is over 90% of 45 GiB
    assert hf.verdict(30 * GIB) == "close"  # over the device, within the prediction's error
    assert hf.verdict(25 * GIB) == "over"
    assert hf.verdict(None) is None
    assert MemoryPrediction(error="no").verdict(80 * GIB) is None
    reason = hf.pruned_reason(25 * GIB)
    assert reason.startswith("predicted to need 34.0 GB of torch memory on its busiest GPU")
    assert "over the device's 25 GiB" in reason and "--no-prune" in reason


def test_what_is_counted_from_the_parameters_takes_no_margin() -> None:
    """The predecessor's A100 table: Llama-2-70B LoRA on 2 GPUs at batch 2, predicted
    91.2 GB, 72.5 of it its weights, ran out of 80 GiB (85.9 GB). Its weights are counted
    from the parameters; only what the step makes may be over by the margin."""
    llama = _prediction(91.2, 1.0, weights=72.5, activations=10.0, backward=8.7)
    assert llama.least_bytes == int(72.5 * GB) + int(18.7 * GB / 1.15)
    assert llama.verdict(80 * GIB) == "over"
    # the same peak made by the step: within the margin of the device, launched and flagged
    made = _prediction(91.2, 1.0, weights=10.0, activations=81.2)
    assert made.verdict(80 * GIB) == "close"
    # every fitting cell of that table is predicted under the device: Mixtral-8x7B LoRA on
    # 2 GPUs at batch 4, measured 64.9 GB, predicted 68.6 (52.5 its weights)
    assert _prediction(68.6, 1.0, weights=52.5, activations=16.1).verdict(80 * GIB) == "fits"


def test_an_nvml_figure_under_fsdp_is_a_lower_bound_in_the_table_and_the_csv(plan) -> None:
    from orchestrator.contract.gpumemory import NVML_LOWER_BOUND

    built = plan(SCENARIOS, num_gpus=(2,))
    bound = dataclasses.replace(_prediction(34.0, 1.0, weights=2.5), nvml_lower_bound=True)
    assert MemoryPrediction.from_answer(bound.as_answer()).nvml_lower_bound
    table = memory_table(
        with_memory(built, {e.cell_id: bound for e in built.experiments}, 80 * GIB, "flag")
    )
    # 34.0 GB, its 5% headroom and the CUDA context
    assert any("≥ 37.1 GB" in line for line in table), table
    assert f"  {NVML_LOWER_BOUND}" in table
    assert MemoryVerdict(bound, 80 * GIB).row()["predicted_nvml_lower_bound"] is True


def test_an_answer_round_trips_and_an_error_stays_an_error() -> None:
    hf = _prediction(34.0, largest=8.4, weights=2.5)
    assert MemoryPrediction.from_answer(hf.as_answer()) == dataclasses.replace(hf, seconds=None)
    failed = MemoryPrediction.from_answer({"error": "a python: model is not run here"})
    assert failed.peak_bytes is None and failed.error == "a python: model is not run here"
    row = MemoryVerdict(failed, 80 * GIB, "--gpu-memory-gib 80").row()
    assert row["predicted_peak_bytes"] is None and row["memory_verdict"] is None
    assert row["memory_prediction_error"] == "a python: model is not run here"


# -- the check asks for it, and keeps it --------------------------------------------------------
def _child(asked: list[list[str]], peaks: dict[int, float]) -> Any:
    def run(python: str, cells: Sequence[Experiment], memory: Sequence[str] = ()) -> dict:
        asked.append(list(memory))
        by_id = {e.cell_id: e for e in cells}
        return {
            "versions": {"torch": "2.13.0"},
            "models": {
                "config:llama-3.2-1b": {
                    "cell": cells[0].cell_id,
                    "where": "architecture",
                    "offline": False,
                }
            },
            "problems": [],
            "unbuilt": 0,
            "memory": {
                cell: _prediction(peaks[by_id[cell].effective_batch_size], largest=1).as_answer()
                for cell in memory
            },
        }

    return run


def test_the_check_predicts_the_cells_asked_for_and_keeps_the_predictions(
    plan, tmp_path, monkeypatch
) -> None:
    monkeypatch.setenv("TUNEMATRIX_CACHE", str(tmp_path / "cache"))
    built = plan(SCENARIOS, num_gpus=(1,))
    asked: list[list[str]] = []
    child = _child(asked, {8: 34.0, 64: 871.0})
    # not asked for: no prediction
    check_stack(built, run=child, keep=True)
    assert asked == [[]]
    # asked for: a kept verdict without one is asked again, for it
    first = check_stack(built, run=child, keep=True, memory=lambda e: True)
    assert sorted(asked[1]) == sorted(e.cell_id for e in built.experiments)
    assert {p.peak_bytes for p in first.memory.values()} == {34 * GB, 871 * GB}
    # then kept: nothing is asked, the same predictions come back
    again = check_stack(built, run=child, keep=True, memory=lambda e: True)
    assert len(asked) == 2 and again.memory == first.memory


# -- the plan's table, columns and the run's header ---------------------------------------------
def _predicted(plan, capacity_gib: float | None = 80) -> Any:  # type: ignore[no-untyped-def]
    built = plan(SCENARIOS, num_gpus=(1,))
    peaks = {8: _prediction(34.0, 8.4, logits_and_loss=25.2), 64: _prediction(871.0, 134.5)}
    predictions = {e.cell_id: peaks[e.effective_batch_size] for e in built.experiments}
    capacity = capacity_gib * GIB if capacity_gib else None
    return with_memory(built, predictions, capacity, "--gpu-memory-gib 80")


def test_the_table_and_the_csv_set_each_cell_against_the_device(plan) -> None:
    predicted = _predicted(plan)
    table = memory_table(predicted)
    assert "device: 80 GiB per GPU (--gpu-memory-gib 80)" in table[0]
    small, big = table[2], table[3]
    assert "34.0 GB" in small and "logits and loss: 25.2 of 34.0 GB" in small
    assert small.rstrip().endswith("fits")
    assert "871.0 GB" in big and "OVER: pruned before launch" in big
    lines = plan_csv(predicted).splitlines()
    header = lines[0].split(",")
    assert "predicted_peak_bytes" in header and "memory_verdict" in header
    values = [dict(zip(header, line.split(","), strict=True)) for line in lines[1:]]
    assert sorted(int(v["predicted_peak_bytes"]) for v in values) == [34 * GB, 871 * GB]
    assert {v["memory_verdict"] for v in values} == {"fits", "over"}
    (flag,) = flagged_lines(predicted)
    assert flag.endswith("of 80 GiB: over, pruned before launch")
    # unknown capacity: predictions, no verdict, and the table says how to give one
    unknown = memory_table(_predicted(plan, capacity_gib=None))
    assert "give --gpu-memory-gib" in unknown[0]
    assert flagged_lines(_predicted(plan, capacity_gib=None)) == []


# -- an over cell is pruned before launch, unless --no-prune ------------------------------------
def _context(tmp_path: Path, the_plan: Any, **options: Any) -> RunContext:
    return RunContext(
        the_plan,
        ResultsLayout(tmp_path),
        RunOptions(**options),
        Progress(len(the_plan.experiments), stream=io.StringIO()),
        say=lambda line: None,
    )


def test_a_cell_predicted_over_the_device_is_pruned_before_launch(plan, tmp_path) -> None:
    predicted = _predicted(plan)
    small, big = sorted(predicted.experiments, key=lambda e: e.effective_batch_size)
    ctx = _context(tmp_path / "a", predicted)
    assert ctx.prepare(small, gpus=None) is not None
    assert ctx.prepare(big, gpus=None) is None
    outcome = read_outcome(ResultsLayout(tmp_path / "a").run(big.experiment_id))
    assert outcome is not None and is_pruned(outcome.status, outcome.error)
    assert outcome.error is not None and "predicted to need 871.0 GB" in outcome.error
    # --no-prune launches it; an unknown capacity prunes nothing
    assert _context(tmp_path / "b", predicted, prune=False).prepare(big, gpus=None) is not None
    unknown = _predicted(plan, capacity_gib=None)
    big_unknown = max(unknown.experiments, key=lambda e: e.effective_batch_size)
    assert _context(tmp_path / "c", unknown).prepare(big_unknown, gpus=None) is not None


# -- a fit starts from the prediction ----------------------------------------------------------
def _search(fits_up_to: int, low: int = 1, limit: int | None = None, start: int | None = None):
    verdicts: dict[int, str] = {}
    order = []
    while True:
        decision = decide(verdicts, low, limit, start)  # type: ignore[arg-type]
        if decision.next is None:
            return decision, order
        verdicts[decision.next] = "fits" if decision.next <= fits_up_to else "too_big"
        order.append(decision.next)


@pytest.mark.parametrize(
    ("start", "probes"),
    [
        (None, [1, 2, 4, 8, 16, 32, 64, 48, 40, 36, 38, 37]),
        (32, [32, 64, 48, 40, 36, 38, 37]),  # right: the lower bound needs no probe
        (64, [64, 1, 32, 48, 40, 36, 38, 37]),  # wrong: the lower bound, then bisection
    ],
)
def test_a_search_starts_from_the_predicted_value(start: int | None, probes: list[int]) -> None:
    decision, order = _search(37, start=start)
    assert (decision.largest_fit, decision.first_too_big, order) == (37, 38, probes)


def test_a_start_at_or_past_the_bounds_is_ignored_and_nothing_fitting_is_said() -> None:
    assert _search(37, limit=20, start=64)[1] == [1, 2, 4, 8, 16, 20]
    decision, order = _search(0, start=8)
    assert (decision.ending, order) == ("nothing fits", [8, 1])


# -- sharding, by formula --------------------------------------------------------------------
def test_sharding_divides_what_each_framework_shards() -> None:
    from trainer_entry.run.memoryplan import Sharding, shard

    terms = {
        "weights": 8,
        "gradients": 8,
        "optimizer states": 16,
        "activations": 4,
        "logits and loss": 2,
        "backward": 0,
        "optimizer step": 0,
    }
    # 4 trainable parameters in bf16 (8 bytes), the largest block's weights 1 byte
    same = {"trainable": 4, "trainable_bytes": 8, "largest_block_params": 1}
    one, formulas = shard(terms, Sharding("FSDP", 0, 1), **same)
    assert one == terms and formulas  # one GPU: FSDP shards nothing, and says so
    four, _ = shard(terms, Sharding("FSDP", 0, 4), **same)
    assert (four["weights"], four["gradients"], four["optimizer states"]) == (2 + 2, 2 + 1, 4)
    zero2, _ = shard(terms, Sharding("DEEPSPEED", 2, 4), **same)
    # fp32 states (twice the bf16 ones) and fp32 master weights, with the gradients, ÷ 4
    assert (zero2["weights"], zero2["gradients"], zero2["optimizer states"]) == (8, 2, 12)
    zero3, _ = shard(terms, Sharding("DEEPSPEED", 3, 4), **same)
    assert (zero3["weights"], zero3["gradients"], zero3["optimizer states"]) == (4, 3, 12)
    # fp32 weights under bf16: DeepSpeed keeps the model's in bf16
    fp32 = {"trainable": 2, "trainable_bytes": 8, "largest_block_params": 1}
    cast, _ = shard(terms, Sharding("DEEPSPEED", 1, 1), **fp32, low_precision=True)
    assert (cast["weights"], cast["optimizer states"]) == (4, 16 + 8)
    # DDP's buckets, made when the model is wrapped, live through the peak: the gradients'
    # size is added even where the peak holds no gradient
    ddp, formulas = shard({**terms, "gradients": 0}, Sharding("MULTI_GPU", 0, 2), **same)
    assert ddp["gradients"] == 8 and formulas == ["DDP: gradient buckets as large as the gradients"]
    assert shard(terms, Sharding("NO", 0, 1), **same) == (terms, [])


def test_accumulation_holds_the_gradients_through_the_next_forward(plan, tmp_path) -> None:
    """With gradient accumulation a micro-batch after the first runs with every gradient
    held: the step on fake tensors holds them (a tiny model's CPU cells)."""
    from orchestrator.contract.spec import RunSpec
    from trainer_entry.run.memoryplan import Predictor, predict

    built = plan(
        "matrix:\n  effective_batch_size: [4, 8]\n  max_seq_len: [64]\n  packing: [true]\n"
        "scenarios:\n  - name: s\n    device: cpu\n    arguments:\n      model_name_or_path: tiny-llama\n"
        "      trainer: hf\n      per_device_train_batch_size: 4\n",
        device="cpu",
        num_gpus=(1,),
    )
    by_accumulation = {e.gradient_accumulation_steps: e for e in built.experiments}
    predictor = Predictor()
    one, two = (
        predict(RunSpec(**by_accumulation[n].spec()).resolve(tmp_path), predictor) for n in (1, 2)
    )
    assert one.terms["gradients"] == 0  # the peak is the logits' backward, before any gradient
    # every parameter's gradient, in its dtype: the weights less the buffers (a few bytes)
    weights, gradients = one.terms["weights"], two.terms["gradients"]
    assert weights - 1024 < gradients < weights
    assert two.peak_bytes == one.peak_bytes + gradients


def test_an_unpacked_cell_over_at_full_length_is_flagged_not_pruned(plan, tmp_path) -> None:
    built = plan(SCENARIOS.replace("max_seq_len: 2048}", "max_seq_len: 2048, packing: false}"))
    predictions = {e.cell_id: _prediction(871.0, 134.5) for e in built.experiments}
    flagged = with_memory(built, predictions, 80 * GIB, "--gpu-memory-gib 80")
    experiment = flagged.experiments[0]
    assert experiment.memory is not None and experiment.memory.verdict == "over"
    assert not experiment.memory.prunes
    assert _context(tmp_path, flagged).prepare(experiment, gpus=None) is not None
    assert "launched (unpacked rows may be shorter)" in memory_table(flagged)[2]


# -- summary.md: predicted against measured -----------------------------------------------------
def test_summary_sets_each_prediction_against_its_measurement(tmp_path: Path) -> None:
    import json

    from fakeruns import write_run

    from orchestrator.results.report import CostSettings, write_report

    root = tmp_path / "results"
    measured = {"hf-full": 34.04e9, "sft-full": 9.0e9}
    for eid, allocated in measured.items():
        run = write_run(root, eid, memory=allocated + 10e9)
        result = json.loads((run / "result.json").read_text())
        result["metrics"].update(
            torch_max_memory_allocated_bytes=allocated,
            torch_max_memory_reserved_bytes=allocated + 8e9,
        )
        (run / "result.json").write_text(json.dumps(result))
    write_run(root, "oversized", status="skipped", error="pruned: predicted to need 871.0 GB")
    predicted = {
        # under FSDP over several GPUs: its NVML figure is a lower bound
        "hf-full": dataclasses.replace(
            _prediction(34.01, 8.41, weights=2.5, logits_and_loss=25.2), nvml_lower_bound=True
        ),
        "sft-full": _prediction(12.45, 1.05, optimizer_states=4.9),
        "oversized": _prediction(871.0, 134.5, activations=460.1),
    }
    write_run(root, "close-one", memory=None, status="failed", error="killed")
    predicted["close-one"] = _prediction(74.0, 2.0, activations=40.0)
    header = "cell_id,status," + ",".join(MemoryVerdict(predicted["hf-full"]).row())
    lines = [header] + [
        f"{cell},planned,"
        + ",".join("" if v is None else str(v) for v in MemoryVerdict(p, 80 * GIB).row().values())
        for cell, p in predicted.items()
    ]
    (root / "plan.csv").write_text("\n".join(lines) + "\n")
    write_report(root, root, CostSettings(), plots=False)
    text = (root / "summary.md").read_text()
    start = text.index("## Memory: predicted before launch, and measured")
    section = text[start : text.find("\n## ", start + 1)]
    assert "| hf-full | 34.0 GB / 34.0 GB | 42.4 GB / 42.0 GB |" in section
    assert "logits and loss: 25.2 of 34.0 GB" in section
    from orchestrator.contract.gpumemory import NVML_LOWER_BOUND

    assert "| ≥ 43.8 GB / " in section and NVML_LOWER_BOUND in section
    # 12.45 against 9.0: said plainly, not made to add up
    assert (
        "- sft-full: predicted 12.4 GB of torch allocation, measured 9.0 GB: 38% apart, more "
        "than 15%. The prediction's terms do not account for this run."
    ) in section
    assert "- oversized: pruned before launch, predicted 871.0 GB: not measured" in section
    assert "hf-full: predicted" not in section  # within 15%: nothing to say
    assert "- close-one: close to the limit: predicted 79.1 GB on NVML of the device's 80 GiB" in (
        section
    )
    # a folder without predictions (a CPU matrix, an older run) has no such section
    (root / "plan.csv").write_text("cell_id,status\nhf-full,planned\n")
    write_report(root, root, CostSettings(), plots=False)
    assert "predicted before launch" not in (root / "summary.md").read_text()


def test_the_device_memory_is_the_flags_else_nvml_here_only() -> None:
    from orchestrator.running.memoryfit import device_capacity

    assert device_capacity(80) == (80 * GIB, "--gpu-memory-gib 80")
    assert device_capacity(40, here=False) == (40 * GIB, "--gpu-memory-gib 40")
    # a cluster's jobs run on GPUs this machine's NVML does not see: unknown
    assert device_capacity(None, here=False) == (None, "")


def test_predictions_past_their_budget_are_left_out_and_asked_again(
    plan, tmp_path, monkeypatch
) -> None:
    """The check never runs out of time for predictions: past their budget the cells left
    say so, and such an answer is not kept with the verdict (asked again next time)."""
    from orchestrator.contract.spec import RunSpec
    from trainer_entry.check import predict_memory

    built = plan(SCENARIOS, num_gpus=(1,))
    specs = [(e.cell_id, RunSpec(**e.spec()).resolve(tmp_path)) for e in built.experiments]
    answer = predict_memory(specs, budget_s=-1)
    assert {a["error"] for a in answer.values()} == {
        "not reached in the check's -1 s for predictions"
    }
    assert all(a["retry"] for a in answer.values())

    monkeypatch.setenv("TUNEMATRIX_CACHE", str(tmp_path / "cache"))
    asked: list[list[str]] = []

    def child(python: str, cells, memory=()):  # type: ignore[no-untyped-def]
        asked.append(list(memory))
        return {
            "versions": {"torch": "2.13.0"},
            "models": {"config:llama-3.2-1b": {"where": "architecture", "offline": False}},
            "problems": [],
            "memory": {cell: answer[cell] for cell in memory},
        }

    first = check_stack(built, run=child, keep=True, memory=lambda e: True)
    assert all(p.peak_bytes is None for p in first.memory.values())
    check_stack(built, run=child, keep=True, memory=lambda e: True)
    assert len(asked) == 2 and sorted(asked[1]) == sorted(asked[0])
