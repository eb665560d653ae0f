"""The check's verdicts, kept (orchestrator/running/checkverdicts.py): a rerun on the same
stack, code, settings and files asks the child about nothing it has seen, and any change
to one of them asks again. The child's answers are given here; the interpreter's
packages are read for real (a probe of this interpreter)."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from orchestrator.contract.errors import ConfigError
from orchestrator.matrix.experiment import Experiment
from orchestrator.running import checkverdicts
from orchestrator.running.stackcheck import check_stack

VERSIONS = {"torch": "2.11.0", "transformers": "5.17.0"}


def _scenarios(dataset: Path, rate: str = "1e-4", model: str = "tiny-llama") -> str:
    return f"""\
matrix:
  effective_batch_size: [4, 8]
scenarios:
  - name: a
    device: cpu
    arguments:
      model_name_or_path: {model}
      dataset: {dataset}
      learning_rate: {rate}
"""


class Child:
    """Answers as the check child would, and remembers what it was asked."""

    def __init__(self, where: str = "shipped", problem_for: str | None = None) -> None:
        self.asked: list[list[str]] = []
        self.where = where
        self.problem_for = problem_for

    def __call__(self, python: str, cells: Sequence[Experiment]) -> dict[str, Any]:
        self.asked.append([e.cell_id for e in cells])
        problems = [
            {"cell": e.cell_id, "key": "learning_rate", "message": "refused"}
            for e in cells
            if self.problem_for and str(e.arguments.get("learning_rate")) == self.problem_for
        ]
        return {
            "versions": VERSIONS,
            "models": {
                e.model_name_or_path: {"cell": e.cell_id, "where": self.where, "offline": False}
                for e in cells
            },
            "problems": problems,
            "unbuilt": 0,
            "unbuilt_cells": [],
        }


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("TUNEMATRIX_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def dataset(tmp_path) -> Path:
    path = tmp_path / "records.jsonl"
    path.write_text('{"text": "a"}\n')
    return path


def test_a_rerun_asks_nothing_it_has_seen_and_says_so(plan, cache, dataset) -> None:
    built = plan(_scenarios(dataset), num_gpus=(1,), device="cpu")
    child = Child()
    first = check_stack(built, run=child, keep=True)
    assert len(child.asked) == 1 and len(child.asked[0]) == 2
    assert first.checked[0].kept == 0 and "kept" not in first.lines()[0]
    again = check_stack(built, run=child, keep=True)
    assert len(child.asked) == 1  # not asked again
    (line, model) = again.lines()
    assert line.startswith("checked 2 cell(s) against torch 2.11.0, transformers 5.17.0 (")
    assert "all kept from an earlier check of this stack, code and settings)" in line
    assert model == "  model tiny-llama: shipped"
    assert list(cache.joinpath("checks").iterdir())
    # a matrix that adds a cell asks about that cell alone
    more = plan(_scenarios(dataset).replace("[4, 8]", "[4, 8, 16]"), num_gpus=(1,), device="cpu")
    added = check_stack(more, run=child, keep=True)
    assert [len(a) for a in child.asked] == [2, 1]
    assert "; 2 kept from an earlier check" in added.lines()[0]
    # --recheck asks about every cell again
    check_stack(built, run=child, keep=True, recheck=True)
    assert [len(a) for a in child.asked] == [2, 1, 2]
    # without keep (a test's own answers, --no-check aside) nothing is read or kept
    other = Child()
    check_stack(built, run=other)
    assert len(other.asked) == 1


def test_a_changed_setting_or_file_is_asked_about_again(plan, cache, dataset) -> None:
    child = Child()
    check_stack(plan(_scenarios(dataset), num_gpus=(1,), device="cpu"), run=child, keep=True)
    check_stack(
        plan(_scenarios(dataset, rate="2e-4"), num_gpus=(1,), device="cpu"), run=child, keep=True
    )
    assert [len(a) for a in child.asked] == [2, 2]  # another learning rate: other cells
    built = plan(_scenarios(dataset), num_gpus=(1,), device="cpu")
    check_stack(built, run=child, keep=True)
    assert len(child.asked) == 2  # the first settings again: kept
    # the dataset the settings name, rewritten (its modification time and size change)
    os.utime(dataset, ns=(1_000_000_000, 1_000_000_000))
    check_stack(built, run=child, keep=True)
    assert len(child.asked) == 3
    dataset.unlink()  # and gone: asked again (the child would say it is missing)
    check_stack(built, run=child, keep=True)
    assert len(child.asked) == 4


def test_a_variable_the_libraries_read_is_part_of_the_key(plan, cache, dataset, monkeypatch):
    built = plan(_scenarios(dataset), num_gpus=(1,), device="cpu")
    child = Child()
    check_stack(built, run=child, keep=True)
    monkeypatch.setenv("HF_ENDPOINT", "https://mirror.example")
    check_stack(built, run=child, keep=True)
    monkeypatch.setenv("SOMETHING_ELSE", "1")  # read by none of them: still kept
    check_stack(built, run=child, keep=True)
    assert [len(a) for a in child.asked] == [2, 2]


def test_an_installed_package_is_part_of_the_key(plan, cache, dataset, tmp_path, monkeypatch):
    """A package appearing where the interpreter looks (PYTHONPATH here) changes the stack."""
    built = plan(_scenarios(dataset), num_gpus=(1,), device="cpu")
    child = Child()
    check_stack(built, run=child, keep=True)
    site = tmp_path / "site"
    info = site / "newpkg-1.0.dist-info"
    info.mkdir(parents=True)
    info.joinpath("METADATA").write_text("Metadata-Version: 2.1\nName: newpkg\nVersion: 1.0\n")
    monkeypatch.setenv("PYTHONPATH", str(site))
    stack = checkverdicts.stack_fingerprint(sys.executable, dict(os.environ))
    assert stack is not None and ["newpkg", "1.0"] in stack["dists"]
    check_stack(built, run=child, keep=True)
    info.joinpath("METADATA").write_text("Metadata-Version: 2.1\nName: newpkg\nVersion: 1.1\n")
    check_stack(built, run=child, keep=True)
    assert [len(a) for a in child.asked] == [2, 2, 2]


def test_only_cells_found_without_the_network_are_kept(plan, cache, dataset) -> None:
    # a hub model: its verdict depends on the hub, asked every time
    hub = Child(where="hub")
    built = plan(_scenarios(dataset, model="org/model"), num_gpus=(1,), device="cpu")
    check_stack(built, run=hub, keep=True)
    check_stack(built, run=hub, keep=True)
    assert len(hub.asked) == 2
    # a refused cell stops the run; the cells that passed are kept, and so is the refusal:
    # the same stack, code, settings and files find it again, in the same line
    text = _scenarios(dataset) + _scenarios(dataset, rate="9").split("scenarios:\n")[1].replace(
        "name: a", "name: b"
    )
    both = plan(text, num_gpus=(1,), device="cpu")
    refusing = Child(problem_for="9")
    with pytest.raises(ConfigError, match="refused") as first:
        check_stack(both, run=refusing, keep=True)
    with pytest.raises(ConfigError, match="refused") as again:
        check_stack(both, run=refusing, keep=True)
    assert [len(a) for a in refusing.asked] == [4]
    assert str(again.value) == str(first.value)
    # plan --memory (stop=False) shows the kept refusal for its cells, asking nothing
    shown = check_stack(both, run=refusing, keep=True, stop=False)
    assert len(shown.refused) == 2 and [len(a) for a in refusing.asked] == [4]
    # a model found through the hub: its refusal is asked again, as its passes are
    hub_refusing = Child(where="hub", problem_for="9")
    on_hub = plan(text.replace("tiny-llama", "org/model"), num_gpus=(1,), device="cpu")
    for _ in range(2):
        with pytest.raises(ConfigError, match="refused"):
            check_stack(on_hub, run=hub_refusing, keep=True)
    assert [len(a) for a in hub_refusing.asked] == [4, 4]


def test_an_unreadable_cache_is_checked_afresh_and_written_again(plan, cache, dataset) -> None:
    built = plan(_scenarios(dataset), num_gpus=(1,), device="cpu")
    child = Child()
    check_stack(built, run=child, keep=True)
    (kept,) = cache.joinpath("checks").iterdir()
    kept.write_text("{not json")
    check_stack(built, run=child, keep=True)
    check_stack(built, run=child, keep=True)
    assert [len(a) for a in child.asked] == [2, 2]


def test_a_local_models_files_and_a_python_models_package_are_part_of_the_key(
    tmp_path, monkeypatch
) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "modeling_x.py").write_text("x = 1\n")
    before = checkverdicts.named_paths({"model_name_or_path": str(model)})
    os.utime(model / "modeling_x.py", ns=(1, 1))  # its remote code edited in place
    assert checkverdicts.named_paths({"model_name_or_path": str(model)}) != before
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mymodels").mkdir()
    spec = {"model_name_or_path": "python:mymodels.build:make", "python_path": []}
    assert checkverdicts.named_paths(spec)["python:mymodels.build:make"] is None
    (tmp_path / "mymodels" / "__init__.py").write_text("")
    found = checkverdicts.named_paths(spec)["python:mymodels.build:make"]
    assert found is not None and found[0].endswith("mymodels/__init__.py")
