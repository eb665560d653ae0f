"""Experiment ids: stable across processes, changed by any argument, safe as folder names."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.config.scenarios import load_config
from orchestrator.contract.layout import ResultsLayout
from orchestrator.matrix import expand
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
      peft_method: lora
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


# Golden ids, computed by the code before `_expand_scenario` was split into steps:
# a refactoring of the expansion must keep every id byte for byte, or every
# earlier results folder would stop resuming and comparing. Since every cell names
# its task and trainer (issue 13) the ids are new, and only those two keys changed
# them: without them the expansion gives the ids from before (GOLDEN_IDS_BEFORE_TASKS).
GOLDEN_BEFORE_TASKS = """
frameworks:
  f:
    accelerate_config: accelerate.yaml
    arguments: {use_liger_kernel: true}
    env: {SOME_FLAG: "1"}
data_processing:
  dataset_name: data.jsonl
matrix:
  max_seq_len: [1024]
scenarios:
  - name: s
    framework_config: [null, f]
    arguments:
      model_name_or_path: [org/model, other/Model-7B]
      learning_rate: 2e-4
      target_modules: [q_proj, v_proj]
    sweep:
      r: [8, 16]
      lora_alpha: [16]
  - name: fixed-batch
    arguments:
      model_name_or_path: org/model
      per_device_train_batch_size: 2
      packing: false
"""
# LoRA settings need a peft_method now
GOLDEN = GOLDEN_BEFORE_TASKS.replace(
    "learning_rate: 2e-4\n      target_modules",
    "learning_rate: 2e-4\n      peft_method: lora\n      target_modules",
)

GOLDEN_IDS_BEFORE_TASKS = [
    "s.model.none.g1.eb4-64a53dab",
    "s.model.none.g1.eb4.r1-64a53dab",
    "s.model.none.g2.eb4-5a6c716a",
    "s.model.none.g2.eb4.r1-5a6c716a",
    "s.model.none.g1.eb4-31bd23e3",
    "s.model.none.g1.eb4.r1-31bd23e3",
    "s.model.none.g2.eb4-3c23efb0",
    "s.model.none.g2.eb4.r1-3c23efb0",
    "s.Model-7B.none.g1.eb4-ab792859",
    "s.Model-7B.none.g1.eb4.r1-ab792859",
    "s.Model-7B.none.g2.eb4-82280ddb",
    "s.Model-7B.none.g2.eb4.r1-82280ddb",
    "s.Model-7B.none.g1.eb4-4545ded0",
    "s.Model-7B.none.g1.eb4.r1-4545ded0",
    "s.Model-7B.none.g2.eb4-3aad2f58",
    "s.Model-7B.none.g2.eb4.r1-3aad2f58",
    "s.model.f.g1.eb4-c6360dd0",
    "s.model.f.g1.eb4.r1-c6360dd0",
    "s.model.f.g2.eb4-e6eb3983",
    "s.model.f.g2.eb4.r1-e6eb3983",
    "s.model.f.g1.eb4-24730a5a",
    "s.model.f.g1.eb4.r1-24730a5a",
    "s.model.f.g2.eb4-66d1e23f",
    "s.model.f.g2.eb4.r1-66d1e23f",
    "s.Model-7B.f.g1.eb4-9a9351b5",
    "s.Model-7B.f.g1.eb4.r1-9a9351b5",
    "s.Model-7B.f.g2.eb4-b2d08c5f",
    "s.Model-7B.f.g2.eb4.r1-b2d08c5f",
    "s.Model-7B.f.g1.eb4-92331d19",
    "s.Model-7B.f.g1.eb4.r1-92331d19",
    "s.Model-7B.f.g2.eb4-4fc69ba7",
    "s.Model-7B.f.g2.eb4.r1-4fc69ba7",
    "fixed-batch.model.none.g1.eb4-de4f978f",
    "fixed-batch.model.none.g1.eb4.r1-de4f978f",
    "fixed-batch.model.none.g2.eb4-dd54a0d5",
    "fixed-batch.model.none.g2.eb4.r1-dd54a0d5",
]
GOLDEN_IDS = [
    "s.model.none.g1.eb4-d7b375d1",
    "s.model.none.g1.eb4.r1-d7b375d1",
    "s.model.none.g2.eb4-0cfe1c95",
    "s.model.none.g2.eb4.r1-0cfe1c95",
    "s.model.none.g1.eb4-82b1f978",
    "s.model.none.g1.eb4.r1-82b1f978",
    "s.model.none.g2.eb4-61cc4a3f",
    "s.model.none.g2.eb4.r1-61cc4a3f",
    "s.Model-7B.none.g1.eb4-2e6f9871",
    "s.Model-7B.none.g1.eb4.r1-2e6f9871",
    "s.Model-7B.none.g2.eb4-9dd2c8ba",
    "s.Model-7B.none.g2.eb4.r1-9dd2c8ba",
    "s.Model-7B.none.g1.eb4-9e273fe0",
    "s.Model-7B.none.g1.eb4.r1-9e273fe0",
    "s.Model-7B.none.g2.eb4-dc766a35",
    "s.Model-7B.none.g2.eb4.r1-dc766a35",
    "s.model.f.g1.eb4-48bbd90d",
    "s.model.f.g1.eb4.r1-48bbd90d",
    "s.model.f.g2.eb4-50dd5463",
    "s.model.f.g2.eb4.r1-50dd5463",
    "s.model.f.g1.eb4-0da4ea3e",
    "s.model.f.g1.eb4.r1-0da4ea3e",
    "s.model.f.g2.eb4-5d079658",
    "s.model.f.g2.eb4.r1-5d079658",
    "s.Model-7B.f.g1.eb4-d78aa814",
    "s.Model-7B.f.g1.eb4.r1-d78aa814",
    "s.Model-7B.f.g2.eb4-57d7961b",
    "s.Model-7B.f.g2.eb4.r1-57d7961b",
    "s.Model-7B.f.g1.eb4-8c070cbb",
    "s.Model-7B.f.g1.eb4.r1-8c070cbb",
    "s.Model-7B.f.g2.eb4-ba0dc86e",
    "s.Model-7B.f.g2.eb4.r1-ba0dc86e",
    "fixed-batch.model.none.g1.eb4-420225e5",
    "fixed-batch.model.none.g1.eb4.r1-420225e5",
    "fixed-batch.model.none.g2.eb4-23938acd",
    "fixed-batch.model.none.g2.eb4.r1-23938acd",
]


@pytest.fixture
def before_tasks(monkeypatch: pytest.MonkeyPatch) -> None:
    """The expansion as it was before cells named their task and trainer (and before the
    planner refused settings that do not apply to them)."""
    monkeypatch.setattr(expand, "_check_applicable", lambda *args: "causal-lm")


@pytest.fixture
def before_one_spelling(monkeypatch: pytest.MonkeyPatch) -> None:
    """The expansion as it was before an old argument name (``gradient_checkpointing``)
    was taken as tunematrix's (``activation_checkpointing``), so rows and ids spell each
    setting one way."""
    monkeypatch.setattr(expand, "canonical_name", lambda key: key)


@pytest.fixture
def expansion_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """The plan in expansion order (the run order, orchestrator/matrix/order.py, set
    aside): the order the ids below were pinned in. The run order reorders the same ids
    (``test_the_run_order_keeps_every_id``)."""
    monkeypatch.setattr(expand, "order_experiments", tuple)


def test_the_run_order_keeps_every_id(plan) -> None:
    built = plan(GOLDEN, "seed: 42\n", num_gpus=(1, 2), effective_batch_size=(4,), repeats=2)
    ids = [e.experiment_id for e in built.experiments]
    assert ids != GOLDEN_IDS and sorted(ids) == sorted(GOLDEN_IDS)
    assert [e.position for e in built.experiments] == list(range(1, len(ids) + 1))


def test_ids_of_a_realistic_matrix_are_pinned(plan, expansion_order) -> None:
    built = plan(GOLDEN, "seed: 42\n", num_gpus=(1, 2), effective_batch_size=(4,), repeats=2)
    assert [e.experiment_id for e in built.experiments] == GOLDEN_IDS
    fixed = [e for e in built.experiments if e.scenario == "fixed-batch"]
    assert [e.gradient_accumulation_steps for e in fixed] == [2, 2, 1, 1]
    assert {(e.task, e.trainer) for e in built.experiments} == {("causal-lm", "sft")}


def test_only_the_task_and_trainer_changed_the_ids(plan, before_tasks, expansion_order) -> None:
    built = plan(
        GOLDEN_BEFORE_TASKS, "seed: 42\n", num_gpus=(1, 2), effective_batch_size=(4,), repeats=2
    )
    assert [e.experiment_id for e in built.experiments] == GOLDEN_IDS_BEFORE_TASKS


def test_an_earlier_hf_run_is_not_taken_for_a_new_cell(plan, before_tasks, monkeypatch) -> None:
    """Resuming (NO_OVERWRITE) keeps a run by its id: a folder of runs made before the
    trainer was chosen (all ``hf``) has no id of a cell that names its trainer, ``sft``
    or ``hf``, so nothing in it is skipped as already done."""
    text = BASE + "    sweep: {trainer: [sft, hf]}\n"
    before = set(_ids(plan, BASE))
    monkeypatch.undo()
    now = _ids(plan, text)
    assert len(now) == len(set(now)) == 2
    assert before.isdisjoint(now)


PREDECESSOR_FIRST_IDS_BEFORE_TASKS = [
    "full-finetuning.gpt_bigcode-santacoder.none.g1.eb4-c165de54",
    "full-finetuning.gpt_bigcode-santacoder.none.g1.eb8-ad0eae56",
]
PREDECESSOR_IDS_SHA256_BEFORE_TASKS = (
    "e8025797f4f3ad607cce6953a52599f501354d632f536b17a476353b99af90ad"
)
PREDECESSOR_FIRST_IDS = [
    "full-finetuning.gpt_bigcode-santacoder.none.g1.eb4-97bdf7af",
    "full-finetuning.gpt_bigcode-santacoder.none.g1.eb8-5b42fad3",
]
PREDECESSOR_IDS_SHA256 = "8b0c08ac90246b083368edfb9cb497be2f3fcb486351c28392b6d01917127049"


def _predecessor_ids(config_dir: Path) -> list[str]:
    fixtures = REPO / "tests" / "fixtures"
    config = load_config(
        fixtures / "fms_scenarios_2026-01.yaml",
        defaults_file=fixtures / "fms_defaults_2026-01.yaml",
        frameworks_files=[fixtures / "fms_sample_configurations" / "CONTENTS.yaml"],
        accelerate_fallback=config_dir / "accelerate.yaml",
    )
    built = build_plan(
        config,
        Selection(device="gpu", num_gpus=(1, 2), effective_batch_size=(4, 8), filters=("*",)),
        gpu_count=0,
    )
    return [e.experiment_id for e in built.experiments]


def test_ids_of_the_predecessors_matrix_are_pinned(config_dir: Path, expansion_order) -> None:
    """fms-acceleration's scenarios with its CONTENTS.yaml: the ids hash the plugin
    files' content (not their place), the framework overlays and the data stanza."""
    ids = _predecessor_ids(config_dir)
    assert len(ids) == 124
    assert ids[:2] == PREDECESSOR_FIRST_IDS
    assert hashlib.sha256("\n".join(ids).encode()).hexdigest() == PREDECESSOR_IDS_SHA256


def test_the_predecessors_ids_changed_only_by_task_trainer_and_one_spelling(
    config_dir, before_tasks, before_one_spelling, expansion_order
) -> None:
    ids = _predecessor_ids(config_dir)
    assert ids[:2] == PREDECESSOR_FIRST_IDS_BEFORE_TASKS
    assert hashlib.sha256("\n".join(ids).encode()).hexdigest() == (
        PREDECESSOR_IDS_SHA256_BEFORE_TASKS
    )
