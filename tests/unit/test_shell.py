"""run_benchmarks.sh: positional arguments, environment switches, DRY_RUN, --help."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "run_benchmarks.sh"


def sh(cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DRY_RUN", "DEVICE", "EFFECTIVE_BS_MATRIX", "FRAMEWORKS")
    }
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**base, "PYTHON": sys.executable, **env},
        timeout=60,
    )


def test_help_prints_usage(tmp_path) -> None:
    result = sh(tmp_path, "--help")
    assert result.returncode == 0
    assert result.stdout.startswith("tunematrix: run (or preview)")
    assert (
        "usage: bash run_benchmarks.sh [--frameworks FILE]... [NUM_GPUS_MATRIX] [RESULT_DIR]"
        in (result.stdout)
    )
    assert "DRY_RUN=true" in result.stdout and "examples:" in result.stdout
    assert "set -euo" not in result.stdout


def test_dry_run_previews_the_default_matrix_and_writes_nothing(tmp_path) -> None:
    result = sh(tmp_path, DRY_RUN="true", DEVICE="cpu")
    assert result.returncode == 0, result.stderr
    # 2 scenarios × 2 batch sizes, and tiny-sft-vs-hf's two trainers at one batch size
    assert "tunematrix plan: 6 experiments" in result.stdout
    assert result.stdout.count("accelerate launch") == 6
    assert "results/runs/" in result.stdout
    assert list(tmp_path.iterdir()) == []


def test_positional_arguments_map_onto_the_cli(tmp_path) -> None:
    result = sh(
        tmp_path,
        "1 2",
        "out dir",
        str(REPO / "scenarios.yaml"),
        "tiny-lora",
        DRY_RUN="TRUE",
        DEVICE="cpu",
        EFFECTIVE_BS_MATRIX="2,6",
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "tunematrix plan: 4 experiments" in out
    assert "scenarios: tiny-lora\n" in out
    assert "'out dir/runs/tiny-lora.tiny-llama.ddp.g2.eb6-" in out
    assert "num_gpus (processes):    1, 2  [command line]" in out
    assert "effective_batch_size:    2, 6  [command line]" in out
    assert not (tmp_path / "out dir").exists()


def test_empty_first_argument_means_the_default(tmp_path) -> None:
    result = sh(tmp_path, "", "results", DRY_RUN="1", DEVICE="cpu")
    assert result.returncode == 0, result.stderr
    assert "num_gpus (processes):    1  [default for CPU (processes)]" in result.stdout


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        (
            {"DRY_RUN": "maybe"},
            "run_benchmarks.sh: error: DRY_RUN must be true or false, got 'maybe'",
        ),
        ({"DRY_RUN": "true", "DEVICE": "tpu"}, "argument --device: invalid choice: 'tpu'"),
        (
            {"DRY_RUN": "true", "EFFECTIVE_BS_MATRIX": "0"},
            "--effective-batch-size: 0 is not a positive integer",
        ),
    ],
)
def test_bad_environment_is_one_line(tmp_path, env: dict[str, str], expected: str) -> None:
    result = sh(tmp_path, **env)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1, result.stderr
    assert expected in result.stderr


def test_filter_matching_nothing(tmp_path) -> None:
    result = sh(tmp_path, "1", "results", str(REPO / "scenarios.yaml"), "no-such", DRY_RUN="true")
    assert result.returncode == 2
    assert "filter 'no-such' matches no scenario" in result.stderr
    assert "tiny-lora (cpu)" in result.stderr


def test_missing_scenarios_file(tmp_path) -> None:
    result = sh(tmp_path, "1", "results", "nowhere.yaml", DRY_RUN="true")
    assert result.returncode == 2
    assert result.stderr == "tunematrix: error: nowhere.yaml: scenarios file not found\n"


def test_too_many_arguments(tmp_path) -> None:
    result = sh(tmp_path, "1", "r", "s", "f", "cols", "extra")
    assert result.returncode == 2
    assert "too many arguments (6)" in result.stderr


def test_the_predecessors_five_argument_form(tmp_path) -> None:
    """fms-acceleration's script: NUM_GPUS EFFECTIVE_BS RESULT_DIR SCENARIOS FILTER, 'none' = all."""
    result = sh(
        tmp_path,
        "1 2",
        "2 6",
        "out",
        str(REPO / "scenarios.yaml"),
        "none",
        DRY_RUN="true",
        DEVICE="cpu",
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "tunematrix plan: 10 experiments" in out
    assert "scenarios: tiny-full-finetuning, tiny-lora, tiny-sft-vs-hf\n" in out
    assert "effective_batch_size:    2, 6  [command line]" in out
    assert (
        "note: run_benchmarks.sh read 5 arguments: NUM_GPUS_MATRIX EFFECTIVE_BS_MATRIX "
        "RESULT_DIR SCENARIOS_CONFIG SCENARIOS_FILTER\n" in out
    )
    assert "out/runs/tiny-lora.tiny-llama.ddp.g2.eb6-" in out
    assert result.stderr == ""


def test_the_four_argument_form_says_so_and_none_means_every_scenario(tmp_path) -> None:
    result = sh(
        tmp_path, "1", "results", str(REPO / "scenarios.yaml"), "NONE", DRY_RUN="true", DEVICE="cpu"
    )
    assert result.returncode == 0, result.stderr
    assert "scenarios: tiny-full-finetuning, tiny-lora, tiny-sft-vs-hf\n" in result.stdout
    assert (
        "note: run_benchmarks.sh read 4 arguments: NUM_GPUS_MATRIX RESULT_DIR SCENARIOS_CONFIG "
        "SCENARIOS_FILTER\n" in result.stdout
    )


def test_batch_sizes_given_twice_is_one_line(tmp_path) -> None:
    result = sh(tmp_path, "1", "4 8", "out", DRY_RUN="true", DEVICE="cpu", EFFECTIVE_BS_MATRIX="2")
    assert result.returncode == 2
    assert result.stderr == (
        "run_benchmarks.sh: error: effective batch sizes given twice: '4 8' (2nd argument) "
        "and EFFECTIVE_BS_MATRIX='2'; give one\n"
    )


def _contents(tmp_path: Path) -> Path:
    """The predecessor's sample-configurations folder, as published."""
    import shutil

    folder = tmp_path / "sample-configurations"
    shutil.copytree(REPO / "tests" / "fixtures" / "fms_sample_configurations", folder)
    return folder / "CONTENTS.yaml"


@pytest.mark.parametrize("how", ["option", "option=", "environment"])
def test_frameworks_from_the_predecessors_contents_yaml(tmp_path, how: str) -> None:
    contents = _contents(tmp_path)
    scenarios = REPO / "tests" / "fixtures" / "fms_scenarios_2026-01.yaml"
    positionals = ("1", "4", "out", str(scenarios), "accelerated-peft-bnb")
    if how == "option":
        result = sh(tmp_path, "--frameworks", str(contents), *positionals, DRY_RUN="true")
    elif how == "option=":
        result = sh(tmp_path, f"--frameworks={contents}", *positionals, DRY_RUN="true")
    else:
        result = sh(tmp_path, *positionals, DRY_RUN="true", FRAMEWORKS=str(contents))
    assert result.returncode == 0, result.stderr
    # the scenario's two frameworks × 4 models, the plugin file of each beside CONTENTS.yaml
    assert "tunematrix plan: 8 experiments" in result.stdout
    config = contents.parent / "accelerated-peft-bnb-nf4-sample-configuration.yaml"
    assert f"ACCELERATION_FRAMEWORK_CONFIG_FILE={config}" in result.stdout
    assert "read 5 arguments" in result.stdout


def test_frameworks_option_mistakes_are_one_line(tmp_path) -> None:
    missing = sh(tmp_path, "--frameworks")
    assert missing.returncode == 2
    assert missing.stderr == "run_benchmarks.sh: error: --frameworks needs a file\n"
    unknown = sh(tmp_path, "--framework", "x.yaml", "1")
    assert unknown.returncode == 2
    assert "unknown option '--framework'" in unknown.stderr
    absent = sh(tmp_path, "--frameworks", "nowhere.yaml", DRY_RUN="true", DEVICE="cpu")
    assert absent.returncode == 2
    assert absent.stderr.startswith("tunematrix: error: ")
    assert "nowhere.yaml" in absent.stderr and absent.stderr.count("\n") == 1
