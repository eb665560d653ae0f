"""A missing package is named once, before anything launches, not by every experiment."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hiding import pythonpath_hiding

from orchestrator.contract.errors import UserError
from orchestrator.running.needs import needs, require

REPO = Path(__file__).resolve().parents[2]


def test_what_a_matrix_needs(plan, write) -> None:
    write("ds.yaml", "distributed_type: DEEPSPEED\n")
    experiments = plan(
        """
        frameworks:
          zero3: {accelerate_config: ds.yaml}
        scenarios:
          - name: q
            framework_config: [null, zero3]
            arguments: {model_name_or_path: tiny-llama, peft_method: qlora}
        """
    ).experiments
    modules = [n.module for n in needs(experiments, "slurm")]
    assert modules == [
        "torch",
        "transformers",
        "peft",
        "accelerate",
        "trl",
        "submitit",
        "bitsandbytes",
        "deepspeed",
    ]
    assert needs([], "local") == []


def test_one_line_names_every_missing_package(plan) -> None:
    experiments = plan(
        "scenarios:\n  - name: a\n    arguments: {model_name_or_path: tiny-llama}\n"
    ).experiments
    absent = {"accelerate", "peft", "submitit"}
    with pytest.raises(UserError) as caught:
        require(experiments, "slurm", find=lambda m: None if m in absent else object())
    assert str(caught.value) == (
        "not installed: peft, accelerate (for the training stack: pip install "
        "'tunematrix[train]' (with your CUDA build of torch first)); submitit (for "
        "--executor slurm: pip install 'tunematrix[slurm]'); nothing was started"
    )
    require(experiments, "local", find=lambda m: object())  # all there: no error


def test_run_without_the_training_stack_stops_before_launching(tmp_path) -> None:
    """The real CLI in an interpreter that cannot import accelerate or peft."""
    pythonpath = pythonpath_hiding(tmp_path / "blocker", "accelerate", "peft")
    result = subprocess.run(
        [sys.executable, "-m", "orchestrator", "run", "--device", "cpu", "--results", "res"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": pythonpath},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr.startswith("tunematrix: error: not installed: peft, accelerate (for the")
    assert result.stderr.count("\n") == 1
    assert not (tmp_path / "res").exists()
