"""Steady-state measuring in the scenarios file, on the command line and in the ids."""

from __future__ import annotations

import os
import re
import subprocess
import textwrap
from pathlib import Path

import pytest

from orchestrator import api
from orchestrator.cli.app import main
from orchestrator.contract.errors import ConfigError, UserError
from orchestrator.contract.spec import RunSpec
from orchestrator.contract.steady import SteadyMeasure
from orchestrator.matrix.measuring import steady_id

REPO = Path(__file__).resolve().parents[2]

FILE = """\
scenarios:
  - name: fixed
    device: cpu
    arguments:
      model_name_or_path: tiny-llama
  - name: steady
    device: cpu
    measure:
      until: steady
      precision: 0.05
      min_steps: 12
    arguments:
      model_name_or_path: tiny-llama
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "scenarios.yaml"
    path.write_text(textwrap.dedent(text))
    (tmp_path / "defaults.yaml").write_text("max_steps: 20\nlogging_steps: 1\n")
    return path


def _plan(path: Path, **options: object) -> dict[str, object]:
    plan = api.plan(path, device="cpu", gpus=0, **options)  # type: ignore[arg-type]
    return {e.scenario: e for e in plan.experiments}


def test_the_file_sets_a_scenario_steady_with_defaults_filled_in(tmp_path: Path) -> None:
    cells = _plan(_write(tmp_path, FILE))
    fixed, steady = cells["fixed"], cells["steady"]
    assert fixed.measure is None and "measure" not in fixed.spec()  # type: ignore[attr-defined]
    assert fixed.arguments["max_steps"] == 20  # type: ignore[attr-defined]
    assert steady.measure == SteadyMeasure(precision=0.05, min_steps=12, max_steps=200)  # type: ignore[attr-defined]
    # the step cap is the trainer's max_steps, and the spec carries the settings
    assert steady.arguments["max_steps"] == 200  # type: ignore[attr-defined]
    spec = RunSpec(**steady.spec())  # type: ignore[attr-defined]
    assert spec.measure == steady.measure  # type: ignore[attr-defined]
    assert spec.model_dump(mode="json")["measure"] == {
        "until": "steady",
        "precision": 0.05,
        "min_steps": 12,
        "max_steps": 200,
    }


def test_ids_change_only_in_steady_mode(tmp_path: Path) -> None:
    path = _write(tmp_path, FILE)
    plain = _plan(path)
    assert _plan(path, measure={"until": "steps"})["fixed"].experiment_id == (  # type: ignore[attr-defined]
        plain["fixed"].experiment_id  # type: ignore[attr-defined]
    )
    steady = _plan(path, measure={"until": "steady"})["fixed"]
    assert steady.experiment_id != plain["fixed"].experiment_id  # type: ignore[attr-defined]
    # the readable part stays; the hash covers the fixed cell's and the settings
    assert (
        steady.experiment_id.rpartition("-")[0]
        == (  # type: ignore[attr-defined]
            plain["fixed"].experiment_id.rpartition("-")[0]  # type: ignore[attr-defined]
        )
    )
    assert steady.experiment_id == steady_id(plain["fixed"].experiment_id, SteadyMeasure())  # type: ignore[attr-defined]
    assert steady.cell_id == steady.experiment_id  # type: ignore[attr-defined]
    other = _plan(path, measure={"until": "steady", "precision": 0.03})["fixed"]
    assert other.experiment_id != steady.experiment_id  # type: ignore[attr-defined]
    # a default written out is the same experiment
    spelled = steady_id(plain["fixed"].experiment_id, SteadyMeasure(precision=0.02))  # type: ignore[attr-defined]
    assert spelled == steady.experiment_id  # type: ignore[attr-defined]


def test_the_command_line_wins_over_the_file(tmp_path: Path) -> None:
    path = _write(tmp_path, FILE)
    cells = _plan(path, measure={"until": "steady", "precision": 0.1, "max_steps": 50})
    # the file's min_steps stays where the command line does not set it
    assert cells["steady"].measure == SteadyMeasure(precision=0.1, min_steps=12, max_steps=50)  # type: ignore[attr-defined]
    assert cells["fixed"].measure == SteadyMeasure(precision=0.1, max_steps=50)  # type: ignore[attr-defined]
    # --until steps turns a steady scenario back to its fixed max_steps
    assert _plan(path, measure={"until": "steps"})["steady"].measure is None  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("measure", "expected"),
    [
        (
            "{until: steady, precision: 0}",
            r"scenarios.yaml:6: scenarios\[0\].measure.precision: input should be greater than 0",
        ),
        (
            '{until: steady, precision: "0.02"}',
            r"scenarios.yaml:6: scenarios\[0\].measure.precision: input should be a valid number",
        ),
        (
            "{until: steady, min_steps: 0}",
            r"scenarios.yaml:6: scenarios\[0\].measure.min_steps: input should be greater than 0",
        ),
        (
            "{until: forever}",
            r"scenarios.yaml:6: scenarios\[0\].measure.until: input should be 'steps' or 'steady'",
        ),
        (
            "{until: steady, precison: 0.1}",
            r"scenarios.yaml:6: scenarios\[0\].measure: unknown key 'precison'; allowed: until, "
            r"precision, min_steps, max_steps",
        ),
        (
            "{until: steps, precision: 0.1}",
            r"scenarios.yaml:6: scenarios\[0\].measure.precision: 'precision' applies to "
            r"until: steady only",
        ),
        (
            "{until: steady, min_steps: 50, max_steps: 20}",
            r"scenarios.yaml:6: scenarios\[0\].measure.min_steps: min_steps 50 is above "
            r"max_steps 20",
        ),
        ("{precision: 0.1}", r"scenarios.yaml:6: scenarios\[0\].measure.until: missing"),
    ],
)
def test_a_bad_measure_is_one_line_at_its_line(tmp_path: Path, measure: str, expected: str) -> None:
    path = _write(
        tmp_path,
        f"""\
        scenarios:
          - name: s
            device: cpu
            arguments:
              model_name_or_path: tiny-llama
            measure: {measure}
        """,
    )
    with pytest.raises(ConfigError) as info:
        api.load(path)
    message = str(info.value)
    assert "\n" not in message
    assert re.search(expected, message), message


def test_the_planner_refuses_a_cell_that_could_never_stop(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        """\
        scenarios:
          - name: s
            device: cpu
            arguments:
              model_name_or_path: tiny-llama
            measure:
              until: steady
              max_steps: 12
        """,
    )
    with pytest.raises(ConfigError) as info:
        _plan(path)
    assert str(info.value).startswith(
        f"{path}:8: scenarios[0].measure.max_steps: scenario 's' measures until steady state, "
        "but max_steps 12 leaves 9 measured steps after the warm-up, fewer than the 25"
    )
    # with a profile too, and from the command line
    fixed = _write(tmp_path, FILE)
    with pytest.raises(ConfigError, match=r"as the command line asks.*and the profiled steps"):
        _plan(fixed, measure={"until": "steady", "max_steps": 15}, profile=True)
    with pytest.raises(UserError, match="min_steps 30 is above max_steps 20"):
        _plan(fixed, measure={"until": "steady", "min_steps": 30, "max_steps": 20})
    with pytest.raises(UserError, match="precision must be above 0"):
        _plan(fixed, measure={"until": "steady", "precision": 0})
    with pytest.raises(UserError, match="unknown key 'precison'"):
        _plan(fixed, measure={"until": "steady", "precison": 0.1})


def test_instrumentation_off_cannot_measure_steady_state(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        """\
        scenarios:
          - name: s
            device: cpu
            arguments:
              model_name_or_path: tiny-llama
              instrumentation: false
            measure: {until: steady}
        """,
    )
    with pytest.raises(ConfigError, match="instrumentation is off"):
        _plan(path)


def test_plan_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, FILE)
    base = ["plan", "--scenarios", str(path), "--device", "cpu"]
    assert main([*base, "--until", "steady", "--precision", "0.05", "--max-steps", "40"]) == 0
    out = capsys.readouterr().out
    assert (
        "scenario 'fixed': each cell runs until the 95% interval of the mean step time is "
        "within ±5.0% (at least 10 measured steps, at most 40 steps)" in out
    )
    assert "at least 12 measured steps, at most 40 steps" in out
    assert main([*base, "--precision", "0.05"]) == 2
    assert "--precision set steady-state measuring: add --until steady" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        main([*base, "--until", "steady", "--precision", "2"])
    assert exited.value.code == 2
    assert "not between 0 and 1" in capsys.readouterr().err


def test_run_benchmarks_sh_passes_the_measure_variables(tmp_path: Path) -> None:
    path = _write(tmp_path, FILE)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEASURE_")}
    env.update(DRY_RUN="true", DEVICE="cpu", MEASURE_UNTIL="steady", MEASURE_MIN_STEPS="11")
    done = subprocess.run(
        ["bash", str(REPO / "run_benchmarks.sh"), "1", "results", str(path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "at least 11 measured steps, at most 200 steps" in done.stdout
