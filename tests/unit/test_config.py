"""Loading and validating config files; every bad input is one precise error."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from orchestrator.config.scenarios import load_config
from orchestrator.contract.errors import ConfigError
from orchestrator.matrix.expand import Selection, build_plan

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"

MINIMAL = """
scenarios:
  - name: a
    arguments:
      model_name_or_path: m
"""


def test_minimal_file_loads(load) -> None:
    config = load(MINIMAL)
    (scenario,) = config.scenarios
    assert scenario.name == "a"
    assert scenario.models == ("m",)
    assert scenario.frameworks == (None,)
    assert scenario.device == "gpu"
    assert scenario.slow is False


def test_predecessor_file_loads_unchanged_with_its_frameworks_defined(tmp_path) -> None:
    config = load_config(
        FIXTURES / "fms_scenarios.yaml",
        defaults_file=FIXTURES / "fms_defaults.yaml",
        frameworks_files=[FIXTURES / "fms_frameworks.yaml"],
    )
    by_name = {s.name: s for s in config.scenarios}
    assert list(by_name) == [
        "full-finetuning",
        "baseline-peft-bnb",
        "accelerated-peft-bnb",
        "accelerated-moe",
    ]
    # `- # without acceleration` is a null entry: no overlay
    assert by_name["accelerated-peft-bnb"].frameworks == (
        None,
        "accelerated-peft-bnb",
        "accelerated-peft-bnb-foak",
    )
    assert by_name["full-finetuning"].models == (
        "mistralai/Mistral-7B-v0.1",
        "NousResearch/Llama-2-70b-hf",
    )
    # a list under target_modules is a constant, not a sweep
    assert by_name["baseline-peft-bnb"].arguments["target_modules"] == [
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
    ]
    assert by_name["accelerated-moe"].slow is True
    # 2e-5 is a number, as its author meant (YAML 1.1 would read a string)
    assert by_name["full-finetuning"].arguments["learning_rate"] == 2e-5
    assert config.data_processing is not None
    assert config.data_processing["dataset_split"] == "train[:2000]"

    plan = build_plan(config, Selection(device="gpu", num_gpus=(1, 2)), gpu_count=0)
    # full: 2 models; baseline: 1 model × 1 fw; accelerated: 3 fws × 2 models;
    # each × 2 GPU counts × 2 effective batch sizes (the predecessor's default axes)
    assert len(plan.experiments) == (2 + 1 + 6) * 2 * 2
    accelerated = [e for e in plan.experiments if e.scenario == "accelerated-peft-bnb"]
    # `packing: False` pins the axis; `max_steps: null` removes the default of 20
    assert {e.packing for e in accelerated} == {False}
    assert all("max_steps" not in e.arguments for e in accelerated)
    assert all(
        e.arguments["max_steps"] == 20 for e in plan.experiments if e.scenario == "full-finetuning"
    )
    fws = [e for e in accelerated if e.framework == "accelerated-peft-bnb"]
    assert fws[0].env == {"ACCELERATION_FRAMEWORK_CONFIG_FILE": "accelerated-peft-bnb.yaml"}


def test_predecessor_file_without_frameworks_names_the_missing_one() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(FIXTURES / "fms_scenarios.yaml", defaults_file=None)
    message = str(info.value)
    assert "fms_scenarios.yaml:25: scenarios[1].framework_config[0]" in message
    assert "unknown framework 'baseline-peft-bnb'; defined frameworks: none are defined" in message
    assert "--frameworks FILE" in message


# ---------------------------------------------------------------------------
# Bad input: each is one line naming file, line, key path and what is allowed
# ---------------------------------------------------------------------------


def _error(load, text: str, defaults: str | None = None, **kwargs) -> str:
    with pytest.raises(ConfigError) as info:
        load(text, defaults, **kwargs)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_unknown_key_names_path_and_allowed_keys(load) -> None:
    message = _error(
        load,
        """
        scenarios:
          - name: a
            argumnts: {model_name_or_path: m}
        """,
    )
    assert re.search(
        r"scenarios\.yaml:3: scenarios\[0\]: unknown key 'argumnts'; allowed: name, "
        r"description, framework_config, slow, device, num_gpus, arguments, sweep, timeout_s, "
        r"profile, profile_steps, search, measure, allocator$",
        message,
    ), message


def test_unknown_top_level_key(load) -> None:
    message = _error(load, "scenario:\n  - name: a\n")
    assert message.endswith(
        "scenarios.yaml:1: unknown key 'scenario'; allowed: accelerate_config, timeout_s, launch, allocator, cost, "
        "slurm, ray, "
        "frameworks, "
        "matrix, environments, data_processing, scenarios (and 1 more problem)"
    )


def test_unknown_matrix_key(load) -> None:
    message = _error(load, "matrix:\n  num_gpu: [1]\n" + MINIMAL)
    assert "scenarios.yaml:2: matrix: unknown key 'num_gpu'; allowed: num_gpus," in message


def test_wrong_type(load) -> None:
    message = _error(
        load,
        """
        scenarios:
          - name: a
            slow: "yes"
            arguments: {model_name_or_path: m}
        """,
    )
    assert message.endswith(
        "scenarios.yaml:3: scenarios[0].slow: input should be a valid boolean (got a string 'yes')"
    )


def test_wrong_type_for_arguments(load) -> None:
    message = _error(load, "scenarios:\n  - name: a\n    arguments: [1, 2]\n")
    assert (
        "scenarios[0].arguments: input should be a valid dictionary (got a list [1, 2])" in message
    )


def test_missing_required_key(load) -> None:
    message = _error(load, "scenarios:\n  - arguments: {model_name_or_path: m}\n")
    assert "scenarios.yaml:2: scenarios[0].name: missing required key 'name'" in message


def test_top_level_must_be_a_mapping(load) -> None:
    assert "must be a YAML mapping at the top level, got a list" in _error(load, "- a\n- b\n")
    assert "got NoneType" in _error(load, "# only a comment\n")


def test_unknown_framework_lists_defined_ones(load) -> None:
    message = _error(
        load,
        """
        frameworks:
          fsdp: {accelerate_config: accelerate.yaml}
          ddp: {accelerate_config: accelerate-ddp.yaml}
        scenarios:
          - name: a
            framework_config: [ddp, lgier]
            arguments: {model_name_or_path: m}
        """,
    )
    assert (
        "scenarios.yaml:6: scenarios[0].framework_config[1]: unknown framework 'lgier'; "
        "defined frameworks: ddp, fsdp" in message
    )


def test_empty_model_list(load) -> None:
    message = _error(
        load, "scenarios:\n  - name: a\n    arguments:\n      model_name_or_path: []\n"
    )
    assert message.endswith(
        "scenarios.yaml:4: scenarios[0].arguments.model_name_or_path: "
        "empty model list; give at least one model_name_or_path"
    )


def test_no_model_at_all(load) -> None:
    message = _error(load, "scenarios:\n  - name: a\n    arguments: {r: 8}\n")
    assert "scenarios.yaml:2: scenarios[0]: scenario 'a' has no model" in message


def test_model_from_defaults(load) -> None:
    config = load("scenarios:\n  - name: a\n", "model_name_or_path: [x, y]\n")
    assert config.scenarios[0].models == ("x", "y")
    assert "model_name_or_path" not in config.defaults


@pytest.mark.parametrize(
    ("where", "text"),
    [
        ("matrix.num_gpus[0]", "matrix:\n  num_gpus: [0]\n" + MINIMAL),
        ("matrix.num_gpus[1]", "matrix:\n  num_gpus: [1, -2]\n" + MINIMAL),
        (
            "scenarios[0].num_gpus[0]",
            "scenarios:\n  - name: a\n    num_gpus: [-1]\n    arguments: {model_name_or_path: m}\n",
        ),
    ],
)
def test_zero_or_negative_gpu_count(load, where: str, text: str) -> None:
    message = _error(load, text)
    assert f"{where}: input should be greater than 0" in message


def test_empty_axis_list(load) -> None:
    message = _error(load, "matrix:\n  effective_batch_size: []\n" + MINIMAL)
    assert "matrix.effective_batch_size: empty list; give at least one value" in message


def test_duplicate_axis_value(load) -> None:
    message = _error(load, "matrix:\n  num_gpus: [1, 2, 1]\n" + MINIMAL)
    assert "matrix.num_gpus[2]: value 1 is listed twice (items 0 and 2)" in message


def test_duplicate_scenario_names(load) -> None:
    message = _error(
        load,
        """
        scenarios:
          - name: a
            arguments: {model_name_or_path: m}
          - name: b
            arguments: {model_name_or_path: m}
          - name: a
            arguments: {model_name_or_path: n}
        """,
    )
    assert message.endswith(
        "scenarios.yaml:6: scenarios[2].name: duplicate scenario name 'a' "
        "(also scenarios[0], line 2)"
    )


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("../x", "would escape the results folder"),
        ("/abs/path", "would escape the results folder"),
        ("a/b", "would escape the results folder"),
        (".hidden", "would escape the results folder"),
        ("a..b", "must not contain '..'"),
        ("a\\u0000b", "contains a NUL character"),
        ("has space", "has characters that are not allowed"),
        ("", "scenario name is empty"),
        ("x" * 65, "is longer than 64 characters"),
    ],
)
def test_scenario_names_that_cannot_be_folder_names(load, name: str, expected: str) -> None:
    message = _error(
        load, f'scenarios:\n  - name: "{name}"\n    arguments: {{model_name_or_path: m}}\n'
    )
    assert "scenarios.yaml:2: scenarios[0].name: " in message
    assert expected in message


@pytest.mark.parametrize("name", ["../x", "/abs", "fs\\u0000dp", "none"])
def test_bad_framework_names(load, name: str) -> None:
    message = _error(load, f'frameworks:\n  "{name}": {{}}\n' + MINIMAL)
    assert "scenarios.yaml:2: frameworks." in message


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ('"a\\u0000b"', "contains a NUL character"),
        ('"a\\nb"', "contains a control character"),
        ('" m"', "has leading or trailing spaces"),
        ('""', "a model name is empty"),
        ("12", "a model name must be a string, got int 12"),
    ],
)
def test_bad_model_names(load, model: str, expected: str) -> None:
    message = _error(
        load, f"scenarios:\n  - name: a\n    arguments:\n      model_name_or_path: [{model}]\n"
    )
    assert "scenarios[0].arguments.model_name_or_path[0]: " in message
    assert expected in message


def test_duplicate_model(load) -> None:
    message = _error(
        load, "scenarios:\n  - name: a\n    arguments:\n      model_name_or_path: [m, n, m]\n"
    )
    assert "model_name_or_path[2]: model 'm' is listed twice (items 0 and 2)" in message


def test_duplicate_framework_in_list(load) -> None:
    message = _error(
        load,
        "frameworks:\n  f: {}\nscenarios:\n  - name: a\n    framework_config: [f, null, f]\n"
        "    arguments: {model_name_or_path: m}\n",
    )
    assert "framework_config[2]: framework 'f' is listed twice" in message


def test_empty_framework_list(load) -> None:
    message = _error(
        load,
        "scenarios:\n  - name: a\n    framework_config: []\n    arguments: {model_name_or_path: m}\n",
    )
    assert "framework_config: empty list; use [null] for no overlay" in message


def test_missing_accelerate_config(load) -> None:
    message = _error(load, "frameworks:\n  f: {accelerate_config: nowhere.yaml}\n" + MINIMAL)
    assert re.search(
        r"nowhere\.yaml: accelerate config not found \(referenced from .*scenarios\.yaml:2\)",
        message,
    )


def test_accelerate_config_must_be_a_mapping(load, write) -> None:
    write("bad-accelerate.yaml", "- 1\n")
    message = _error(load, "frameworks:\n  f: {accelerate_config: bad-accelerate.yaml}\n" + MINIMAL)
    assert "an accelerate config must be a YAML mapping, got a list" in message


def test_framework_overlay_may_not_set_the_model(load) -> None:
    message = _error(load, "frameworks:\n  f:\n    arguments: {model_name_or_path: x}\n" + MINIMAL)
    assert "frameworks.f.arguments.model_name_or_path: a framework overlay may not set" in message


def test_duplicate_framework_across_files(load, write) -> None:
    extra = write("more.yaml", "frameworks:\n  f: {}\n")
    message = _error(load, "frameworks:\n  f: {}\n" + MINIMAL, frameworks_files=[extra])
    assert re.search(
        r"more\.yaml:2: frameworks\.f: framework 'f' is already defined in .*scenarios\.yaml:2",
        message,
    )


def test_reserved_argument_names(load) -> None:
    message = _error(
        load, "scenarios:\n  - name: a\n    arguments: {model_name_or_path: m, num_gpus: 2}\n"
    )
    assert (
        "arguments.num_gpus: 'num_gpus' is not a trainer argument; set num_gpus at the scenario level"
        in message
    )


def test_axis_list_in_arguments_points_to_sweep(load) -> None:
    message = _error(
        load,
        "scenarios:\n  - name: a\n    arguments: {model_name_or_path: m, max_seq_len: [1, 2]}\n",
    )
    assert (
        "'max_seq_len' is a matrix axis: give one value here, or list several under sweep"
        in message
    )


def test_sweep_conflicts(load) -> None:
    message = _error(
        load,
        "scenarios:\n  - name: a\n    arguments: {model_name_or_path: m, r: 8}\n    sweep: {r: [8, 16]}\n",
    )
    assert "sweep.r: 'r' is both a constant in arguments and swept" in message
    message = _error(
        load,
        "frameworks:\n  f: {arguments: {r: 4}}\nscenarios:\n  - name: a\n    framework_config: [f]\n"
        "    arguments: {model_name_or_path: m}\n    sweep: {r: [8, 16]}\n",
    )
    assert "sweep.r: 'r' is swept here but framework 'f' sets it" in message
    message = _error(
        load,
        "scenarios:\n  - name: a\n    arguments: {model_name_or_path: m}\n    sweep: {r: []}\n",
    )
    assert "sweep.r: empty sweep list" in message
    message = _error(
        load,
        "scenarios:\n  - name: a\n    arguments: {model_name_or_path: m}\n    sweep: {r: [1, 1]}\n",
    )
    assert "sweep.r[1]: sweep value 1 is listed twice" in message


def test_unsupported_values(load) -> None:
    message = _error(
        load,
        "scenarios:\n  - name: a\n    arguments: {model_name_or_path: m, learning_rate: .nan}\n",
    )
    assert "arguments.learning_rate: nan is not a finite number" in message


def test_defaults_file_problems(load) -> None:
    assert "a defaults file must be a mapping of trainer arguments, got a list" in _error(
        load, MINIMAL, "- a\n"
    )
    assert "defaults.yaml:1: max_seq_len: 'max_seq_len' is a matrix axis" in _error(
        load, MINIMAL, "max_seq_len: 512\n"
    )
    assert "defaults.yaml:2: duplicate key 'lr'" in _error(load, MINIMAL, "lr: 1\nlr: 2\n")


def test_missing_defaults_file(load, tmp_path) -> None:
    with pytest.raises(ConfigError, match=r"nope\.yaml: defaults file not found"):
        load_config(_write_minimal(tmp_path), defaults_file=tmp_path / "nope.yaml")


def _write_minimal(tmp_path: Path) -> Path:
    path = tmp_path / "s.yaml"
    path.write_text("scenarios:\n  - name: a\n    arguments: {model_name_or_path: m}\n")
    return path


def test_config_is_frozen(load) -> None:
    config = load(MINIMAL)
    with pytest.raises(AttributeError):
        config.scenarios[0].name = "b"  # type: ignore[misc]


def test_unknown_trainer_argument_is_caught_while_planning(load) -> None:
    message = _error(
        load,
        "scenarios:\n  - name: a\n    arguments: {model_name_or_path: m, learnig_rate: 1e-4}\n",
    )
    assert message.endswith(
        "scenarios.yaml:3: scenarios[0].arguments.learnig_rate: unknown argument 'learnig_rate': "
        "not a TrainingArguments or SFTConfig field nor a tunematrix setting; did you mean 'learning_rate'?"
    )


def test_unknown_argument_in_defaults_sweep_and_framework(load) -> None:
    assert "defaults.yaml:1: warmup_step: unknown argument 'warmup_step'" in _error(
        load, MINIMAL, "warmup_step: 3\n"
    )
    assert "sweep.lora_rank: unknown argument 'lora_rank'" in _error(
        load,
        "scenarios:\n  - name: a\n    arguments: {model_name_or_path: m}\n    sweep: {lora_rank: [8]}\n",
        "",
    )
    assert "frameworks.f.arguments.use_ligr_kernel: unknown argument" in _error(
        load, "frameworks:\n  f: {arguments: {use_ligr_kernel: true}}\n" + MINIMAL, ""
    )


def test_old_argument_names_are_accepted(load) -> None:
    config = load(
        MINIMAL,
        "gradient_checkpointing: true\ninclude_tokens_per_second: true\nevaluation_strategy: 'no'\n",
    )
    assert config.defaults["gradient_checkpointing"] is True
    assert config.defaults_lines == {
        "gradient_checkpointing": 1,
        "include_tokens_per_second": 2,
        "evaluation_strategy": 3,
    }


def test_an_old_and_a_new_name_of_one_setting_in_one_place_is_refused(load) -> None:
    assert _error(
        load, MINIMAL, "activation_checkpointing: true\ngradient_checkpointing: false\n"
    ).endswith(
        "defaults.yaml:2: gradient_checkpointing: 'gradient_checkpointing' is the old name of "
        "'activation_checkpointing', which is set too; keep one"
    )
    message = _error(
        load,
        "scenarios:\n  - name: a\n    arguments: {model_name_or_path: m, "
        "activation_checkpointing: true}\n    sweep: {gradient_checkpointing: [true, false]}\n",
        "",
    )
    assert message.endswith(
        "scenarios.yaml:4: scenarios[0].sweep.gradient_checkpointing: 'gradient_checkpointing' "
        "is both a constant in arguments and swept; keep one"
    )
    message = _error(
        load,
        "scenarios:\n  - name: a\n    arguments: {model_name_or_path: m}\n"
        "    sweep: {gradient_checkpointing: [true], activation_checkpointing: [false]}\n",
        "",
    )
    assert message.endswith(
        "scenarios[0].sweep.activation_checkpointing: 'gradient_checkpointing' and "
        "'activation_checkpointing' name one setting, swept twice; keep one"
    )


def test_auto_find_batch_size_is_refused_while_planning(load) -> None:
    message = _error(
        load,
        "scenarios:\n  - name: a\n    arguments: {model_name_or_path: m, auto_find_batch_size: true}\n",
    )
    assert re.search(
        r"scenarios\.yaml:3: scenarios\[0\]\.arguments\.auto_find_batch_size: true is refused: "
        r"on an out-of-memory error it halves the batch and restarts, .*; remove it",
        message,
    )
    message = _error(
        load,
        "scenarios:\n  - name: a\n    arguments: {model_name_or_path: m}\n"
        "    sweep: {auto_find_batch_size: [false, true]}\n",
    )
    assert "scenarios[0].sweep.auto_find_batch_size[1]: true is refused" in message
    assert "defaults.yaml:1: auto_find_batch_size: true is refused" in _error(
        load, MINIMAL, "auto_find_batch_size: true\n"
    )
    assert "frameworks.f.arguments.parallelism_config: a value is refused" in _error(
        load, "frameworks:\n  f: {arguments: {parallelism_config: {tp_size: 2}}}\n" + MINIMAL, ""
    )
    # the defaults are accepted
    load(
        "scenarios:\n  - name: a\n    arguments: {model_name_or_path: m, auto_find_batch_size: false}\n",
        "",
    )


def test_accelerate_config_with_tensor_parallelism_is_refused(load, write) -> None:
    write(
        "tp.yaml",
        "distributed_type: FSDP\nparallelism_config:\n  parallelism_config_dp_shard_size: 2\n"
        "  parallelism_config_tp_size: 2\n",
    )
    message = _error(load, "frameworks:\n  tp: {accelerate_config: tp.yaml}\n" + MINIMAL)
    assert re.search(
        r"tp\.yaml:2: parallelism_config: parallelism_config_tp_size 2 is refused: tensor, "
        r"context or sequence parallelism feeds the same batch to several ranks, .*; set it to 1",
        message,
    )
    write(
        "dp.yaml",
        "distributed_type: FSDP\nparallelism_config:\n  parallelism_config_dp_shard_size: 2\n",
    )
    load("frameworks:\n  dp: {accelerate_config: dp.yaml}\n" + MINIMAL)


def _sample_configurations(folder: Path, marker: str = "") -> Path:
    """fms-acceleration's real CONTENTS.yaml, with a plugin file for each of its entries."""
    import yaml

    folder.mkdir(parents=True, exist_ok=True)
    contents = (FIXTURES / "fms_sample_configurations" / "CONTENTS.yaml").read_text()
    (folder / "CONTENTS.yaml").write_text(contents)
    for entry in yaml.safe_load(contents)["framework_configs"]:
        (folder / entry["filename"]).write_text(f"# {entry['shortname']}{marker}\nplugins: {{}}\n")
    return folder / "CONTENTS.yaml"


def test_the_predecessors_contents_yaml_defines_its_frameworks(tmp_path) -> None:
    contents = _sample_configurations(tmp_path / "sample-configurations")
    config = load_config(
        FIXTURES / "fms_scenarios_2026-01.yaml",
        defaults_file=FIXTURES / "fms_defaults.yaml",
        frameworks_files=[contents],
    )
    # the 26 shortnames of the published file
    assert len(config.frameworks) == 26
    plan = build_plan(config, Selection(device="gpu", num_gpus=(1,)), gpu_count=0)
    used = {e.framework for e in plan.experiments}
    assert {"accelerated-peft-bnb", "foak-fast-kernels", "none"} <= used
    for e in plan.experiments:
        if e.framework == "accelerated-peft-bnb":
            assert e.env == {
                "ACCELERATION_FRAMEWORK_CONFIG_FILE": str(
                    (
                        tmp_path
                        / "sample-configurations"
                        / "accelerated-peft-bnb-nf4-sample-configuration.yaml"
                    ).resolve()
                )
            }
        if e.framework == "none":
            assert "ACCELERATION_FRAMEWORK_CONFIG_FILE" not in e.env


def test_contents_ids_follow_the_files_content_not_their_folder(tmp_path) -> None:
    def ids(contents: Path) -> list[str]:
        config = load_config(
            FIXTURES / "fms_scenarios_2026-01.yaml",
            defaults_file=FIXTURES / "fms_defaults.yaml",
            frameworks_files=[contents],
        )
        plan = build_plan(config, Selection(device="gpu", num_gpus=(1,)), gpu_count=0)
        return [e.experiment_id for e in plan.experiments if e.framework != "none"]

    here = ids(_sample_configurations(tmp_path / "a"))
    assert here == ids(_sample_configurations(tmp_path / "elsewhere" / "b"))
    changed = ids(_sample_configurations(tmp_path / "c", marker=" changed"))
    assert not set(here) & set(changed)


def test_a_contents_entry_without_its_file_is_one_error(tmp_path) -> None:
    contents = _sample_configurations(tmp_path / "s")
    (tmp_path / "s" / "foak-fast-kernels-sample-configuration.yaml").unlink()
    with pytest.raises(ConfigError) as caught:
        load_config(
            FIXTURES / "fms_scenarios_2026-01.yaml",
            defaults_file=FIXTURES / "fms_defaults.yaml",
            frameworks_files=[contents],
        )
    message = str(caught.value)
    assert re.fullmatch(
        rf"{re.escape(str(contents))}:\d+: framework_configs\[\d+\]\.filename: "
        r"foak-fast-kernels-sample-configuration\.yaml: no such file beside CONTENTS\.yaml \(.+\)",
        message,
    ), message


# --- where the files are found when none is named -------------------------------------------


def test_files_are_found_beside_the_scenarios_file_else_shipped(tmp_path) -> None:
    from orchestrator.config.files import find_config_files
    from orchestrator.contract.layout import shipped

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "scenarios.yaml").write_text(MINIMAL)
    # nothing beside it: the shipped defaults and accelerate config
    found = find_config_files(mine / "scenarios.yaml")
    assert found.scenarios == mine / "scenarios.yaml"
    assert found.defaults == shipped("defaults.yaml")
    assert found.accelerate_fallback == shipped("accelerate.yaml")
    # beside it: those
    (mine / "defaults.yaml").write_text("seed: 1\n")
    (mine / "accelerate.yaml").write_text("distributed_type: NO\n")
    found = find_config_files(mine / "scenarios.yaml")
    assert (found.defaults, found.accelerate_fallback) == (
        mine / "defaults.yaml",
        mine / "accelerate.yaml",
    )
    # a defaults file named is kept as named, even where it is missing (loading says so)
    named = find_config_files(mine / "scenarios.yaml", defaults=tmp_path / "gone.yaml")
    assert named.defaults == tmp_path / "gone.yaml"


def test_the_scenarios_file_is_the_current_folders_else_shipped(tmp_path) -> None:
    from orchestrator.config.files import find_config_files
    from orchestrator.contract.layout import shipped

    assert find_config_files(cwd=tmp_path).scenarios == shipped("scenarios.yaml")
    (tmp_path / "scenarios.yaml").write_text(MINIMAL)
    found = find_config_files(cwd=tmp_path)
    assert found.scenarios == tmp_path / "scenarios.yaml"
    assert found.defaults == shipped("defaults.yaml")


def test_the_api_and_doctor_find_the_same_accelerate_config(tmp_path, monkeypatch) -> None:
    from orchestrator import api
    from orchestrator.config.files import default_accelerate

    monkeypatch.chdir(tmp_path)
    (tmp_path / "scenarios.yaml").write_text(MINIMAL)
    (tmp_path / "accelerate.yaml").write_text("distributed_type: MULTI_GPU\n")
    config = api.load()
    assert config.scenarios_file == Path("scenarios.yaml")
    assert config.default_accelerate is not None
    assert config.default_accelerate.distributed_type == "MULTI_GPU"
    assert default_accelerate() == (config.default_accelerate.path, None)
    # a broken scenarios file: no config, and why
    (tmp_path / "scenarios.yaml").write_text("scenarios: [\n")
    path, why = default_accelerate()
    assert path is None
    assert why is not None and "scenarios.yaml" in why
