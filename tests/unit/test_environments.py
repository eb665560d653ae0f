"""Environments (``environments:``): parsing, the one-line errors of the plan-time probe,
ids, the labels of the versions that differ, and the report's and compare's views."""

from __future__ import annotations

import json
import sys
from importlib import metadata
from pathlib import Path

import pandas as pd
import pytest

from orchestrator.config import environments as envs
from orchestrator.config.environments import Environment, EnvironmentEntry
from orchestrator.config.scenarios import load_config
from orchestrator.contract.errors import ConfigError, UserError
from orchestrator.matrix.expand import Selection, build_plan
from orchestrator.matrix.table import format_header, plan_csv
from orchestrator.results import across
from orchestrator.results import envtables as report_envs
from orchestrator.results.compare import compare
from orchestrator.results.rows import build_row

SCENARIOS = """\
scenarios:
  - name: s
    device: cpu
    arguments: {model_name_or_path: tiny-llama}
"""


def _load(tmp_path: Path, environments: str) -> object:
    path = tmp_path / "scenarios.yaml"
    path.write_text(environments + SCENARIOS)
    return load_config(path, defaults_file=None)


def _error(tmp_path: Path, environments: str) -> str:
    with pytest.raises(ConfigError) as info:
        config = _load(tmp_path, environments)
        envs.resolve_all(config.environments)  # type: ignore[attr-defined]
    message = str(info.value)
    assert "\n" not in message
    return message


def _fake_python(tmp_path: Path, name: str, output: dict | None, code: int = 0) -> Path:
    """An executable that answers the probe with ``output`` (a stand-in interpreter)."""
    script = tmp_path / name / "bin" / "python"
    script.parent.mkdir(parents=True)
    text = json.dumps(output) if output is not None else ""
    script.write_text(f"#!/bin/sh\necho '{text}'\necho 'boom: no stack here' >&2\nexit {code}\n")
    script.chmod(0o755)
    return script


STACK = {
    "torch": "2.12.0",
    "transformers": "5.22.0",
    "accelerate": "1.15.0",
    "trl": "1.16.0",
    "peft": "0.21.0",
    "datasets": "5.2.0",
    "deepspeed": None,
    "pydantic": "2.14.0",
}


def _answer(**versions: str | None) -> dict:
    return {"python": "3.11.2", "versions": {**STACK, **versions}, "child": True, "contract": None}


# -- parsing ------------------------------------------------------------------------------


def test_entries_resolve_paths_against_the_file_and_tox_against_the_project(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    config = _load(
        tmp_path,
        "environments:\n"
        "  - {name: rel, python: venvs/a/bin/python}\n"
        "  - {name: home, python: ~/b/bin/python}\n"
        "  - {name: t, tox: tests}\n",
    )
    rel, home, tox = config.environments  # type: ignore[attr-defined]
    assert rel.python == tmp_path / "venvs/a/bin/python" and rel.line == 2
    assert home.python == tmp_path / "home/b/bin/python"
    assert tox.python == envs.PROJECT_ROOT / ".tox/tests/bin/python" and tox.tox == "tests"


def test_without_environments_the_config_has_none(tmp_path: Path) -> None:
    assert _load(tmp_path, "").environments == ()  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("  - {name: ../x, python: p}\n", "environment name '../x' would escape"),
        ("  - {name: a b, python: p}\n", "environment name 'a b' has characters"),
        ("  - {name: a, python: p}\n  - {name: a, python: q}\n", "'a' is listed twice"),
        ("  - {name: a, python: p, tox: t}\n", "give exactly one of python:"),
        ("  - {name: a}\n", "give exactly one of python:"),
        ("  - {name: a, tox: ../t}\n", "tox env name '../t' would escape"),
        ("  - {name: a, pyhton: p}\n", "unknown key 'pyhton'; allowed: name, python, tox"),
    ],
)
def test_bad_entries_are_one_line_at_their_place(tmp_path: Path, text: str, expected: str) -> None:
    message = _error(tmp_path, "environments:\n" + text)
    assert expected in message
    assert "scenarios.yaml:" in message


def test_an_empty_list_is_refused(tmp_path: Path) -> None:
    assert "name at least one environment" in _error(tmp_path, "environments: []\n")


# -- the probe's one-line errors ------------------------------------------------------------


def test_a_missing_interpreter_is_one_line_naming_the_entry(tmp_path: Path) -> None:
    message = _error(tmp_path, "environments:\n  - {name: old, python: nowhere/bin/python}\n")
    assert message == (
        f"{tmp_path / 'scenarios.yaml'}:2: environments[0]: environment 'old': "
        f"{tmp_path / 'nowhere/bin/python'} does not exist"
    )


def test_a_missing_tox_env_says_how_to_create_it(tmp_path: Path) -> None:
    message = _error(tmp_path, "environments:\n  - {name: t, tox: no-such-env-here}\n")
    assert "tox env 'no-such-env-here' does not exist yet" in message
    assert "`tox -e no-such-env-here --notest`" in message


def test_a_file_that_is_not_executable_is_refused(tmp_path: Path) -> None:
    python = tmp_path / "plain"
    python.write_text("not a program")
    message = _error(tmp_path, f"environments:\n  - {{name: p, python: {python}}}\n")
    assert message.endswith(f"environment 'p': {python} is not an executable file")


def test_an_interpreter_without_the_stack_names_what_it_lacks(tmp_path: Path) -> None:
    python = _fake_python(tmp_path, "old", _answer(transformers=None, trl=None))
    message = _error(tmp_path, f"environments:\n  - {{name: old, python: {python}}}\n")
    assert message.endswith(
        f"scenarios.yaml:2: environments[0]: environment 'old': {python} has no transformers, "
        "trl (the training stack needs torch, transformers, peft, accelerate, trl)"
    )


def test_a_failing_probe_is_one_line_with_its_last_words(tmp_path: Path) -> None:
    python = _fake_python(tmp_path, "broken", None, code=3)
    message = _error(tmp_path, f"environments:\n  - {{name: b, python: {python}}}\n")
    assert message.endswith(
        f"environment 'b': {python} failed to report its versions (exit 3: boom: no stack here)"
    )


def test_an_interpreter_that_cannot_load_the_child_is_refused(tmp_path: Path) -> None:
    answer = _answer()
    answer["contract"] = "ModuleNotFoundError: No module named pydantic"
    python = _fake_python(tmp_path, "nopyd", answer)
    message = _error(tmp_path, f"environments:\n  - {{name: n, python: {python}}}\n")
    assert (
        "cannot load the training child" in message
        and "(ModuleNotFoundError: No module named pydantic)" in message
    )


def test_the_running_interpreter_probes_to_its_own_versions(tmp_path: Path) -> None:
    entry = EnvironmentEntry(
        name="here", python=Path(sys.executable), tox=None, file="f", line=1, key="k"
    )
    env = envs.resolve(entry)
    assert env.python == sys.executable
    for name in ("torch", "transformers", "accelerate", "trl", "peft"):
        assert env.versions[name] == metadata.version(name)
    assert env.versions["python"] == ".".join(map(str, sys.version_info[:3]))


# -- the axis and the ids ----------------------------------------------------------------


def _env(name: str, **versions: str) -> Environment:
    return Environment(
        name=name,
        python=f"/envs/{name}/bin/python",
        versions={
            "python": "3.11.2",
            **{k: v for k, v in STACK.items() if k != "pydantic"},
            **versions,
        },
    )


def _plan(tmp_path: Path, environments: list[Environment] | None):
    text = (
        ""
        if environments is None
        else "environments:\n"
        + "".join(f"  - {{name: {e.name}, python: {e.python}}}\n" for e in environments)
    )
    config = _load(tmp_path, text)
    return build_plan(
        config,  # type: ignore[arg-type]
        Selection(device="cpu", effective_batch_size=(4,)),
        gpu_count=0,
        environments=environments,
    )


def test_every_cell_runs_under_each_environment_with_its_name_in_the_id(tmp_path: Path) -> None:
    old, new = _env("old", torch="2.12.0"), _env("new", torch="2.13.0")
    plan = _plan(tmp_path, [old, new])
    a, b = plan.experiments
    assert (a.environment, b.environment) == (old, new)
    assert a.experiment_id.startswith("s.tiny-llama.none.old.g1.eb4-")
    assert b.experiment_id.startswith("s.tiny-llama.none.new.g1.eb4-")
    assert a.cell_id != b.cell_id and a.python == "/envs/old/bin/python"
    assert a.spec()["environment_versions"]["torch"] == "2.12.0"
    assert plan.environments == (old, new)
    header = format_header(plan, tmp_path / "scenarios.yaml", None)
    assert "environment old:" in header and "torch 2.12.0" in header
    assert plan_csv(plan).splitlines()[0].endswith(",environment")


def test_other_versions_under_the_same_name_give_another_id(tmp_path: Path) -> None:
    (first,) = _plan(tmp_path, [_env("e", peft="0.21.0")]).experiments
    (again,) = _plan(tmp_path, [_env("e", peft="0.21.0")]).experiments
    (other,) = _plan(tmp_path, [_env("e", peft="0.20.0")]).experiments
    assert first.experiment_id == again.experiment_id != other.experiment_id


def test_without_environments_ids_and_specs_are_as_before(tmp_path: Path) -> None:
    (plain,) = _plan(tmp_path, None).experiments
    assert plain.environment is None and plain.python is None
    assert "environment" not in plain.spec()
    assert ".none.g1.eb4-" in plain.experiment_id
    assert "environment" not in plan_csv(_plan(tmp_path, None)).splitlines()[0]


def test_a_file_with_environments_must_be_probed_before_planning(tmp_path: Path) -> None:
    config = _load(tmp_path, "environments:\n  - {name: e, python: p}\n")
    with pytest.raises(ValueError, match="probe them first"):
        build_plan(config, Selection(device="cpu"), gpu_count=0)  # type: ignore[arg-type]


# -- labels, drift, rows -------------------------------------------------------------------


def test_labels_name_only_the_packages_that_differ() -> None:
    labels = envs.short_labels(
        {
            "old": {
                "python": "3.11.2",
                "torch": "2.12.0",
                "transformers": "5.22.0",
                "peft": "0.21.0",
            },
            "new": {
                "python": "3.11.2",
                "torch": "2.13.0",
                "transformers": "5.23.0",
                "peft": "0.21.0",
            },
        }
    )
    assert labels == {
        "old": "torch 2.12.0, transformers 5.22.0",
        "new": "torch 2.13.0, transformers 5.23.0",
    }
    same = envs.short_labels({"a": {"torch": "2.13.0"}, "b": {"torch": "2.13.0"}})
    assert same == {"a": "same versions", "b": "same versions"}
    assert envs.short_labels({"a": {"deepspeed": "0.19.8"}, "b": {}}) == {
        "a": "deepspeed 0.19.8",
        "b": "deepspeed not installed",
    }


def test_a_run_whose_versions_differ_from_the_probe_gets_a_note() -> None:
    spec = {
        "experiment_id": "x",
        "environment": "old",
        "environment_versions": {"torch": "2.12.0", "peft": "0.20.0", "deepspeed": None},
    }
    ran = {"versions": {"torch": "2.12.0", "peft": "0.21.0", "cuda": None}}
    row = build_row(spec, {"status": "ok"}, ran)
    assert row["environment"] == "old"
    assert row["environment_versions"] == spec["environment_versions"]
    assert row["environment_note"] == (
        "the run's versions differ from the plan's probe: peft 0.20.0 planned, 0.21.0 ran"
    )
    same = build_row(spec, {"status": "ok"}, {"versions": {"torch": "2.12.0", "peft": "0.20.0"}})
    assert same["environment_note"] is None
    plain = build_row({"experiment_id": "y"}, {"status": "ok"}, ran)
    assert plain["environment"] is None and plain["environment_versions"] is None
    assert plain["environment_note"] is None


# -- compare and the report ----------------------------------------------------------------


def _rows(
    env: str | None, tokens: float, versions: dict | None = None, scenario: str = "s"
) -> dict:
    return {
        "experiment_id": f"{scenario}.{env}",
        "cell_id": f"{scenario}.{env}",
        "scenario": scenario,
        "framework_config": "none",
        "model_name_or_path": "tiny-llama",
        "num_gpus": 1,
        "per_device_train_batch_size": 4,
        "device": "cpu",
        "status": "ok",
        "error": None,
        "environment": env,
        "environment_versions": json.dumps(versions) if versions else None,
        "tokens_per_second_global": tokens,
        "peak_memory_bytes": 2**30,
    }


def test_two_folders_of_one_environment_each_still_match() -> None:
    new = pd.DataFrame([_rows("new", 110.0, {"torch": "2.13.0"})])
    ref = pd.DataFrame([_rows("old", 100.0, {"torch": "2.12.0"})])
    result = compare(new, ref, metrics=["tokens_per_second_global"])
    assert "environment" not in result.keys
    assert len(result.table) == 1 and result.table["ratio"].iloc[0] == pytest.approx(1.1)
    assert any(
        "environment old (torch 2.12.0)" in n and "new (torch 2.13.0)" in n for n in result.notes
    )
    # both sides have the column: it was left out on purpose, not for being missing
    assert not any("environment" in n and "missing on one side" in n for n in result.notes)


def test_a_side_with_several_environments_matches_each_with_its_own() -> None:
    both = pd.DataFrame([_rows("old", 100.0), _rows("new", 50.0)])
    result = compare(both, both.copy(), metrics=["tokens_per_second_global"])
    assert "environment" in result.keys
    assert list(result.table["ratio"]) == [1.0, 1.0]


def test_compare_across_takes_one_environment_as_the_reference() -> None:
    rows = pd.DataFrame(
        [
            _rows("old", 100.0, {"torch": "2.12.0"}),
            _rows("new", 80.0, {"torch": "2.13.0"}),
            _rows("newer", 120.0, {"torch": "2.14.0"}),
        ]
    )
    result, baseline, candidates = across.compare_across(rows, metrics=["tokens_per_second_global"])
    assert (baseline, candidates) == ("old", ["new", "newer"])
    assert result.keys[0] == "environment"
    table = result.table.set_index("environment")
    assert table.loc["new", "ratio"] == pytest.approx(0.8) and table.loc["new", "regression"]
    assert table.loc["newer", "ratio"] == pytest.approx(1.2)
    assert not table.loc["newer", "regression"]
    assert "versions that differ: old: torch 2.12.0; new: torch 2.13.0; newer: torch 2.14.0" in (
        result.notes
    )
    lines = across.across_lines(result)
    assert any(line.startswith("  new vs baseline:") and "80 vs 100" in line for line in lines)
    again, baseline, _ = across.compare_across(
        rows, baseline="newer", metrics=["tokens_per_second_global"]
    )
    assert baseline == "newer" and set(again.table["environment"]) == {"old", "new"}


def test_compare_across_needs_two_values() -> None:
    with pytest.raises(Exception, match="at least two"):
        across.compare_across(pd.DataFrame([_rows("old", 1.0)]))
    with pytest.raises(Exception, match="--baseline x: not a value of environment"):
        across.compare_across(pd.DataFrame([_rows("a", 1.0), _rows("b", 1.0)]), baseline="x")


def test_summary_shows_environments_side_by_side_only_when_there_are_several() -> None:
    cells = pd.DataFrame(
        [
            _rows("old", 1000.0, {"python": "3.11.2", "torch": "2.12.0", "peft": "0.21.0"}),
            _rows("new", 1500.0, {"python": "3.11.2", "torch": "2.13.0", "peft": "0.21.0"}),
        ]
    )
    lines = report_envs.side_by_side_markdown(
        cells, [], lambda name: name, lambda cell, name: f"{cell[name]:.0f}"
    )
    text = "\n".join(lines)
    assert "## Environments side by side" in text
    assert "tokens_per_second_global: old (torch 2.12.0)" in text
    assert "tokens_per_second_global: new (torch 2.13.0)" in text
    assert "| s · tiny-llama · none · 1 process | 1000 | 1500 |" in text
    assert report_envs.side_by_side_markdown(cells.iloc[:1], [], str, str) == []


def test_only_cells_of_this_interpreter_need_its_training_stack(tmp_path: Path) -> None:
    from orchestrator.running.needs import needs

    (under_env,) = _plan(tmp_path, [_env("e")]).experiments
    assert needs([under_env]) == []  # its stack was probed at plan time
    (plain,) = _plan(tmp_path, None).experiments
    assert "torch" in [n.module for n in needs([plain])]


def test_an_interpreter_without_peft_is_refused(tmp_path: Path) -> None:
    python = _fake_python(tmp_path, "nopeft", _answer(peft=None))
    message = _error(tmp_path, f"environments:\n  - {{name: n, python: {python}}}\n")
    assert message.endswith(
        f"environment 'n': {python} has no peft (the training stack needs "
        "torch, transformers, peft, accelerate, trl)"
    )


def test_cells_of_an_environment_need_deepspeed_and_bitsandbytes_in_its_interpreter(
    tmp_path: Path,
) -> None:
    from orchestrator.running.needs import missing, needs, require

    (tmp_path / "ds.yaml").write_text("distributed_type: DEEPSPEED\n")
    (tmp_path / "scenarios.yaml").write_text(
        "environments:\n  - {name: bare, python: /envs/bare/bin/python}\n"
        "  - {name: full, python: /envs/full/bin/python}\n"
        "frameworks:\n  zero2: {accelerate_config: ds.yaml}\n"
        "scenarios:\n  - name: q\n    device: cpu\n    framework_config: [zero2]\n"
        "    arguments: {model_name_or_path: tiny-llama, peft_method: qlora}\n"
    )
    config = load_config(tmp_path / "scenarios.yaml", defaults_file=None)
    bare = _env("bare")  # deepspeed None, no bitsandbytes
    full = _env("full", deepspeed="0.19.8", bitsandbytes="0.48.0")
    experiments = build_plan(
        config, Selection(device="cpu", effective_batch_size=(4,)), 0, [bare, full]
    ).experiments
    wanted = needs(experiments)
    assert [(n.module, n.why) for n in wanted] == [
        ("bitsandbytes", "scenario 'q' (peft_method: qlora) in environment 'bare'"),
        ("deepspeed", "framework 'zero2' (distributed_type: DEEPSPEED) in environment 'bare'"),
        ("bitsandbytes", "scenario 'q' (peft_method: qlora) in environment 'full'"),
        ("deepspeed", "framework 'zero2' (distributed_type: DEEPSPEED) in environment 'full'"),
    ]
    # looked up in what each probe found, not in this interpreter
    assert [(n.module, n.why) for n in missing(wanted, find=lambda m: object())] == [
        (n.module, n.why) for n in wanted[:2]
    ]
    with pytest.raises(UserError, match=r"not installed: bitsandbytes \(for scenario 'q'"):
        require(experiments, find=lambda m: object())
    assert missing(needs([e for e in experiments if e.environment == full]), lambda m: None) == []


def test_compare_across_takes_any_key_column() -> None:
    rows = pd.DataFrame([_rows(None, 100.0), _rows(None, 90.0)])
    rows["framework_config"] = ["none", "ddp"]
    result, baseline, candidates = across.compare_across(
        rows, across="framework_config", metrics=["tokens_per_second_global"]
    )
    assert (baseline, candidates) == ("none", ["ddp"])
    assert list(result.table["ratio"]) == [pytest.approx(0.9)]
