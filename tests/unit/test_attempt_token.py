"""A child writes into its run folder only while its attempt is the folder's
(``RunSpec.is_current``, ``trainer_entry.results.ownership``)."""

from __future__ import annotations

import json
from pathlib import Path

from orchestrator.contract.spec import read_spec
from trainer_entry.measure.progressfile import ProgressFile


def _spec(folder: Path, token: str | None) -> Path:
    path = folder / "spec.json"
    record = {"experiment_id": "e", "arguments": {"model_name_or_path": "tiny-llama"}}
    if token is not None:
        record["attempt_token"] = token
    path.write_text(json.dumps(record))
    return path


def test_an_attempt_is_current_while_its_spec_file_holds_its_token(tmp_path: Path) -> None:
    spec = read_spec(_spec(tmp_path, "first"))
    assert spec.is_current()
    _spec(tmp_path, "second")  # a later attempt wrote its own
    assert not spec.is_current()
    (tmp_path / "spec.json").unlink()  # moved to attempts/<n>/ by a resume
    assert not spec.is_current()
    # there but unreadable is not another attempt's (a spec is written whole): kept
    (tmp_path / "spec.json").write_text('{"attempt_token": "sec')
    assert spec.is_current()


def test_a_spec_without_a_token_is_always_current(tmp_path: Path) -> None:
    spec = read_spec(_spec(tmp_path, None))
    (tmp_path / "spec.json").unlink()
    assert spec.is_current()


def test_the_progress_file_is_not_written_once_the_attempt_is_over(tmp_path: Path) -> None:
    owned = [True]
    progress = ProgressFile(tmp_path / "progress.json", world_size=1, may_write=lambda: owned[0])
    progress.begin(10)
    assert (tmp_path / "progress.json").is_file()
    (tmp_path / "progress.json").unlink()
    owned[0] = False
    progress.step(1, 64, 0.1)
    progress.end(1)
    assert not (tmp_path / "progress.json").exists()
