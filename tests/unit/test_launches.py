"""Shared launches (``--launch family``), the pure parts: which experiments share a launch,
how a launch's logs and samples are cut into its runs', its overhead, and who refuses it.

The real launch (an ``accelerate launch`` of several specs, its OOM, time limit and
Ctrl-C) is tests/e2e/test_launch_family.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.contract.errors import UserError
from orchestrator.contract.launch import marker, split_log
from orchestrator.contract.layout import ResultsLayout
from orchestrator.executors.local import LocalExecutor
from orchestrator.executors.packed import PackedExecutor
from orchestrator.job.execute import RunOptions, launch_overhead
from orchestrator.job.shared import _cut_samples
from orchestrator.matrix.launches import families
from orchestrator.running.runner import preflight

MATRIX = """
frameworks:
  ddp: {accelerate_config: accelerate-ddp.yaml}
matrix:
  effective_batch_size: [2, 4]
  max_seq_len: [128]
  repeats: 2
scenarios:
  - name: full
    framework_config: [null, ddp]
    arguments:
      model_name_or_path: tiny-llama
  - name: lora
    framework_config: [null]
    arguments:
      model_name_or_path: tiny-llama
      peft_method: lora
  - name: hf
    framework_config: [null]
    arguments:
      model_name_or_path: tiny-llama
      trainer: hf
"""


def test_a_family_shares_the_launch_command_and_keeps_the_plan_order(plan) -> None:
    experiments = list(plan(MATRIX, num_gpus=(1, 2)).experiments)
    grouped = families(experiments)
    # every experiment once, each family's members in plan order, families in the order
    # of their first member
    flat = [e for family in grouped for e in family]
    assert sorted(e.experiment_id for e in flat) == sorted(e.experiment_id for e in experiments)
    for family in grouped:
        places = [experiments.index(e) for e in family]
        assert places == sorted(places)
    firsts = [experiments.index(family[0]) for family in grouped]
    assert firsts == sorted(firsts)
    for family in grouped:
        # one launch command: framework, processes, trainer, model, dtype, repeat
        assert len({(e.framework, e.num_gpus, e.trainer, e.repeat) for e in family}) == 1
    # LoRA and full fine-tuning of one model, framework and trainer share a launch; the
    # other trainer, framework, process count and repeat do not
    full_and_lora = [
        f for f in grouped if {e.scenario for e in f} == {"full", "lora"} and f[0].num_gpus == 1
    ]
    assert len(full_and_lora) == 2  # one per repeat
    assert all(len(f) == 4 for f in full_and_lora)  # 2 batches × (full, lora)
    assert all({e.scenario for e in f} == {"hf"} for f in grouped if f[0].trainer == "hf")
    assert len(grouped) == 2 * 2 * 3  # repeats × processes × (none-sft, ddp-sft, none-hf)


def test_a_launch_log_is_cut_at_the_first_marker_of_each_run() -> None:
    ids = ["a", "b", "c"]
    text = "\n".join(
        [
            "launcher says hello",
            marker(1, 3, "a"),
            marker(1, 3, "a"),  # the second rank's marker
            "a trains",
            marker(2, 3, "b"),
            "b trains",
            "a's second rank, late",  # after b began: it is b's now
            marker(2, 3, "b"),
            "b: Traceback",
            "",
        ]
    )
    parts = split_log(text, ids)
    assert parts["a"].splitlines() == [
        "launcher says hello",
        marker(1, 3, "a"),
        marker(1, 3, "a"),
        "a trains",
    ]
    assert parts["b"].splitlines()[0] == marker(2, 3, "b")
    assert parts["b"].splitlines()[-1] == "b: Traceback"
    assert "c" not in parts  # never began: nothing of its own
    # a marker naming an experiment of another launch is an ordinary line
    assert split_log(marker(1, 2, "elsewhere") + "\n", ids) == {
        "a": marker(1, 2, "elsewhere") + "\n"
    }
    # a launch's run never goes back to an earlier one's part
    back = split_log("\n".join([marker(2, 3, "b"), marker(1, 3, "a"), "x"]), ids)
    assert list(back) == ["b"] and back["b"].endswith("x")


def test_a_runs_samples_are_its_window_after_the_states_in_force(tmp_path: Path) -> None:
    source = tmp_path / "launch.csv"
    source.write_text(
        "timestamp,kind,source,bytes\n"
        "1.0,device_baseline,0,100\n"
        "2.0,cpu_allowed,tree,4\n"
        "3.0,tree_rss,tree,10\n"
        "5.0,cpu_allowed,tree,2\n"
        "6.0,tree_rss,tree,50\n"
        "7.5,tree_rss,tree,70\n"
        "9.0,tree_rss,tree,900\n"
        "9.5,tree_rss\n"  # cut short by a crash
    )
    target = tmp_path / "run.csv"
    _cut_samples(source, target, start_unix=5.5, end_unix=8.0)
    assert target.read_text().splitlines() == [
        "timestamp,kind,source,bytes",
        "1.0,device_baseline,0,100",
        "5.0,cpu_allowed,tree,2",  # the last allowance before the window, not the first
        "6.0,tree_rss,tree,50",
        "7.5,tree_rss,tree,70",
    ]


def test_the_launch_overhead_is_launch_to_first_step_less_load_and_step() -> None:
    timings = {"first_step_unix": 130.0, "model_load_s": 4.0, "first_step_s": 1.0}
    assert launch_overhead({"timings": timings}, launched_unix=100.0) == pytest.approx(25.0)
    # a run that never stepped, or did not say: no figure
    assert launch_overhead({"timings": {"model_load_s": 4.0}}, 100.0) is None
    assert launch_overhead(None, 100.0) is None
    # clocks that disagree give no figure rather than a negative one
    assert launch_overhead({"timings": {**timings, "first_step_unix": 101.0}}, 100.0) is None


def test_only_an_executor_that_shares_launches_takes_launch_family(plan, tmp_path) -> None:
    the_plan = plan(MATRIX, num_gpus=(1,))
    layout = ResultsLayout(tmp_path / "res")
    family = RunOptions(launch="family")
    with pytest.raises(UserError, match=r"^--launch family: the packed executor runs a launch"):
        preflight(PackedExecutor(slots=2), the_plan, layout, family)
    preflight(LocalExecutor(), the_plan, layout, family)  # accepted
    preflight(PackedExecutor(slots=2), the_plan, layout, RunOptions())


def test_the_files_launch_key_takes_cell_or_family(load) -> None:
    assert load("launch: family\n" + MATRIX).launch == "family"
    assert load(MATRIX).launch is None
    with pytest.raises(UserError, match=r"scenarios.yaml:1: launch: .*'cell' or 'family'"):
        load("launch: sometimes\n" + MATRIX)
