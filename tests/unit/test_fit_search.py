"""The search for the largest value that fits: bisection, searches, probes, verdicts. Pure."""

from __future__ import annotations

import math

import pytest

from orchestrator.matrix.expand import Selection, build_plan
from orchestrator.matrix.fitsearch import (
    decide,
    linear_scan,
    probe_experiment,
    search,
    search_key,
)
from orchestrator.running.fitrun import cgroup_memory_limit, judge, peak_memory


def fits_up_to(answer: int, stop_at: int | None = None):
    def verdict(value: int) -> str:
        if stop_at is not None and value == stop_at:
            return "stop"
        return "fits" if value <= answer else "too_big"

    return verdict


def test_the_sequence_doubles_then_bisects() -> None:
    decision, probes = search(fits_up_to(5), low=1)
    assert [v for v, _ in probes] == [1, 2, 4, 8, 6, 5]
    assert (decision.largest_fit, decision.first_too_big, decision.ending) == (5, 6, "bracketed")


@pytest.mark.parametrize("answer", [1, 2, 3, 7, 8, 9, 100, 1000, 4095])
def test_the_answer_is_exact_in_about_two_log2_probes(answer: int) -> None:
    decision, probes = search(fits_up_to(answer), low=1)
    assert decision.largest_fit == answer
    assert decision.first_too_big == answer + 1
    # doubling: floor(log2 answer) + 2 probes; bisection between 2^k and 2^(k+1): at most k
    k = int(math.log2(answer))
    assert len(probes) <= 2 * k + 2
    assert len({v for v, _ in probes}) == len(probes)  # no value probed twice
    assert linear_scan(fits_up_to(answer), low=1)[0].largest_fit == answer


def test_a_lower_bound_that_does_not_fit_ends_at_once() -> None:
    decision, probes = search(fits_up_to(3), low=4)
    assert probes == [(4, "too_big")]
    assert decision.ending == "nothing fits"
    assert decision.largest_fit is None and decision.first_too_big == 4


def test_the_limit_is_never_passed() -> None:
    decision, probes = search(fits_up_to(100), low=1, limit=10)
    assert [v for v, _ in probes] == [1, 2, 4, 8, 10]
    assert (decision.largest_fit, decision.ending) == (10, "limit")
    # below the limit the answer is bracketed as usual
    decision, probes = search(fits_up_to(6), low=1, limit=10)
    assert [v for v, _ in probes] == [1, 2, 4, 8, 6, 7]
    assert (decision.largest_fit, decision.first_too_big) == (6, 7)


def test_a_failure_that_is_not_memory_stops_the_search() -> None:
    decision, probes = search(fits_up_to(100, stop_at=4), low=1)
    assert [v for v, _ in probes] == [1, 2, 4]
    assert decision.ending == "stopped"
    assert decision.largest_fit == 2 and decision.first_too_big is None


def test_a_fit_above_a_miss_is_ignored() -> None:
    decision = decide({1: "fits", 2: "fits", 4: "too_big", 8: "fits"}, low=1)
    assert (decision.next, decision.largest_fit, decision.first_too_big) == (3, 2, 4)


def test_a_lower_bound_above_the_limit_is_refused() -> None:
    with pytest.raises(ValueError, match="above the limit"):
        decide({}, low=8, limit=4)


def test_the_linear_scan_probes_every_value() -> None:
    decision, probes = linear_scan(fits_up_to(5), low=1)
    assert [v for v, _ in probes] == [1, 2, 3, 4, 5, 6]
    assert (decision.largest_fit, decision.first_too_big) == (5, 6)


# ---------------------------------------------------------------------------
# Searches and probes
# ---------------------------------------------------------------------------

SCENARIOS = """
frameworks:
  ddp: {accelerate_config: accelerate-ddp.yaml}
matrix:
  effective_batch_size: [4, 8]
  max_seq_len: [128]
scenarios:
  - name: s
    device: cpu
    framework_config: [ddp]
    search: {max: per_device_train_batch_size}
    arguments:
      model_name_or_path: m
      eval: true
    sweep:
      peft_method: [none, lora]
"""


@pytest.fixture
def experiments(load):
    config = load(SCENARIOS)
    return build_plan(config, Selection(device="cpu", num_gpus=(1,)), 0).experiments


def test_a_batch_search_spans_the_effective_batches_but_not_the_peft_setup(experiments) -> None:
    keys = {(e.peft_method, search_key(e, "per_device_train_batch_size")) for e in experiments}
    assert len(experiments) == 4
    assert len({k for _, k in keys}) == 2  # eb 4 and 8 share one; lora and full differ


def test_a_length_search_keeps_the_per_device_batch(experiments) -> None:
    keys = {search_key(e, "max_seq_len") for e in experiments}
    assert len(keys) == 4  # per-device batch 4 and 8 need different memory


def test_a_probe_is_a_short_run_with_its_own_id(experiments) -> None:
    cell = experiments[0]
    a = probe_experiment(cell, "per_device_train_batch_size", 16, steps=3)
    b = probe_experiment(cell, "per_device_train_batch_size", 17, steps=3)
    assert a.experiment_id != b.experiment_id != cell.experiment_id
    assert (
        a.experiment_id
        == probe_experiment(cell, "per_device_train_batch_size", 16, 3).experiment_id
    )
    assert a.cell_id == a.experiment_id and a.repeat == 0
    assert (a.per_device_train_batch_size, a.gradient_accumulation_steps) == (16, 1)
    assert a.effective_batch_size == 16 * cell.num_gpus
    assert a.arguments["per_device_train_batch_size"] == 16
    assert a.arguments["gradient_accumulation_steps"] == 1
    assert a.arguments["max_steps"] == 3
    assert "eval" not in a.arguments and cell.arguments["eval"] is True
    assert a.profile_steps == 0
    seq = probe_experiment(cell, "max_seq_len", 512, steps=2)
    assert (seq.max_seq_len, seq.arguments["max_seq_len"]) == (512, 512)
    assert seq.per_device_train_batch_size == cell.per_device_train_batch_size


# ---------------------------------------------------------------------------
# Verdicts
# ---------------------------------------------------------------------------

GIB = 2**30


def test_an_oom_does_not_fit_and_another_failure_is_no_verdict() -> None:
    assert judge({"status": "oom", "error": "host memory: killed"}, "cpu", None, 0.1) == (
        "too_big",
        "host memory: killed",
    )
    verdict, reason = judge({"status": "failed", "error": "ImportError: x"}, "cpu", 8 * GIB, 0.1)
    assert verdict == "stop" and reason == "failed: ImportError: x"
    assert judge({"status": "timeout", "error": None}, "gpu", None, 0.1)[0] == "stop"
    pruned = {"status": "skipped", "error": "pruned: x ran out of memory"}
    assert judge(pruned, "gpu", None, 0.1)[0] == "too_big"


def test_the_margin_turns_a_run_near_the_capacity_into_a_miss() -> None:
    row = {"status": "ok", "mem_tree_peak_pss_bytes": 7.5 * GIB, "mem_peak_rss_bytes": 1}
    assert peak_memory(row, "cpu") == (7.5 * GIB, "PSS of the job's processes")
    verdict, reason = judge(row, "cpu", 8 * GIB, 0.1)
    assert verdict == "too_big"
    assert "7.50 GiB is above 90% of 8.00 GiB" in str(reason)
    assert judge(row, "cpu", 8 * GIB, 0.05) == ("fits", None)
    # an unknown capacity applies no margin rather than guessing one
    assert judge(row, "cpu", None, 0.1) == ("fits", None)
    gpu = {"status": "ok", "mem_nvidia_peak_bytes_max": 79 * GIB, "mem_tree_peak_pss_bytes": 1}
    assert judge(gpu, "gpu", 80 * GIB, 0.1)[0] == "too_big"


def test_the_cgroup_limit_is_the_tightest_of_the_chain(tmp_path) -> None:
    outer = tmp_path / "memory" / "batch"
    inner = outer / "job_1"
    inner.mkdir(parents=True)
    (tmp_path / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    (outer / "memory.limit_in_bytes").write_text(str(3 * GIB))
    (inner / "memory.limit_in_bytes").write_text(str(5 * GIB))
    limit = cgroup_memory_limit("4:memory:/batch/job_1\n", tmp_path)
    assert limit == (3 * GIB, f"the memory cgroup limit of {outer}")
    (outer / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    (inner / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    assert cgroup_memory_limit("4:memory:/batch/job_1\n", tmp_path) is None
