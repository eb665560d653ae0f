"""OOM pruning: the ladder key, the dominance test, the run context's hook, and the tables."""

from __future__ import annotations

import io
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
from scriptargs import script_argv

from orchestrator.contract.layout import ResultsLayout
from orchestrator.contract.outcome import (
    ACCEPTABLE,
    Outcome,
    Skip,
    is_pruned,
    read_outcome,
    write_outcome,
)
from orchestrator.executors.base import RunContext
from orchestrator.executors.console import Progress
from orchestrator.job.execute import RunOptions
from orchestrator.matrix.experiment import Experiment
from orchestrator.matrix.prune import Footprint, Size, footprint, ladder_key, pruned_by
from orchestrator.results.aggregate import aggregate
from orchestrator.results.markdown import status_counts
from orchestrator.results.plots import status_kind
from orchestrator.results.tablecolumns import measured

BASE = """
frameworks:
  ddp: {accelerate_config: accelerate-ddp.yaml}
matrix:
  effective_batch_size: [2, 4, 8]
  max_seq_len: [256, 512]
  packing: [false, true]
scenarios:
  - name: s
    framework_config: [null, ddp]
    arguments:
      model_name_or_path: org/m
      peft_method: lora
      target_modules: [q_proj]
    sweep:
      r: [8, 16]
      activation_checkpointing: [true, false]
"""


@pytest.fixture
def cells(plan) -> list[Experiment]:
    return list(plan(BASE, num_gpus=(1, 2)).experiments)


def _pick(cells: list[Experiment], **want: object) -> Experiment:
    def value(e: Experiment, key: str) -> object:
        if key in ("framework", "num_gpus", "max_seq_len", "packing"):
            return getattr(e, key)
        if key == "per_device":
            return e.per_device_train_batch_size
        return e.arguments.get(key)

    (found,) = [e for e in cells if all(value(e, k) == v for k, v in want.items())]
    return found


BASE_CELL = {
    "framework": "none",
    "num_gpus": 1,
    "r": 8,
    "activation_checkpointing": True,
    "per_device": 2,
    "max_seq_len": 256,
    "packing": False,
}


def test_cells_that_differ_only_in_size_share_a_ladder(cells) -> None:
    small = _pick(cells, **BASE_CELL)
    bigger = _pick(cells, **{**BASE_CELL, "per_device": 8, "max_seq_len": 512, "packing": True})
    assert ladder_key(small) == ladder_key(bigger)
    assert small.gradient_accumulation_steps == bigger.gradient_accumulation_steps == 1
    assert small.effective_batch_size != bigger.effective_batch_size


@pytest.mark.parametrize(
    "change",
    [
        {"framework": "ddp"},
        {"num_gpus": 2, "per_device": 1},
        {"r": 16},
        {"activation_checkpointing": False},
    ],
    ids=["framework", "gpu-count", "lora-r", "activation-checkpointing"],
)
def test_what_else_changes_memory_splits_ladders(cells, change: dict[str, object]) -> None:
    small = _pick(cells, **BASE_CELL)
    other = _pick(cells, **{**BASE_CELL, **change})
    assert ladder_key(small) != ladder_key(other)
    # so an OOM of the small cell prunes nothing of the other, however large it is
    assert pruned_by(footprint(other), [footprint(small)]) is None


def test_model_dtype_profile_and_scenario_split_ladders(cells) -> None:
    small = _pick(cells, **BASE_CELL)
    for other in (
        replace(small, model_name_or_path="org/other"),
        replace(small, arguments={**small.arguments, "torch_dtype": "float32"}),
        replace(small, profile_steps=3),
        replace(small, scenario="t"),
        replace(small, device="cpu"),
    ):
        assert ladder_key(other) != ladder_key(small)
    # the ids, repeat and position name a run, not what it needs
    same = replace(small, experiment_id="x", cell_id="y", repeat=2, position=99)
    assert ladder_key(same) == ladder_key(small)


def test_needing_at_least_as_much_memory() -> None:
    base = Size(4, 512, False)
    assert Size(4, 512, False).needs_at_least(base)
    assert Size(8, 512, False).needs_at_least(base)
    assert Size(4, 1024, False).needs_at_least(base)
    assert Size(4, 512, True).needs_at_least(base)
    assert not Size(2, 1024, True).needs_at_least(base)  # a smaller batch: not certain
    assert not Size(8, 256, True).needs_at_least(base)  # a shorter sequence: not certain
    assert not Size(4, 512, False).needs_at_least(Size(4, 512, True))  # off < on
    # no sequence length (an image task): compared on the batch alone
    assert Size(8).needs_at_least(Size(4)) and not Size(4).needs_at_least(Size(8))


def test_pruned_by_names_the_out_of_memory_cell() -> None:
    oom = Footprint("a.small", "fam", Size(4, 512, False))
    assert pruned_by(Footprint("a.big", "fam", Size(8, 512, True)), [oom]) == "a.small"
    assert pruned_by(Footprint("a.same", "fam", Size(4, 512, False)), [oom]) == "a.small"
    assert pruned_by(Footprint("a.less", "fam", Size(2, 1024, True)), [oom]) is None
    assert pruned_by(Footprint("b.big", "other", Size(8, 1024, True)), [oom]) is None


def test_a_cell_that_accumulates_does_not_prune_one_that_does_not() -> None:
    # accumulation keeps the gradients through the next micro-batch: pd 4 × GA 4 running
    # out of memory says nothing certain of pd 16 × GA 1
    oom = Footprint("ga4", "fam", Size(4, 512, True, accumulates=True))
    assert pruned_by(Footprint("ga1", "fam", Size(16, 512, True)), [oom]) is None
    assert pruned_by(Footprint("pd8ga2", "fam", Size(8, 512, True, True)), [oom]) == "ga4"
    # the other way round it is certain
    plain = Footprint("pd4", "fam", Size(4, 512, True))
    assert pruned_by(Footprint("pd8ga2", "fam", Size(8, 512, True, True)), [plain]) == "pd4"


def test_an_ok_run_at_least_as_large_overrules_an_out_of_memory() -> None:
    # repeat 0 of a cell ran ok, repeat 1 ran out of memory (fragmentation, a stray
    # process): the size fits, so neither its repeats nor larger cells are pruned for it
    oom = Footprint("c.r1", "fam", Size(4, 512, True))
    ok = Footprint("c", "fam", Size(4, 512, True))
    assert pruned_by(Footprint("c.r2", "fam", Size(4, 512, True)), [oom], [ok]) is None
    assert pruned_by(Footprint("big", "fam", Size(8, 512, True)), [oom], [ok]) is None
    # an ok run of a smaller size, or of another ladder, overrules nothing
    smaller = Footprint("s", "fam", Size(2, 512, True))
    other = Footprint("o", "other", Size(64, 4096, True))
    assert pruned_by(Footprint("big", "fam", Size(8, 512, True)), [oom], [smaller, other]) == "c.r1"


# -- the run context's hook ------------------------------------------------------------


SMALL = """
frameworks:
  ddp: {accelerate_config: accelerate-ddp.yaml}
matrix:
  effective_batch_size: [2, 4]
  max_seq_len: [64]
scenarios:
  - name: s
    device: cpu
    framework_config: [null, ddp]
    arguments: {model_name_or_path: tiny-llama}
"""


def _context(tmp_path: Path, plan, **options: object) -> RunContext:  # type: ignore[no-untyped-def]
    return RunContext(
        plan,
        ResultsLayout(tmp_path),
        RunOptions(**options),  # type: ignore[arg-type]
        Progress(len(plan.experiments), stream=io.StringIO()),
        say=lambda line: None,
    )


def _by(plan, framework: str, per_device: int) -> Experiment:  # type: ignore[no-untyped-def]
    (found,) = [
        e
        for e in plan.experiments
        if e.framework == framework and e.per_device_train_batch_size == per_device
    ]
    return found


def test_prepare_prunes_after_an_oom_of_the_same_ladder(tmp_path, plan) -> None:
    the_plan = plan(SMALL, num_gpus=(1,), device="cpu")
    small, big = _by(the_plan, "none", 2), _by(the_plan, "none", 4)
    other = _by(the_plan, "ddp", 4)
    ctx = _context(tmp_path, the_plan)
    assert ctx.prepare(small) is not None
    ctx.record(small.experiment_id, Outcome(status="oom", error="out of memory"))
    assert ctx.prepare(big) is None
    outcome = ctx.outcomes[big.experiment_id]
    assert outcome.status == "skipped" and is_pruned(outcome.status, outcome.error)
    assert outcome.error == f"pruned: {small.experiment_id} ran out of memory"
    run = ResultsLayout(tmp_path).run(big.experiment_id)
    assert [p.name for p in run.dir.iterdir()] == ["outcome.json"]
    assert read_outcome(run) == outcome
    # another framework is another ladder: it launches
    assert ctx.prepare(other) is not None
    # a pruned experiment leaves the run's exit code at 0
    assert outcome.status in ACCEPTABLE


def test_no_prune_launches_everything(tmp_path, plan) -> None:
    the_plan = plan(SMALL, num_gpus=(1,), device="cpu")
    small, big = _by(the_plan, "none", 2), _by(the_plan, "none", 4)
    ctx = _context(tmp_path, the_plan, prune=False)
    ctx.record(small.experiment_id, Outcome(status="oom", error="out of memory"))
    assert ctx.prepare(big) is not None


def test_a_failure_that_is_not_oom_prunes_nothing(tmp_path, plan) -> None:
    the_plan = plan(SMALL, num_gpus=(1,), device="cpu")
    small, big = _by(the_plan, "none", 2), _by(the_plan, "none", 4)
    ctx = _context(tmp_path, the_plan)
    ctx.record(small.experiment_id, Outcome(status="failed", error="boom"))
    assert ctx.prepare(big) is not None


def test_resume_decides_pruning_afresh(tmp_path, plan) -> None:
    the_plan = plan(SMALL, num_gpus=(1,), device="cpu")
    big = _by(the_plan, "none", 4)
    run = ResultsLayout(tmp_path).run(big.experiment_id)
    run.dir.mkdir(parents=True)
    write_outcome(
        run, Outcome(status="skipped", error=Skip(cause="out_of_memory", follows="s.earlier").error)
    )
    # no OOM in this run: the pruned experiment is not done, and runs as a first attempt
    ready = _context(tmp_path, the_plan, resume=True).prepare(big)
    assert ready is not None and ready.attempt == 1
    assert not run.outcome.exists() and not run.attempts.exists()


# -- the tables --------------------------------------------------------------------------


def _rows() -> pd.DataFrame:
    return pd.DataFrame(
        [
            {"cell_id": "a", "repeat": 0, "status": "ok", "error": None, "tokens_per_second_global": 100.0},
            {"cell_id": "a", "repeat": 1, "status": "skipped", "error": None, "tokens_per_second_global": 110.0},
            {"cell_id": "b", "repeat": 0, "status": "oom", "error": "CUDA out of memory", "tokens_per_second_global": None},
            {"cell_id": "b", "repeat": 1, "status": "skipped", "error": Skip(cause="out_of_memory", follows="b").error, "tokens_per_second_global": None},
            {"cell_id": "c", "repeat": 0, "status": "skipped", "error": Skip(cause="out_of_memory", follows="b").error, "tokens_per_second_global": None},
        ]
    )  # fmt: skip


def test_a_pruned_row_is_never_a_measurement() -> None:
    rows = _rows()
    assert list(measured(rows)) == [True, True, False, False, False]
    cells = aggregate(rows).set_index("cell_id")
    assert cells.loc["a", "status"] == "ok" and cells.loc["a", "repeats_ok"] == 2
    assert cells.loc["c", "status"] == "pruned" and cells.loc["c", "repeats_ok"] == 0
    assert cells.loc["c", "error"] == "pruned: b ran out of memory"
    assert cells.loc["b", "status"] == "oom×1 pruned×1"
    assert status_counts(rows) == "ok 1, oom 1, pruned 2, skipped 1"
    assert status_kind("pruned") == "pruned" and status_kind("oom×1 pruned×1") == "oom"


# -- turning it off ----------------------------------------------------------------------


def test_no_prune_on_the_command_line_and_in_the_shell_script(tmp_path: Path) -> None:
    from orchestrator.cli.app import build_parser

    assert build_parser().parse_args(["run", "--no-prune"]).no_prune is True
    assert build_parser().parse_args(["run"]).no_prune is False
    assert script_argv(tmp_path, PRUNE="false").rstrip().endswith("--no-prune")
    assert "--no-prune" not in script_argv(tmp_path)
    assert "--no-prune" not in script_argv(tmp_path, PRUNE="true")
    assert "PRUNE must be true or false, got 'maybe'" in script_argv(tmp_path, PRUNE="maybe")
