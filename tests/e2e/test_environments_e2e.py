"""An ``environments:`` matrix of two real interpreters, end to end.

The second environment is built here: a venv without pip whose ``.pth`` file
points at the running interpreter's packages (so it has the whole training
stack), with one package of the stack, peft, at another version installed over
it from PyPI. One ``tunematrix run`` of a one-cell LoRA scenario then trains
under both, and the rows, ``env.json``, ``summary.md`` and ``compare --across
environment`` must each tell the two apart.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import sysconfig
import tempfile
import venv
from importlib import metadata
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.long]

REPO = Path(__file__).resolve().parents[2]
PACKAGE = "peft"
HERE_VERSION = metadata.version(PACKAGE)
#: a version one minor step away from the installed one (that works with the rest)
OTHER_VERSION = "0.20.0" if not HERE_VERSION.startswith("0.20.") else "0.21.0"
#: downloads kept between test runs on this machine
WHEELS = Path(tempfile.gettempdir()) / "tunematrix-test-wheels"


def _wheel() -> Path:
    """peft ``OTHER_VERSION``'s wheel, downloaded once (skips where PyPI cannot be reached)."""
    found = sorted(WHEELS.glob(f"{PACKAGE}-{OTHER_VERSION}-*.whl"))
    if found:
        return found[0]
    WHEELS.mkdir(parents=True, exist_ok=True)
    try:
        proc = subprocess.run(
            [
                *(sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"),
                *("-d", str(WHEELS), f"{PACKAGE}=={OTHER_VERSION}"),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
    except subprocess.TimeoutExpired:
        pytest.skip(f"PyPI did not answer in 120 s: cannot fetch {PACKAGE}=={OTHER_VERSION}")
    found = sorted(WHEELS.glob(f"{PACKAGE}-{OTHER_VERSION}-*.whl"))
    if proc.returncode != 0 or not found:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        pytest.skip(f"cannot fetch {PACKAGE}=={OTHER_VERSION} from PyPI: {last}")
    return found[0]


def build_environment(folder: Path) -> Path:
    """A second interpreter: this one's packages, but ``PACKAGE`` at ``OTHER_VERSION``."""
    wheel = _wheel()
    venv.EnvBuilder(with_pip=False, symlinks=True).create(folder)
    python = folder / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # after the venv's own site-packages: what is installed there wins
    Path(site, "running-interpreter.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run(
        [
            *(sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--quiet"),
            *("--target", site, str(wheel)),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return python


SCENARIOS = """\
accelerate_config: {accelerate}
environments:
  - name: here
    python: {here}
  - name: other
    python: other-env/bin/python
matrix:
  effective_batch_size: [4]
scenarios:
  - name: env-lora
    device: cpu
    num_gpus: [1]
    arguments:
      model_name_or_path: tiny-llama
      torch_dtype: float32
      max_steps: 4
      max_seq_len: 32
      peft_method: lora
      r: 4
      lora_alpha: 8
      target_modules: [q_proj, v_proj]
"""


def tunematrix(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", *args],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    project = tmp_path_factory.mktemp("environments")
    other = build_environment(project / "other-env")
    probe = subprocess.run(
        [str(other), "-c", f"import {PACKAGE}; print({PACKAGE}.__version__)"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert probe.stdout.strip() == OTHER_VERSION  # the venv sees its own peft first
    (project / "scenarios.yaml").write_text(
        SCENARIOS.format(accelerate=REPO / "accelerate-ddp.yaml", here=sys.executable)
    )
    proc = tunematrix(
        project, "run", "--scenarios", "scenarios.yaml", "--device", "cpu", "--results", "res"
    )
    return project, proc


def test_a_cell_runs_under_each_environment_with_its_own_versions(
    ran: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    project, proc = ran
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = project / "res"
    with (results / "raw_summary.csv").open() as f:
        rows = {row["environment"]: row for row in csv.DictReader(f)}
    assert set(rows) == {"here", "other"}
    for name, version in (("here", HERE_VERSION), ("other", OTHER_VERSION)):
        row = rows[name]
        assert row["status"] == "ok", row["error"]
        assert f".{name}.g1.eb4-" in row["experiment_id"]
        assert float(row["tokens_per_second_global"]) > 0
        assert json.loads(row["environment_versions"])[PACKAGE] == version
        assert row["environment_note"] == ""
        # what the child itself imported
        result = json.loads((results / "runs" / row["experiment_id"] / "result.json").read_text())
        assert result["versions"][PACKAGE] == version
    assert rows["here"]["experiment_id"] != rows["other"]["experiment_id"]
    # each job launched its environment's own interpreter
    command = (results / "runs" / rows["other"]["experiment_id"] / "command.sh").read_text()
    assert f"{project / 'other-env' / 'bin' / 'python'} -m accelerate.commands.launch" in command

    env = json.loads((results / "env.json").read_text())
    listed = {e["name"]: e for e in env["environments"]}
    assert listed["here"]["python"] == sys.executable
    assert listed["here"]["versions"][PACKAGE] == HERE_VERSION
    assert listed["other"]["versions"][PACKAGE] == OTHER_VERSION

    summary = (results / "summary.md").read_text()
    assert "## Environments side by side" in summary
    assert f"here ({PACKAGE} {HERE_VERSION})" in summary
    assert f"other ({PACKAGE} {OTHER_VERSION})" in summary


def test_compare_across_environments_prints_both(
    ran: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    project, proc = ran
    assert proc.returncode == 0, proc.stdout + proc.stderr
    compared = tunematrix(
        project, "compare", "res", "--across", "environment", "--baseline", "here", "--no-plots"
    )
    assert compared.returncode in (0, 1), compared.stderr  # 1: the other one is slower
    out = compared.stdout
    assert "1 matched cells" in out
    assert (
        f"versions that differ: here: {PACKAGE} {HERE_VERSION}; other: {PACKAGE} {OTHER_VERSION}"
        in out
    )
    assert "other vs baseline: " in out and "tokens_per_second_global" in out
    assert "environment here" in (project / "res" / "compare.md").read_text()
