"""The check before launch, the parent's side: the child's answer becomes one line at the
place that set the refused setting, and each model's resolution reaches its jobs.

The child's side runs for real in tests/e2e/test_stackcheck_e2e.py (and in the floor
env); here its answer is given, as it would come back.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import pytest
from scriptargs import script_argv

from orchestrator.contract.errors import ConfigError
from orchestrator.job.execute import child_environment
from orchestrator.matrix.experiment import Experiment
from orchestrator.running.stackcheck import check_stack

SCENARIOS = """\
matrix:
  effective_batch_size: [4, 8]
scenarios:
  - name: a
    device: cpu
    arguments:
      model_name_or_path: org/cached
      lr_scheduler_type: cosine
  - name: b
    device: cpu
    arguments:
      model_name_or_path: tiny-llama
"""
VERSIONS = {"torch": "2.11.0", "transformers": "5.17.0", "trl": "1.16.0", "peft": "0.21.0"}


def _answer(**overrides: Any) -> Any:
    def run(python: str, cells: Sequence[Experiment]) -> dict[str, Any]:
        assert python == sys.executable
        answer: dict[str, Any] = {
            "versions": VERSIONS,
            "models": {
                "org/cached": {"cell": cells[0].cell_id, "where": "hub cache", "offline": False},
                "tiny-llama": {"cell": cells[-1].cell_id, "where": "shipped", "offline": False},
            },
            "problems": [],
            "unbuilt": 0,
        }
        for key, value in overrides.items():
            answer[key] = value(cells) if callable(value) else value
        return answer

    return run


def test_the_cells_go_once_each_and_the_summary_names_the_versions(plan) -> None:
    built = plan(SCENARIOS, num_gpus=(1,), device="cpu", repeats=2)
    seen: list[list[str]] = []

    def run(python: str, cells: Sequence[Experiment]) -> dict[str, Any]:
        seen.append([e.cell_id for e in cells])
        return _answer()(python, cells)

    checked = check_stack(built, run=run)
    assert len(built.experiments) == 8 and len(seen) == 1 and len(seen[0]) == 4
    assert checked.plan is built
    (line, *models) = checked.lines()
    assert line.startswith(
        "checked 4 cell(s) against torch 2.11.0, transformers 5.17.0, trl 1.16.0, peft 0.21.0 ("
    )
    assert models == ["  model org/cached: hub cache", "  model tiny-llama: shipped"]


def test_a_refused_setting_is_one_line_at_the_line_that_set_it(plan) -> None:
    built = plan(SCENARIOS, num_gpus=(1,), device="cpu")
    refused = {
        "key": "lr_scheduler_type",
        "library": "transformers",
        "version": "5.17.0",
        "message": "transformers 5.17.0's TrainingArguments refuses 'cosine': no",
    }
    with pytest.raises(ConfigError) as err:
        check_stack(
            built,
            run=_answer(
                problems=lambda cells: (
                    [{"cell": e.cell_id, **refused} for e in cells if e.scenario == "a"]
                    + [{"cell": cells[-1].cell_id, "key": None, "message": "another"}]
                )
            ),
        )
    message = str(err.value)
    assert "\n" not in message
    assert message.endswith(
        "scenarios.yaml:8: scenarios[0].arguments.lr_scheduler_type: transformers 5.17.0's "
        "TrainingArguments refuses 'cosine': no (2 cell(s) of a; 1 other problem(s) after "
        "it); nothing was started"
    )


def test_a_problem_of_no_one_setting_points_at_its_scenario(plan) -> None:
    built = plan(SCENARIOS, num_gpus=(1,), device="cpu")
    with pytest.raises(ConfigError, match=r"scenarios.yaml:9: scenarios\[1\]: dataset file"):
        check_stack(
            built,
            run=_answer(
                problems=lambda cells: [
                    {"cell": cells[-1].cell_id, "key": None, "message": "dataset file not found"}
                ]
            ),
        )


def test_a_model_that_leads_nowhere_is_said_once_for_all_its_cells(plan) -> None:
    built = plan(SCENARIOS, num_gpus=(1,), device="cpu")

    def models(cells: Sequence[Experiment]) -> dict[str, Any]:
        return {"org/cached": {"cell": cells[0].cell_id, "error": "model 'org/cached': gone"}}

    with pytest.raises(ConfigError) as err:
        check_stack(built, run=_answer(models=models))
    assert str(err.value).endswith(
        "scenarios.yaml:7: scenarios[0].arguments.model_name_or_path: model 'org/cached': "
        "gone (2 cell(s) of a); nothing was started"
    )


def test_a_model_found_in_the_cache_while_the_hub_is_silent_runs_offline(plan) -> None:
    built = plan(SCENARIOS, num_gpus=(1,), device="cpu")

    def models(cells: Sequence[Experiment]) -> dict[str, Any]:
        return {
            "org/cached": {
                "cell": cells[0].cell_id,
                "where": "hub cache; the hub did not answer in 5 s: its jobs run offline",
                "offline": True,
            }
        }

    checked = check_stack(built, run=_answer(models=models))
    offline = {e.scenario: e.hub_offline for e in checked.plan.experiments}
    assert offline == {"a": True, "b": False}
    for e in checked.plan.experiments:
        overlay, _ = child_environment(e, ())
        # tiny-llama never needs the hub (as before); the cached model now neither
        assert overlay.get("HF_HUB_OFFLINE") == "1"
    first = built.experiments[0]
    assert first.scenario == "a" and child_environment(first, ())[0].get("HF_HUB_OFFLINE") is None


def test_no_check_asks_nothing_and_says_so(plan, tmp_path) -> None:
    from orchestrator.cli.app import build_parser

    built = plan(SCENARIOS, num_gpus=(1,), device="cpu")

    def run(python: str, cells: Sequence[Experiment]) -> dict[str, Any]:
        raise AssertionError("nothing is asked")

    skipped = check_stack(built, skip=True, run=run)
    assert skipped.plan is built
    assert skipped.lines() == ["not checked against the installed libraries (--no-check)"]
    assert build_parser().parse_args(["run", "--no-check"]).no_check is True
    assert build_parser().parse_args(["run"]).no_check is False
    assert script_argv(tmp_path, CHECK="false").rstrip().endswith("--no-check")
    assert "--no-check" not in script_argv(tmp_path)
    assert "--no-check" not in script_argv(tmp_path, CHECK="true")
