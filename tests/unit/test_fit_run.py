"""``tunematrix fit`` around the search: probes through an executor, files, resume, config, CLI.

The executor here launches nothing: it answers each probe from an oracle of the
per-device batch, through the same RunContext the real executors use, so the
fit's bookkeeping (folders, rows, fit.json, resume) is exercised as it runs.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from orchestrator.cli.app import main
from orchestrator.contract.errors import ConfigError, UserError
from orchestrator.contract.layout import ResultsLayout
from orchestrator.contract.outcome import Outcome, write_outcome
from orchestrator.executors.base import Executor, RunContext
from orchestrator.job.execute import RunOptions
from orchestrator.matrix.expand import Selection, build_plan
from orchestrator.results.fitreport import read_fit, summary_section
from orchestrator.running.fitrun import FitOptions, run_fit

GIB = 2**30

SCENARIOS = """
frameworks:
  ddp: {accelerate_config: accelerate-ddp.yaml}
matrix:
  effective_batch_size: [2, 4]
  max_seq_len: [64]
scenarios:
  - name: s
    device: cpu
    framework_config: [ddp]
    search: {max: per_device_train_batch_size, limit: 64}
    arguments:
      model_name_or_path: m
  - name: plain
    device: cpu
    framework_config: [ddp]
    arguments:
      model_name_or_path: m
"""


class OracleExecutor(Executor):
    """Records each probe's outcome from ``oracle(per_device_batch)``: (status, peak bytes)."""

    name = "oracle"
    title = "oracle"
    summary = "answers probes from a function (tests)"

    def __init__(self, oracle: Callable[[int], tuple[str, float | None]]) -> None:
        self.oracle = oracle
        self.launched: list[int] = []

    def run(self, ctx: RunContext) -> None:
        for e in ctx.plan.experiments:
            ready = ctx.prepare(e)
            if ready is None:
                continue
            value = e.per_device_train_batch_size
            self.launched.append(value)
            status, peak = self.oracle(value)
            ready.run.dir.mkdir(parents=True, exist_ok=True)
            memory = {"mem_tree_peak_pss_bytes": peak} if peak is not None else {}
            error = {"ok": None, "oom": "host memory: killed", "failed": "ValueError: boom"}
            outcome = Outcome(status=status, error=error.get(status), wall_s=1.5, memory=memory)
            result = {"status": status, "metrics": {"tokens_per_second_global": 100.0 * value}}
            ready.run.result.write_text(json.dumps(result))
            write_outcome(ready.run, outcome)
            ctx.record(e.experiment_id, outcome)


def up_to(answer: int, gib_per_sample: float = 0.5) -> Callable[[int], tuple[str, float | None]]:
    return lambda v: ("ok", v * gib_per_sample * GIB) if v <= answer else ("oom", None)


@pytest.fixture
def fit(load, tmp_path):
    config = load(SCENARIOS)
    plan = build_plan(config, Selection(device="cpu", num_gpus=(1,)), 0)

    def _fit(oracle, resume: bool = False, **options: object):
        executor = OracleExecutor(oracle)
        report = run_fit(
            config,
            plan,
            tmp_path / "res",
            RunOptions(resume=resume, report=False),
            FitOptions(**options),  # type: ignore[arg-type]
            executor=executor,
            argv=["tunematrix", "fit"],
            log=lambda text: None,
        )
        return report, executor

    return _fit


def test_a_fit_finds_the_answer_and_writes_its_files(fit, tmp_path) -> None:
    report, executor = fit(up_to(5), memory_gib=100)
    (search,) = report.record.families  # eb 2 and 4 are one search; 'plain' has no search
    assert len(search.cells) == 2
    assert executor.launched == [1, 2, 4, 8, 6, 5]
    assert (search.largest_fit, search.first_too_big, search.ending) == (5, 6, "bracketed")
    assert search.tokens_per_second == 500.0
    assert search.peak_memory_bytes == 2.5 * GIB
    assert search.why_too_big == "oom: host memory: killed"
    assert report.exit_code == 0
    root = tmp_path / "res"
    with (root / "raw_summary.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert sorted(int(r["per_device_train_batch_size"]) for r in rows) == [1, 2, 4, 5, 6, 8]
    assert {r["status"] for r in rows} == {"ok", "oom"}
    assert len(list((root / "runs").iterdir())) == 6
    saved = read_fit(root / "fit.json")
    assert saved is not None and saved.families[0].largest_fit == 5
    assert [p.value for p in saved.families[0].probes] == [1, 2, 4, 8, 6, 5]
    text = (root / "fit.md").read_text()
    assert "| 5 | ok | fits |" in text and "| 6 | oom | too_big: host memory: killed |" in text


def test_a_resumed_fit_reuses_ok_and_oom_probes(fit) -> None:
    fit(up_to(5), memory_gib=100)
    report, executor = fit(up_to(5), resume=True, memory_gib=100)
    assert executor.launched == []
    assert all(p.reused for p in report.record.families[0].probes)
    assert report.record.families[0].largest_fit == 5


def test_a_failed_probe_stops_and_is_tried_again_on_resume(fit) -> None:
    def flaky(v: int) -> tuple[str, float | None]:
        return ("failed", None) if v == 4 else up_to(5)(v)

    report, executor = fit(flaky, memory_gib=100)
    (search,) = report.record.families
    assert executor.launched == [1, 2, 4]
    assert search.ending == "stopped" and search.largest_fit == 2
    assert search.stopped_by == "per_device_train_batch_size 4: failed: ValueError: boom"
    assert report.exit_code == 1
    report, executor = fit(up_to(5), resume=True, memory_gib=100)
    assert executor.launched == [4, 8, 6, 5]  # 1 and 2 reused, the failed 4 run again
    assert report.record.families[0].largest_fit == 5


def test_the_margin_counts_a_run_near_the_capacity_as_not_fitting(fit) -> None:
    # 0.5 GiB per sample, 4 GiB device, margin 0.25: above 3 GiB does not fit, so 6 is too big
    report, _ = fit(up_to(100), memory_gib=4, margin=0.25, limit=16)
    (search,) = report.record.families
    assert (search.largest_fit, search.first_too_big) == (6, 7)
    assert search.why_too_big is not None and "above 75% of 4.00 GiB" in search.why_too_big


def test_a_probe_still_queued_stops_the_search(fit) -> None:
    report, _ = fit(lambda v: ("planned", None), memory_gib=100)
    (search,) = report.record.families
    assert search.ending == "stopped"
    assert "waits for each probe" in str(search.stopped_by)


def test_the_command_line_overrides_the_scenario_and_can_search_any(fit) -> None:
    report, executor = fit(
        up_to(100), search="per_device_train_batch_size", limit=3, memory_gib=100
    )
    # both scenarios now; each stops at the limit 3
    assert [f.scenario for f in report.record.families] == ["s", "plain"]
    assert all((f.largest_fit, f.ending) == (3, "limit") for f in report.record.families)
    assert executor.launched == [1, 2, 3, 1, 2, 3]


def test_nothing_to_search_is_one_line(load, tmp_path) -> None:
    config = load(
        SCENARIOS.replace("    search: {max: per_device_train_batch_size, limit: 64}\n", "")
    )
    plan = build_plan(config, Selection(device="cpu", num_gpus=(1,)), 0)
    with pytest.raises(UserError, match="no selected scenario has search:"):
        run_fit(
            config,
            plan,
            tmp_path / "res",
            RunOptions(),
            FitOptions(),
            executor=OracleExecutor(up_to(1)),
            argv=[],
        )


def test_the_summary_section_reads_the_fit_of_a_run(fit, tmp_path) -> None:
    assert summary_section(tmp_path) == []
    fit(up_to(5), memory_gib=100)
    (tmp_path / "res").rename(tmp_path / "fit")
    text = "\n".join(summary_section(tmp_path))
    assert "## Largest that fits" in text and "(fit/fit.md)" in text
    assert "| per_device_train_batch_size | 5 |" in text


# ---------------------------------------------------------------------------
# The search: key and the command line
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("search", "message"),
    [
        ("{max: learning_rate}", "input should be 'per_device_train_batch_size' or 'max_seq_len'"),
        ("{max: max_seq_len, min: 512, limit: 256}", "min 512 is above limit 256"),
        ("{max: max_seq_len, margin: 1.0}", "less than 1"),
        ("{max: max_seq_len, step: 2}", "unknown key 'step'"),
        ("{min: 2}", "missing required key 'max'"),
    ],
)
def test_a_bad_search_key_is_one_line_with_its_line(load, search, message) -> None:
    text = SCENARIOS.replace("{max: per_device_train_batch_size, limit: 64}", search)
    with pytest.raises(ConfigError) as info:
        load(text)
    line = str(info.value)
    assert message in line, line
    assert "scenarios.yaml:10" in line, line
    assert "\n" not in line


def test_searching_a_length_a_task_does_not_take_names_the_scenario(load, tmp_path) -> None:
    text = SCENARIOS.replace(
        "search: {max: per_device_train_batch_size, limit: 64}", "search: {max: max_seq_len}"
    ).replace(
        "model_name_or_path: m\n", "model_name_or_path: m\n      task: image-classification\n", 1
    )
    text = text.replace("  max_seq_len: [64]\n", "")
    config = load(text)
    plan = build_plan(config, Selection(device="cpu", num_gpus=(1,), filters=("s",)), 0)
    with pytest.raises(ConfigError, match=r"cannot search max_seq_len in scenario 's'.*takes no"):
        run_fit(
            config,
            plan,
            tmp_path / "r",
            RunOptions(),
            FitOptions(),
            executor=OracleExecutor(up_to(1)),
            argv=[],
        )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--margin", "1.5"], "argument --margin: 1.5 is not a fraction in [0, 1)"),
        (["--max", "r"], "argument --max: invalid choice: 'r'"),
        (["--probe-steps", "0"], "argument --probe-steps: 0 is not a positive integer"),
    ],
)
def test_bad_fit_flags_are_one_line(capsys, args, message) -> None:
    with pytest.raises(SystemExit) as info:
        main(["fit", *args])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_min_above_limit_on_the_command_line_is_refused(capsys) -> None:
    assert main(["fit", "--min", "8", "--limit", "4"]) == 2
    assert "--min 8 is above --limit 4" in capsys.readouterr().err


def test_fit_help_has_an_example() -> None:
    from orchestrator.cli.app import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "command")
    text = sub.choices["fit"].format_help()  # type: ignore[index]
    assert "Examples:\n  tunematrix fit " in text


def test_the_layout_moves_a_fit_aside_with_its_run(tmp_path: Path) -> None:
    from orchestrator.running.resultsdir import move_aside

    layout = ResultsLayout(tmp_path / "r")
    layout.fit.mkdir(parents=True)
    layout.fit_json.write_text("{}")
    moved = move_aside(layout.root)
    assert moved is not None and (moved / "fit").is_dir() and (moved / "fit.json").is_file()


def test_a_gpu_search_starts_from_the_prediction(load, tmp_path, monkeypatch) -> None:
    """A GPU search starts at the largest doubling of its lower bound predicted within the
    margin (the check's prediction stands in: each probe's peak is 8 GB a sample)."""
    from orchestrator.contract.gpumemory import MemoryPrediction
    from orchestrator.running import stackcheck

    asked: list[int] = []

    def check_stack(plan, **kwargs):  # type: ignore[no-untyped-def]
        assert kwargs.get("memory") is not None
        done = stackcheck.StackCheck(plan)
        for e in plan.experiments:
            asked.append(e.per_device_train_batch_size)
            peak = e.per_device_train_batch_size * 8 * 10**9
            done.memory[e.cell_id] = MemoryPrediction(peak_bytes=peak, terms={"activations": peak})
        return done

    monkeypatch.setattr(stackcheck, "check_stack", check_stack)
    config = load(SCENARIOS.replace("device: cpu", "device: gpu"))
    plan = build_plan(config, Selection(device="gpu", num_gpus=(1,)), 1)
    executor = OracleExecutor(up_to(10))
    report = run_fit(
        config,
        plan,
        tmp_path / "res",
        RunOptions(report=False),
        FitOptions(memory_gib=100),
        executor=executor,
        argv=["tunematrix", "fit"],
        log=lambda text: None,
    )
    (search,) = report.record.families
    # 1 to 64 (the limit) predicted; 8's 68.6 GB on NVML is within 90% of 100 GiB, 16's is not
    assert asked == [1, 2, 4, 8, 16, 32, 64]
    assert executor.launched == [8, 16, 12, 10, 11]
    assert (search.largest_fit, search.first_too_big) == (10, 11)
    assert any(
        n.startswith("started from per_device_train_batch_size 8: predicted") for n in search.notes
    )
