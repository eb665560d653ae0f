"""The README's runnable blocks, run as written: the Python API example and the
three-command migration from fms-acceleration's benchmarks."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"


def block_after(marker: str, language: str) -> str:
    """The first fenced ``language`` block after the HTML comment ``marker``."""
    # the README and the guides behind it (docs/): wherever the example now lives
    text = "\n".join(
        p.read_text() for p in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    )
    start = text.index(f"<!-- {marker}:")
    found = re.search(rf"```{language}\n(.*?)```", text[start:], re.S)
    assert found, f"no {language} block after the {marker} marker"
    return found.group(1)


def test_python_api_example_runs_as_written(tmp_path: Path) -> None:
    code = block_after("api", "python")
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "HF_HUB_OFFLINE": "1",
        "PYTHON": sys.executable,
    }
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("1 tiny-lora.")  # one experiment, its id
    assert re.search(r"tiny-lora\.\S+\s+ok\s+\d", done.stdout), done.stdout
    assert (tmp_path / "results-api" / "summary.md").is_file()
    assert (tmp_path / "results-api" / "compare.md").is_file() is False  # compare wrote nothing
    assert "tokens_per_second_global" in (tmp_path / "results-api" / "benchmarks.csv").read_text()


def _predecessor_checkout(home: Path) -> None:
    """fms-acceleration's files where the README's commands expect them."""
    bench = home / "fms-acceleration" / "scripts" / "benchmarks"
    bench.mkdir(parents=True)
    shutil.copy(FIXTURES / "fms_scenarios_2026-01.yaml", bench / "scenarios.yaml")
    shutil.copy(FIXTURES / "fms_defaults_2026-01.yaml", bench / "defaults.yaml")
    shutil.copytree(
        FIXTURES / "fms_sample_configurations", home / "fms-acceleration" / "sample-configurations"
    )
    (home / "tunematrix").symlink_to(REPO)


def test_the_three_command_migration_is_true(tmp_path: Path) -> None:
    from orchestrator.job.hardware import gpu_count

    home = tmp_path / "home"
    home.mkdir()
    _predecessor_checkout(home)
    commands = [
        line
        for line in block_after("migration", "bash").splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    assert len(commands) == 3
    assert "--frameworks" in commands[1] and "CONTENTS.yaml" in commands[1]
    assert commands[1].endswith(commands[2].split("run_benchmarks.sh", 1)[1])
    # each command in the shell the README means, one after the other, from $HOME
    script = "set -u\ncd ~\n" + "".join(f'{c}\necho "__rc $?"\n' for c in commands)
    env = {**os.environ, "HOME": str(home), "PYTHON": sys.executable, "HF_HUB_OFFLINE": "1"}
    env.pop("DRY_RUN", None)
    done = subprocess.run(
        ["bash", "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    codes = re.findall(r"^__rc (\d+)$", done.stdout, re.M)
    assert codes[:2] == ["0", "0"], done.stdout[-2000:] + done.stderr[-2000:]
    # 1: the files are copied; 2: the preview plans the predecessor's matrix with its frameworks
    workdir = Path(home / commands[0].split("cd ", 1)[1].split("&&")[0].strip().removeprefix("~/"))
    assert (workdir / "scenarios.yaml").read_bytes() == (
        FIXTURES / "fms_scenarios_2026-01.yaml"
    ).read_bytes()
    assert "tunematrix plan: 124 experiments from scenarios.yaml (defaults: defaults.yaml)" in (
        done.stdout
    )
    assert "note: run_benchmarks.sh read 5 arguments" in done.stdout
    assert "ACCELERATION_FRAMEWORK_CONFIG_FILE=" in done.stdout
    assert "accelerated-peft-bnb-nf4-sample-configuration.yaml" in done.stdout
    if gpu_count() == 0:
        # 3: without a GPU the run stops before anything starts, with one line
        assert codes[2] == "2"
        refusal = [line for line in done.stderr.splitlines() if line.startswith("tunematrix:")]
        assert len(refusal) == 1
        assert "is for gpu, and this run is for cpu (no GPU detected)" in refusal[0]
        assert not (workdir / "results").exists()
