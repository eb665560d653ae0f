"""Files tunematrix writes get the mode the user's umask gives a new file."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.contract.layout import file_mode, umask, write_atomic


@pytest.fixture
def set_umask() -> Iterator[object]:
    old = os.umask(0o022)
    os.umask(old)

    def apply(mask: int) -> None:
        os.umask(mask)

    yield apply
    os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("mask", [0o022, 0o002, 0o027, 0o077])
def test_atomic_writes_follow_the_umask(tmp_path, set_umask, mask: int) -> None:
    set_umask(mask)
    assert umask() == mask
    write_atomic(tmp_path / "summary.md", "x\n")
    write_atomic(tmp_path / "command.sh", "true\n", executable=True)
    assert _mode(tmp_path / "summary.md") == 0o666 & ~mask
    assert _mode(tmp_path / "command.sh") == 0o777 & ~mask
    # a rewrite keeps following the umask, not the earlier file's mode
    (tmp_path / "summary.md").chmod(0o600)
    write_atomic(tmp_path / "summary.md", "y\n")
    assert _mode(tmp_path / "summary.md") == 0o666 & ~mask
    assert file_mode() == 0o666 & ~mask


def test_the_history_database_follows_the_umask(tmp_path, set_umask) -> None:
    import pandas as pd

    from orchestrator.results import history

    set_umask(0o002)
    db = history.path_for(tmp_path)
    history.record(db, pd.DataFrame(columns=["status"]), {}, tmp_path)
    assert db.exists() and _mode(db) == 0o664


def test_the_results_lock_follows_the_umask(tmp_path, set_umask) -> None:
    from orchestrator.running.resultsdir import open_results

    set_umask(0o002)
    with open_results(tmp_path / "results", resume=False):
        pass
    assert _mode(tmp_path / "results" / ".lock") == 0o664
