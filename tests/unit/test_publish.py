"""Building a shared folder once: what build_once promises whatever the build does."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainer_entry.buildonce import build_once


def marked(folder: Path) -> bool:
    return (folder / "done").is_file()


def test_the_first_caller_builds_and_the_next_takes_the_folder(tmp_path: Path) -> None:
    target, calls = tmp_path / "cache" / "entry", []

    def build(folder: Path) -> None:
        calls.append(folder)
        (folder / "payload").write_text("x")
        (folder / "done").write_text("")

    assert build_once(target, build, marked, what="the entry") is True
    assert build_once(target, build, marked, what="the entry") is False
    assert len(calls) == 1 and calls[0] != target  # built in a private folder, then renamed
    assert (target / "payload").read_text() == "x"
    assert sorted(p.name for p in target.parent.iterdir()) == [".entry.lock", "entry"]


def test_a_build_that_does_not_finish_is_not_published(tmp_path: Path) -> None:
    target = tmp_path / "entry"

    def forgets_the_marker(folder: Path) -> None:
        (folder / "payload").write_text("x")

    with pytest.raises(RuntimeError, match=r"the build of the entry did not finish"):
        build_once(target, forgets_the_marker, marked, what="the entry")
    assert sorted(p.name for p in tmp_path.iterdir()) == [".entry.lock"]
