"""What ``tunematrix compare`` leaves to the library: where ``run:N`` is looked up and
where the comparison is written, the same from code as from the command line."""

from __future__ import annotations

from pathlib import Path

import pytest
from fakeruns import write_run

from orchestrator import api
from orchestrator.results import history


def _recorded(tmp_path: Path) -> Path:
    """A results folder with one run in its history."""
    root = tmp_path / "results"
    write_run(root, "a.g1")
    write_run(root, "a.g2", num_gpus=2, tps=1800.0)
    rows = api.load_rows(root)
    history.record(history.path_for(root), rows, {"host": "box"}, root)
    return root


def test_run_ids_are_looked_up_in_the_history_of_the_new_folder(tmp_path) -> None:
    root = _recorded(tmp_path)
    result = api.compare(root, "run:1", threshold=0.05)
    assert result.regressions.empty
    assert len(result.only_new) == len(result.only_ref) == 0
    # a table is no folder: there is no history to look in unless one is named
    api.load_rows(root).to_csv(tmp_path / "rows.csv", index=False)
    with pytest.raises(api.UserError, match="no history to look it up in"):
        api.compare(tmp_path / "rows.csv", "run:1")
    assert not api.compare(
        tmp_path / "rows.csv", "run:1", history=history.path_for(root)
    ).table.empty


def test_the_comparison_is_written_into_the_new_folder_else_here(tmp_path) -> None:
    root = _recorded(tmp_path)
    assert api.compare_folder(root, None) == root
    assert api.compare_folder(root, tmp_path / "out") == tmp_path / "out"
    assert api.compare_folder(tmp_path / "rows.csv", None) == Path(".")
    written = api.compare(root, "run:1", out=api.compare_folder(root, None), plots=False).written
    assert root / "compare.md" in written and (root / "compare.md").is_file()
