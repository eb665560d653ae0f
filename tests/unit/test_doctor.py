"""`tunematrix doctor`: one screen of what this machine has, with what to install; changes nothing."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
from hiding import pythonpath_hiding

from orchestrator import __version__, doctor
from orchestrator.cli.app import main
from orchestrator.doctor import (
    AccelerateFacts,
    DiskFacts,
    Facts,
    Installed,
    Requirement,
)
from orchestrator.executors.slurm import settings as slurm_settings
from orchestrator.executors.slurm.doctor import SlurmFacts
from orchestrator.job import hardware
from orchestrator.running import needs

REPO = Path(__file__).resolve().parents[2]
GIB = 1024**3


def _doctor(tmp_path: Path, *argv: str, pythonpath: str = str(REPO), **env: str) -> Any:
    """The real ``python -m orchestrator doctor``, from an empty folder."""
    home = tmp_path / "hf-home"  # no accelerate default config there
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", "doctor", *argv],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": pythonpath, "HF_HOME": str(home), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def _tree(root: Path) -> list[Path]:
    return sorted(p.relative_to(root) for p in root.rglob("*"))


# ---------------------------------------------------------------------------
# The real command on this machine
# ---------------------------------------------------------------------------


def test_doctor_on_this_machine(tmp_path) -> None:
    before = _tree(tmp_path)
    result = _doctor(tmp_path, "--results", "res/a")
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stderr == ""
    lines = result.stdout.splitlines()
    assert len(lines) <= 25
    for module in needs.TRAIN_STACK:
        version = metadata.version(module)
        if module == "torch":
            version = version.split("+", 1)[0]  # the build is said in words
        assert any(line.startswith(f"ok    {module} {version}") for line in lines), module
    if "+cpu" in metadata.version("torch"):
        assert f"ok    torch {metadata.version('torch').split('+')[0]} (CPU build)" in lines
    if hardware.gpu_count() == 0:
        assert "info  no GPU: CPU matrices only (DEVICE=cpu)" in lines
    else:
        assert any(line.startswith("ok    GPUs: ") for line in lines)
    # no scenarios.yaml here: jobs get the shipped accelerate.yaml, as `plan` says
    assert (
        "info  accelerate default config: none (jobs get --config_file: their framework's, "
        f"else {REPO / 'accelerate.yaml'})"
    ) in lines
    assert f"results: {tmp_path / 'res' / 'a'} (not there yet; {tmp_path} is);" in result.stdout
    assert lines[-1].startswith("ready for: CPU matrices")
    # nothing was written: the results folder was not made, nothing else appeared
    assert _tree(tmp_path) == before


def test_a_missing_training_package_is_named_with_its_install_and_exit_1(tmp_path) -> None:
    pythonpath = pythonpath_hiding(tmp_path / "blocker", "accelerate")
    result = _doctor(tmp_path, pythonpath=pythonpath)
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert (
        "miss  accelerate — for the training stack: pip install 'tunematrix[train]' "
        "(with your CUDA build of torch first)"
    ) in lines
    assert any(line.startswith("ok    peft ") for line in lines)
    assert "missing: CPU matrices (accelerate)" in lines[-1]
    assert "CPU matrices" not in lines[-1].split(";")[0]


BLOCKER_CHECK = """
import sys
from orchestrator.cli.app import main
code = main(sys.argv[1:])
stack = {"torch", "transformers", "trl", "peft", "accelerate", "datasets", "deepspeed", "bitsandbytes"}
loaded = sorted(m for m in sys.modules if m.partition(".")[0] in stack)
assert not loaded, loaded
sys.exit(code)
"""


def test_doctor_does_not_import_the_training_stack(tmp_path) -> None:
    result = subprocess.run(
        [sys.executable, "-c", BLOCKER_CHECK, "doctor", "--results", str(tmp_path / "r")],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "torch" in result.stdout


def test_json_is_machine_readable(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    code = main(["doctor", "--json", "--results", str(tmp_path / "r")])
    report = json.loads(capsys.readouterr().out)
    assert report["exit_code"] == code == 0
    assert "CPU matrices" in report["ready_for"]
    by_name = {check["name"]: check for check in report["checks"]}
    assert {"python", "torch", "NVML", "GPUs", "SLURM", "results"} <= set(by_name)
    assert by_name["torch"]["state"] == "ok"
    assert by_name["torch"]["required"] is True
    assert set(by_name["torch"]) == {"state", "name", "detail", "fix", "required", "blocks"}
    assert not (tmp_path / "r").exists()


def test_the_default_accelerate_config_is_shown_and_said_to_be_unused(
    tmp_path, capsys, monkeypatch
) -> None:
    config = tmp_path / "hf" / "accelerate" / "default_config.yaml"
    config.parent.mkdir(parents=True)
    config.write_text("distributed_type: FSDP\nnum_processes: 8\nmixed_precision: bf16\n")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    main(["doctor", "--results", str(tmp_path)])
    out = capsys.readouterr().out
    assert (
        f"info  accelerate default config: {config} (distributed_type FSDP, num_processes 8, "
        "mixed_precision bf16); not used: jobs get --config_file: their framework's, else "
        f"{REPO / 'accelerate.yaml'}"
    ) in out.splitlines()


def test_the_default_config_path_is_the_one_accelerate_reads(tmp_path) -> None:
    """Our copy of accelerate's rule against accelerate itself (which imports torch)."""
    pytest.importorskip("accelerate")
    script = (
        "import importlib, os\n"
        "from accelerate.commands.config import config_args\n"
        "print(config_args.default_config_file)\n"
        "os.environ['HF_HOME'] = os.environ['HOME_FOR_HF']\n"
        "print(importlib.reload(config_args).default_config_file)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "HF_HOME"}
    env.update(XDG_CACHE_HOME=str(tmp_path / "xdg"), HOME_FOR_HF=str(tmp_path / "hf"))
    result = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    xdg, hf = result.stdout.split()
    assert Path(xdg) == doctor.accelerate_default_config({"XDG_CACHE_HOME": str(tmp_path / "xdg")})
    assert Path(hf) == doctor.accelerate_default_config(
        {"HF_HOME": str(tmp_path / "hf"), "XDG_CACHE_HOME": "/elsewhere"}
    )
    assert doctor.accelerate_default_config({}) == (
        Path.home() / ".cache" / "huggingface" / "accelerate" / "default_config.yaml"
    )


def test_install_hints_name_extras_that_exist() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    train = {doctor.parse_requirement(r).name for r in extras["train"]}  # type: ignore[union-attr]
    assert set(needs.TRAIN_STACK) <= train
    assert "'tunematrix[train]'" in needs.TRAIN_INSTALL
    assert "'tunematrix[slurm]'" in slurm_settings.INSTALL
    assert any(r.startswith("submitit") for r in extras["slurm"])


# ---------------------------------------------------------------------------
# Rows from given facts (pure)
# ---------------------------------------------------------------------------

REQUIREMENTS = {
    r.name: r
    for r in (
        Requirement("pyyaml", ">=6.0", None),
        Requirement("pandas", ">=2.1", None),
        Requirement("nvidia-ml-py", ">=12.0", None),
        Requirement("torch", ">=2.4", "train"),
        Requirement("transformers", ">=5.0", "train"),
        Requirement("peft", ">=0.17", "train"),
        Requirement("accelerate", ">=1.0", "train"),
        Requirement("datasets", ">=3.0", "train"),
        Requirement("submitit", ">=1.5", "slurm"),
    )
}
VERSIONS = {
    "pyyaml": "6.0.3",
    "pandas": "3.1.1",
    "nvidia-ml-py": "13.615.71",
    "torch": "2.13.0+cu128",
    "transformers": "5.23.0",
    "peft": "0.21.2",
    "accelerate": "1.15.0",
    "datasets": "5.2.0",
    "submitit": "1.5.4",
    "trl": "1.16.0",
    "bitsandbytes": None,
    "deepspeed": None,
}
H100 = {"name": "NVIDIA H100 80GB HBM3", "memory_bytes": 80 * GIB}
TWO_H100 = {
    "driver": "550.54.15",
    "cuda_driver": "12.4",
    "devices": [{"index": 0, **H100}, {"index": 1, **H100}],
}
NO_NVML = {"nvml": "unavailable (NVML Shared Library Not Found)"}
NO_SLURM = SlurmFacts({"sbatch": None, "squeue": None, "sinfo": None}, None, None)
ALL_SLURM = {c: f"/usr/bin/{c}" for c in ("sbatch", "squeue", "sinfo")}


def facts(
    tmp_path: Path,
    *,
    versions: dict[str, str | None] | None = None,
    slurm: SlurmFacts = NO_SLURM,
    **changes: Any,
) -> Facts:
    """Facts of a machine with two H100s; ``slurm``: what the SLURM executor's probe found."""
    installed = {**VERSIONS, **(versions or {})}
    base = Facts(
        python="3.11.7",
        executable="/venv/bin/python",
        requires_python=">=3.10",
        requirements=REQUIREMENTS,
        packages={d: Installed(v, v is not None) for d, v in installed.items()},
        torch_needs_nvidia=False,
        nvml=TWO_H100,
        proc_gpus=[],
        proc_driver=None,
        visible=None,
        accelerate=AccelerateFacts(tmp_path / "default_config.yaml", None, None, REPO / "a.yaml"),
        disk=DiskFacts(tmp_path, tmp_path, 500 * GIB, True),
        env={},
        executors={"slurm": slurm},
    )
    return dataclasses.replace(base, **changes)


def lines_of(f: Facts) -> list[str]:
    return doctor.format_text(doctor.diagnose(f)).splitlines()


def test_two_gpus_through_nvml(tmp_path) -> None:
    lines = lines_of(facts(tmp_path))
    assert "ok    torch 2.13.0 (CUDA 12.8 build)" in lines
    assert "ok    NVML: nvidia-ml-py 13.615.71; initialises" in lines
    assert "ok    GPUs: 2 × NVIDIA H100 80GB HBM3 (80 GiB), driver 550.54.15 (CUDA 12.4)" in lines
    assert lines[-1].startswith("ready for: CPU matrices, GPU matrices (2 GPUs), hub datasets;")
    assert "qlora (bitsandbytes)" in lines[-1]
    assert doctor.diagnose(facts(tmp_path)).exit_code == 0


def test_gpus_narrowed_or_hidden_by_cuda_visible_devices(tmp_path) -> None:
    one = lines_of(facts(tmp_path, visible=["1"]))
    assert any(line.endswith("; CUDA_VISIBLE_DEVICES='1' leaves 1") for line in one)
    assert "GPU matrices (1 GPU)" in one[-1]
    none = lines_of(facts(tmp_path, visible=[]))
    assert any(
        line.startswith("warn  GPUs: 2 × ") and "leaves 0 — unset CUDA_VISIBLE_DEVICES" in line
        for line in none
    )
    assert "GPU matrices (no GPU)" in none[-1]


def test_gpus_from_proc_when_nvml_fails(tmp_path) -> None:
    f = facts(tmp_path, nvml=NO_NVML, proc_gpus=["NVIDIA A100-SXM4-80GB"] * 2, proc_driver="535.1")
    lines = lines_of(f)
    assert "ok    GPUs: 2 × NVIDIA A100-SXM4-80GB, driver 535.1 (from /proc/driver/nvidia)" in lines
    # GPUs are here but NVML is not: worth a warning (memory sampling reads NVML)
    assert (
        "warn  NVML: nvidia-ml-py 13.615.71; unavailable (NVML Shared Library Not Found)" in lines
    )


def test_where_a_cells_energy_comes_from(tmp_path) -> None:
    gpus = lines_of(facts(tmp_path))
    assert any(line.startswith("info  energy: each GPU's NVML energy counter") for line in gpus)
    cpu = {"nvml": NO_NVML, "versions": {"torch": "2.13.0+cpu"}}
    readable = lines_of(facts(tmp_path, rapl=(2, ""), **cpu))
    assert "ok    energy: RAPL: 2 CPU package(s) readable (CPU cells' energy)" in readable
    why = "no RAPL here: /sys/class/powercap does not exist (no powercap driver on this machine)"
    none = lines_of(facts(tmp_path, rapl=(0, why), **cpu))
    assert f"info  energy: CPU cells get no energy figure: {why}" in none


def test_no_gpu(tmp_path) -> None:
    lines = lines_of(facts(tmp_path, nvml=NO_NVML, versions={"torch": "2.13.0+cpu"}))
    assert "info  no GPU: CPU matrices only (DEVICE=cpu)" in lines
    assert (
        "info  NVML: nvidia-ml-py 13.615.71; unavailable (NVML Shared Library Not Found)" in lines
    )
    assert "ok    torch 2.13.0 (CPU build)" in lines
    assert "GPU matrices (no GPU)" in lines[-1]


def test_a_cpu_torch_on_a_gpu_machine_is_a_warning(tmp_path) -> None:
    d = doctor.diagnose(facts(tmp_path, versions={"torch": "2.13.0+cpu"}))
    text = doctor.format_text(d)
    assert "warn  torch 2.13.0 (CPU build) — GPUs are here: install torch's CUDA build" in text
    assert "GPU matrices (torch's CUDA build)" in text.splitlines()[-1]
    assert d.exit_code == 0  # the CPU matrix still runs


def test_a_version_below_the_requirement_is_bad_and_exit_1(tmp_path) -> None:
    d = doctor.diagnose(facts(tmp_path, versions={"transformers": "4.57.0"}))
    assert (
        "bad   transformers 4.57.0, tunematrix needs >=5.0 — pip install 'transformers>=5.0'"
        in doctor.format_text(d)
    )
    assert d.exit_code == 1
    assert d.missing["CPU matrices"] == ["transformers"]


def test_a_missing_core_package_is_named_with_its_requirement(tmp_path) -> None:
    d = doctor.diagnose(facts(tmp_path, versions={"pandas": None}))
    lines = doctor.format_text(d).splitlines()
    assert (
        f"miss  tunematrix {__version__}: pandas not installed — pip install 'pandas>=2.1'" in lines
    )
    assert "missing: CPU matrices (pandas)" in lines[-1]
    assert d.exit_code == 1


def test_optional_packages_are_information_not_failure(tmp_path) -> None:
    d = doctor.diagnose(facts(tmp_path, versions={"datasets": None}))
    lines = doctor.format_text(d).splitlines()
    assert (
        "info  bitsandbytes not installed (needed for qlora scenarios) — pip install bitsandbytes"
        in lines
    )
    assert (
        "info  deepspeed not installed (needed for DeepSpeed scenarios)"
        " — pip install 'tunematrix[deepspeed]'" in lines
    )
    assert (
        "info  datasets not installed (needed for datasets named on the hub) — "
        "pip install 'datasets>=3.0'"
    ) in lines
    assert d.exit_code == 0


@pytest.mark.parametrize(
    ("slurm", "submitit", "row", "ready"),
    [
        (
            NO_SLURM,
            None,
            "info  SLURM: no sbatch, squeue or sinfo on the PATH (--executor slurm runs from a login node)",
            False,
        ),
        (
            SlurmFacts(ALL_SLURM, ["gpu*", "debug"], None),
            "1.5.4",
            "ok    SLURM: sbatch, squeue, sinfo on the PATH; sinfo answers (partitions: gpu*, debug)",
            True,
        ),
        (
            SlurmFacts(ALL_SLURM, None, "no answer in 3 s"),
            "1.5.4",
            "warn  SLURM: sbatch, squeue, sinfo on the PATH; sinfo does not answer: no answer in 3 s",
            False,
        ),
        (
            SlurmFacts({**ALL_SLURM, "sbatch": None}, ["gpu"], None),
            "1.5.4",
            "warn  SLURM: squeue, sinfo on the PATH, not sbatch; sinfo answers (partitions: gpu)",
            False,
        ),
    ],
)
def test_slurm(tmp_path, slurm: SlurmFacts, submitit: str | None, row: str, ready: bool) -> None:
    d = doctor.diagnose(facts(tmp_path, slurm=slurm, versions={"submitit": submitit}))
    assert row in doctor.format_text(d).splitlines()
    assert ("SLURM" in d.ready) is ready
    assert d.exit_code == 0


def test_submitit_is_a_miss_only_where_slurm_is(tmp_path) -> None:
    here = facts(tmp_path, slurm=SlurmFacts(ALL_SLURM, ["gpu"], None), versions={"submitit": None})
    d = doctor.diagnose(here)
    assert (
        "miss  submitit — for --executor slurm: pip install 'tunematrix[slurm]'"
        in doctor.format_text(d).splitlines()
    )
    assert d.missing["SLURM"] == ["submitit"]
    assert d.exit_code == 0  # SLURM is not needed for the CPU matrix
    elsewhere = lines_of(facts(tmp_path, versions={"submitit": None}))
    assert "info  submitit — for --executor slurm: pip install 'tunematrix[slurm]'" in elsewhere


def test_results_folder(tmp_path) -> None:
    low = lines_of(facts(tmp_path, disk=DiskFacts(tmp_path, tmp_path, 2 * GIB, True)))
    assert any(
        line.startswith(f"warn  results: {tmp_path}; 2.0 GiB free — under 10 GiB") for line in low
    )
    locked = doctor.diagnose(facts(tmp_path, disk=DiskFacts(tmp_path / "r", tmp_path, GIB, False)))
    assert (
        f"bad   results: {tmp_path / 'r'} (not there yet; {tmp_path} is) — {tmp_path} is not "
        "writable by this user"
    ) in doctor.format_text(locked).splitlines()
    assert locked.exit_code == 1
    assert (
        "missing: CPU matrices (a writable results folder)"
        in (doctor.format_text(locked).splitlines()[-1])
    )
    in_the_way = DiskFacts(tmp_path / "file" / "r", tmp_path / "file", GIB, False, folder=False)
    blocked = doctor.diagnose(facts(tmp_path, disk=in_the_way))
    assert (
        f"bad   results: {tmp_path / 'file' / 'r'} cannot be made — {tmp_path / 'file'} is a file"
        in doctor.format_text(blocked).splitlines()
    )
    assert blocked.exit_code == 1


def test_the_user_default_accelerate_config_where_jobs_would_read_it(tmp_path) -> None:
    acc = AccelerateFacts(
        Path("/h/default_config.yaml"), {"distributed_type": "MULTI_GPU"}, None, None
    )
    lines = lines_of(facts(tmp_path, accelerate=acc))
    assert (
        "warn  accelerate default config: /h/default_config.yaml (distributed_type MULTI_GPU); "
        "used by jobs whose framework names no config"
    ) in lines


def test_env_row_only_when_something_is_set(tmp_path) -> None:
    assert not any(line.startswith("info  env:") for line in lines_of(facts(tmp_path)))
    lines = lines_of(facts(tmp_path, env={"HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": ""}))
    assert (
        "info  env: HF_HUB_OFFLINE=1, CUDA_VISIBLE_DEVICES='' — hub models and datasets must be "
        "in the cache"
    ) in lines


def test_one_screen(tmp_path) -> None:
    busy = facts(
        tmp_path,
        env={"HF_HOME": "/h", "HF_HUB_OFFLINE": "1"},
        slurm=SlurmFacts(ALL_SLURM, [f"p{i}" for i in range(40)], None),
    )
    lines = lines_of(busy)
    assert len(lines) <= 25
    assert "partitions: p0, p1, p2, p3, p4 and 35 more" in "\n".join(lines)


@pytest.mark.parametrize(
    ("version", "nvidia", "label"),
    [
        ("2.13.0+cpu", False, "2.13.0 (CPU build)"),
        ("2.6.0+cu124", False, "2.6.0 (CUDA 12.4 build)"),
        ("2.6.0+cu118", False, "2.6.0 (CUDA 11.8 build)"),
        ("2.5.1+rocm6.2", False, "2.5.1 (ROCm 6.2 build)"),
        ("2.8.0", True, "2.8.0 (CUDA build)"),
        ("2.8.0", False, "2.8.0"),
        ("2.9.0a0+gitabc", False, "2.9.0a0+gitabc"),
    ],
)
def test_torch_build_label(version: str, nvidia: bool, label: str) -> None:
    assert doctor.torch_build_label(version, nvidia) == label


def test_requirements_parse() -> None:
    assert doctor.parse_requirement('torch>=2.4; extra == "train"') == Requirement(
        "torch", ">=2.4", "train"
    )
    assert doctor.parse_requirement("types-PyYAML") == Requirement("types-PyYAML", "", None)
    assert doctor.parse_requirement("pandas>=2.1", "x") == Requirement("pandas", ">=2.1", "x")
    assert doctor.satisfies("2.13.0+cpu", ">=2.4") is True
    assert doctor.satisfies("4.57.0", ">=5.0") is False


def test_proc_entries_without_nvml(tmp_path) -> None:
    for bus, model in (("0000:07:00.0", "NVIDIA A100-SXM4-80GB"), ("0000:0f:00.0", "NVIDIA L4")):
        (tmp_path / "gpus" / bus).mkdir(parents=True)
        (tmp_path / "gpus" / bus / "information").write_text(
            f"Model: \t\t {model}\nIRQ:   \t\t 42\n"
        )
    (tmp_path / "version").write_text(
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024\n"
        "GCC version:  gcc version 12.2.0\n"
    )
    assert hardware.proc_gpus(tmp_path) == (["NVIDIA A100-SXM4-80GB", "NVIDIA L4"], "550.54.15")
    assert hardware.proc_gpus(tmp_path / "absent") == ([], None)
