"""Stopping early: once two experiments of a model failed with the same error, its others
are spared (the run context's hook, the tables, and the flag). A real run of it:
tests/e2e/test_stackcheck_e2e.py."""

from __future__ import annotations

import io
import signal
from pathlib import Path

import pandas as pd
from scriptargs import script_argv

from orchestrator.contract.layout import ResultsLayout
from orchestrator.contract.outcome import (
    ACCEPTABLE,
    Outcome,
    Skip,
    is_not_launched,
    read_outcome,
    shown,
    write_outcome,
)
from orchestrator.executors.base import RunContext, same_error
from orchestrator.executors.console import Progress
from orchestrator.job.classify import classify
from orchestrator.job.execute import RunOptions
from orchestrator.matrix.experiment import Experiment
from orchestrator.results.aggregate import aggregate
from orchestrator.results.markdown import not_launched_note, status_counts
from orchestrator.results.tablecolumns import measured

FOUR = """
matrix:
  effective_batch_size: [1, 2, 4, 8]
scenarios:
  - name: s
    device: cpu
    arguments: {model_name_or_path: tiny-llama}
  - name: t
    device: cpu
    arguments: {model_name_or_path: config:llama-3.2-1b}
"""


def _context(tmp_path: Path, plan, **options: object) -> RunContext:  # type: ignore[no-untyped-def]
    return RunContext(
        plan,
        ResultsLayout(tmp_path),
        RunOptions(**options),  # type: ignore[arg-type]
        Progress(len(plan.experiments), stream=io.StringIO()),
        say=lambda line: None,
    )


def _cells(plan, scenario: str) -> list[Experiment]:  # type: ignore[no-untyped-def]
    found = [e for e in plan.experiments if e.scenario == scenario]
    return sorted(found, key=lambda e: e.effective_batch_size)


def test_two_alike_failures_spare_the_rest_of_that_model(tmp_path, plan) -> None:
    the_plan = plan(FOUR, num_gpus=(1,), device="cpu")
    a, b, c, d = _cells(the_plan, "s")
    other = _cells(the_plan, "t")[0]
    ctx = _context(tmp_path, the_plan)
    # the error names the experiment's own folder and a memory address: still the same
    for e in (a, b):
        ctx.record(
            e.experiment_id,
            Outcome(status="failed", error=f"runs/{e.experiment_id}: bad data at {id(e):#x}"),
        )
    assert ctx.prepare(c) is None
    outcome = ctx.outcomes[c.experiment_id]
    assert outcome.status == "skipped" and outcome.status in ACCEPTABLE
    assert outcome.error == f"not launched: same error as {a.experiment_id}"
    assert (
        is_not_launched(outcome.status, outcome.error)
        and shown(outcome.status, outcome.error) == "spared"
    )
    run = ResultsLayout(tmp_path).run(c.experiment_id)
    assert [p.name for p in run.dir.iterdir()] == ["outcome.json"] and read_outcome(run) == outcome
    assert ctx.prepare(d) is None
    # another model launches
    assert ctx.prepare(other) is not None


def test_one_failure_or_two_different_ones_spare_nothing(tmp_path, plan) -> None:
    the_plan = plan(FOUR, num_gpus=(1,), device="cpu")
    a, b, c, _ = _cells(the_plan, "s")
    ctx = _context(tmp_path, the_plan)
    ctx.record(a.experiment_id, Outcome(status="failed", error="bad data"))
    assert ctx.prepare(c) is not None
    ctx.record(b.experiment_id, Outcome(status="failed", error="another fault"))
    assert ctx.prepare(c) is not None


def test_repeats_of_one_cell_count_once_and_other_trainers_are_not_spared(tmp_path, plan) -> None:
    the_plan = plan(
        FOUR + "    sweep: {trainer: [sft, hf]}\n", num_gpus=(1,), device="cpu", repeats=2
    )
    cells = [e for e in the_plan.experiments if e.scenario == "t"]
    sft = sorted(
        (e for e in cells if e.trainer == "sft"), key=lambda e: (e.effective_batch_size, e.repeat)
    )
    hf = [e for e in cells if e.trainer == "hf"]
    ctx = _context(tmp_path, the_plan)
    # one cell failing in both its repeats is one cell: nothing is spared
    for e in sft[:2]:
        assert e.cell_id == sft[0].cell_id
        ctx.record(e.experiment_id, Outcome(status="failed", error="TRL refused it"))
    assert ctx.prepare(sft[2]) is not None
    # a second sft cell failing alike spares the sft cells, not those of trainer hf
    ctx.record(sft[2].experiment_id, Outcome(status="failed", error="TRL refused it"))
    assert ctx.prepare(sft[4]) is None
    assert ctx.prepare(hf[0]) is not None


def test_failures_that_may_be_memory_or_say_nothing_never_spare(tmp_path, plan) -> None:
    the_plan = plan(FOUR, num_gpus=(1,), device="cpu")
    a, b, c, _ = _cells(the_plan, "s")
    sigkill = classify(returncode=-signal.SIGKILL, result=None)
    sigkill_not_oom = classify(returncode=-signal.SIGKILL, result=None, host_oom_checked=True)
    silent = classify(returncode=1, result=None)
    assert sigkill.error is not None and "whether by the out-of-memory killer is unknown" in (
        sigkill.error
    )
    assert silent.error == "exit code 1 and no error output"
    for verdict in (sigkill, sigkill_not_oom, silent):
        ctx = _context(tmp_path, the_plan)
        for e in (a, b):
            ctx.record(
                e.experiment_id,
                Outcome(status=verdict.status, error=verdict.error, failure=verdict.failure),
            )
        assert ctx.prepare(c) is not None, verdict.error


def test_memory_and_time_are_not_systematic(tmp_path, plan) -> None:
    the_plan = plan(FOUR, num_gpus=(1,), device="cpu")
    a, b, c, _ = _cells(the_plan, "s")
    for status in ("oom", "timeout", "interrupted"):
        ctx = _context(tmp_path, the_plan, prune=False)
        for e in (a, b):
            ctx.record(e.experiment_id, Outcome(status=status, error="same"))
        assert ctx.prepare(c) is not None, status


def test_no_stop_early_launches_everything(tmp_path, plan) -> None:
    the_plan = plan(FOUR, num_gpus=(1,), device="cpu")
    a, b, c, _ = _cells(the_plan, "s")
    ctx = _context(tmp_path, the_plan, stop_early=False)
    for e in (a, b):
        ctx.record(e.experiment_id, Outcome(status="failed", error="bad data"))
    assert ctx.prepare(c) is not None


def test_resume_decides_sparing_afresh(tmp_path, plan) -> None:
    the_plan = plan(FOUR, num_gpus=(1,), device="cpu")
    c = _cells(the_plan, "s")[2]
    run = ResultsLayout(tmp_path).run(c.experiment_id)
    run.dir.mkdir(parents=True)
    write_outcome(
        run, Outcome(status="skipped", error=Skip(cause="same_error", follows="s.earlier").error)
    )
    ready = _context(tmp_path, the_plan, resume=True).prepare(c)
    assert ready is not None and ready.attempt == 1
    assert not run.outcome.exists()


def test_same_error_leaves_the_fault_and_takes_out_the_experiment(plan) -> None:
    the_plan = plan(FOUR, num_gpus=(1,), device="cpu")
    a, b = _cells(the_plan, "s")[:2]
    assert same_error(f"x {a.experiment_id} at 0xdeadbeef", a) == same_error(
        f"x {b.experiment_id} at 0x1234", b
    )
    assert same_error("x 1", a) != same_error("x 2", a)


def test_a_spared_row_is_never_a_measurement_and_the_summary_says_why() -> None:
    first = "s.m.none.g1.eb1-aaaa"
    rows = pd.DataFrame(
        [
            {"experiment_id": first, "cell_id": "a", "repeat": 0, "status": "failed", "error": "bad data"},
            {"experiment_id": "s.m.none.g1.eb2-bbbb", "cell_id": "b", "repeat": 0, "status": "failed", "error": "bad data"},
            {"experiment_id": "s.m.none.g1.eb4-cccc", "cell_id": "c", "repeat": 0, "status": "skipped", "error": Skip(cause="same_error", follows=first).error},
            {"experiment_id": "s.m.none.g1.eb4-cccc.r1", "cell_id": "c", "repeat": 1, "status": "skipped", "error": Skip(cause="same_error", follows=first).error},
        ]
    )  # fmt: skip
    assert not measured(rows).any()
    cells = aggregate(rows).set_index("cell_id")
    assert cells.loc["c", "status"] == "spared"
    assert status_counts(rows) == "failed 2, spared 2"
    (note, blank) = not_launched_note(rows)
    assert note.startswith("**Spared**: 2 experiment(s) were not launched")
    assert f"(first failure: `{first}` (bad data))" in note and "--no-stop-early" in note
    assert "disk" not in note
    assert blank == ""
    assert not_launched_note(rows.iloc[:2]) == []
    # after a full disk, the note says so, and names the failure that found it
    full = "disk full: /r/runs/x has 0 B free (No space left on device)"
    rows.loc[0, "error"] = full
    rows.loc[2:, "error"] = Skip(cause="disk_full", follows=first, detail="/r/runs/x").error
    (note, _) = not_launched_note(rows)
    assert "the disk was full when an earlier experiment ran" in note, note
    assert f"(first: `{first}` ({full}))" in note and "two cells" not in note


def test_no_stop_early_on_the_command_line_and_in_the_shell_script(tmp_path: Path) -> None:
    from orchestrator.cli.app import build_parser

    assert build_parser().parse_args(["run", "--no-stop-early"]).no_stop_early is True
    assert build_parser().parse_args(["run"]).no_stop_early is False
    assert script_argv(tmp_path, STOP_EARLY="false").rstrip().endswith("--no-stop-early")
    assert "--no-stop-early" not in script_argv(tmp_path)
    assert "--no-stop-early" not in script_argv(tmp_path, STOP_EARLY="true")


def test_packed_jobs_queued_before_the_failures_are_spared_when_their_turn_comes(
    tmp_path, plan, monkeypatch
) -> None:
    """``--pack`` prepares every job before it launches any: the check happens again as
    each one is about to start."""
    from orchestrator.executors import packed

    the_plan = plan(FOUR, num_gpus=(1,), device="cpu", filters=("s",))
    launched: list[str] = []

    def fake_run(experiment, run, layout, options, placement, **kwargs):  # type: ignore[no-untyped-def]
        launched.append(experiment.experiment_id)
        return Outcome(status="failed", error="bad data")

    monkeypatch.setattr(packed, "run_experiment", fake_run)
    ctx = _context(tmp_path, the_plan)
    packed.PackedExecutor(slots=1).run(ctx)
    assert len(launched) == 2
    statuses = sorted(shown(o.status, o.error) for o in ctx.outcomes.values())
    assert statuses == ["failed", "failed", "spared", "spared"]
