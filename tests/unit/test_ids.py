"""Experiment ids: stable across processes, changed by any argument, safe as folder names."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.config.scenarios import load_config
from orchestrator.contract.layout import ResultsLayout
from orchestrator.matrix.expand import Selection, build_plan
from orchestrator.matrix.ids import model_short_name

REPO = Path(__file__).resolve().parents[2]
ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*-[0-9a-f]{8}$")

BASE = """
frameworks:
  f:
    accelerate_config: accelerate.yaml
    arguments: {use_liger_kernel: true}
    env: {SOME_FLAG: "1"}
data_processing:
  dataset_name: data.jsonl
scenarios:
  - name: s
    framework_config: [f]
    arguments:
      model_name_or_path: org/model
      learning_rate: 2e-4
      target_modules: [q_proj, v_proj]
"""


def _ids_of_shipped_files() -> list[str]:
    config = load_config(
        REPO / "scenarios.yaml",
        defaults_file=REPO / "defaults.yaml",
        accelerate_fallback=REPO / "accelerate.yaml",
    )
    plan = build_plan(
        config,
        Selection(device="gpu", num_gpus=(1, 2, 4), filters=("*",), repeats=2),
        gpu_count=0,
    )
    return [e.experiment_id for e in plan.experiments]


def test_ids_are_the_same_in_another_process() -> None:
    script = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); "
        "from tests.unit.test_ids import _ids_of_shipped_files; "
        "print(json.dumps(_ids_of_shipped_files()))"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run(
        [sys.executable, "-c", script, str(REPO)],
        capture_output=True,
        text=True,
        check=True,
        env=env,
        cwd=REPO,
    )
    assert json.loads(out.stdout) == _ids_of_shipped_files()


def test_ids_are_unique_and_well_formed() -> None:
    ids = _ids_of_shipped_files()
    assert len(ids) == len(set(ids)) > 50
    for eid in ids:
        assert ID_RE.match(eid), eid
        assert len(eid) < 200


def _ids(plan, text: str, defaults: str = "", **selection) -> list[str]:
    selection.setdefault("num_gpus", (1,))
    selection.setdefault("effective_batch_size", (4,))
    selection.setdefault("filters", ("*",))
    return [e.experiment_id for e in plan(text, defaults, **selection).experiments]


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("learning_rate: 2e-4", "learning_rate: 3e-4"),
        ("target_modules: [q_proj, v_proj]", "target_modules: [q_proj, k_proj]"),
        ("target_modules: [q_proj, v_proj]", "target_modules: [v_proj, q_proj]"),
        ("model_name_or_path: org/model", "model_name_or_path: other/model"),
        ("use_liger_kernel: true", "use_liger_kernel: false"),
        ('SOME_FLAG: "1"', 'SOME_FLAG: "2"'),
        ("dataset_name: data.jsonl", "dataset_name: other.jsonl"),
        ("- name: s", "- name: t"),
        ("framework_config: [f]", "device: cpu\n    framework_config: [f]"),
        ("learning_rate: 2e-4", "learning_rate: 2e-4\n      max_grad_norm: 0.5"),
    ],
)
def test_any_change_of_the_spec_changes_the_id(plan, old: str, new: str) -> None:
    assert old in BASE
    before = _ids(plan, BASE)
    after = _ids(plan, BASE.replace(old, new))
    assert before != after
    assert len(before) == len(after) == 1


@pytest.mark.parametrize(
    "selection",
    [
        {"num_gpus": (2,)},
        {"effective_batch_size": (8,)},
    ],
)
def test_axes_change_the_id(plan, selection) -> None:
    assert _ids(plan, BASE) != _ids(plan, BASE, **selection)


def test_defaults_and_matrix_axes_change_the_id(plan) -> None:
    base = _ids(plan, BASE)
    assert base != _ids(plan, BASE, "seed: 1\n")
    assert base != _ids(plan, "matrix:\n  max_seq_len: [1024]\n" + BASE)
    assert base != _ids(plan, "matrix:\n  packing: [false]\n" + BASE)
    assert _ids(plan, BASE, "seed: 1\n") == _ids(plan, BASE, "seed: 1\n")


def test_accelerate_config_content_changes_the_id_but_comments_do_not(plan, config_dir) -> None:
    base = _ids(plan, BASE)
    path = config_dir / "accelerate.yaml"
    path.write_text("# a comment\n" + path.read_text())
    assert _ids(plan, BASE) == base
    path.write_text(path.read_text().replace("FSDP", "MULTI_GPU"))
    assert _ids(plan, BASE) != base


def test_id_reads_like_the_cell(plan) -> None:
    (eid,) = _ids(plan, BASE, num_gpus=(2,), effective_batch_size=(8,))
    assert re.match(r"^s\.model\.f\.g2\.eb8-[0-9a-f]{8}$", eid)


@pytest.mark.parametrize(
    ("model", "short"),
    [
        ("mistralai/Mistral-7B-v0.1", "Mistral-7B-v0.1"),
        ("config:llama-3.1-8b", "llama-3.1-8b"),
        ("../../etc/passwd", "passwd"),
        ("/abs/models/llama/", "llama"),
        ("..", "model"),
        ("C:\\models\\x y", "x-y"),
        ("モデル", "model"),
        ("a" * 300, "a" * 48),
        ("weird..name", "weird.name"),
    ],
)
def test_model_short_name_is_path_safe(model: str, short: str) -> None:
    assert model_short_name(model) == short


@pytest.mark.parametrize("model", ["../../etc", "/abs/path/model", "../..", "x/../../y", "~/m"])
def test_hostile_model_names_stay_inside_the_results_folder(plan, tmp_path, model: str) -> None:
    text = f"scenarios:\n  - name: s\n    arguments:\n      model_name_or_path: '{model}'\n"
    (eid,) = _ids(plan, text)
    layout = ResultsLayout(tmp_path / "results")
    run_dir = layout.run(eid).dir.resolve()
    assert run_dir.parent == (tmp_path / "results" / "runs").resolve()
    assert ID_RE.match(eid)
