"""The embedded default model: built offline, deterministic, loadable."""

from __future__ import annotations

import errno
import hashlib
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainer_entry import buildonce
from trainer_entry.models import tiny


def _digest(folder: Path) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.iterdir())
        if p.is_file()
    }


def test_build_is_deterministic(tmp_path) -> None:
    tiny.build(tmp_path / "a")
    tiny.build(tmp_path / "b")
    a, b = _digest(tmp_path / "a"), _digest(tmp_path / "b")
    assert a == b
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(a)


def test_ensure_builds_once_then_loads(tiny_path) -> None:
    assert tiny_path == tiny.tiny_path()
    assert tiny_path.parent == tiny.cache_root()
    stamp = (tiny_path / "config.json").stat().st_mtime_ns
    assert tiny.ensure_tiny() == tiny_path
    assert (tiny_path / "config.json").stat().st_mtime_ns == stamp


def test_tiny_model_loads_and_tokenizes(tiny_path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_path)
    model = AutoModelForCausalLM.from_pretrained(tiny_path)
    ids = tok("Explain LoRA in a few sentences.")["input_ids"]
    assert ids[0] == tok.bos_token_id
    assert tok.decode(ids, skip_special_tokens=True) == "Explain LoRA in a few sentences."
    assert len(tok) == model.get_input_embeddings().num_embeddings == 1024
    assert sum(p.numel() for p in model.parameters()) < 300_000


def _fake_build(folder: Path) -> None:
    """Stands in for the real build where only the publishing is under test."""
    for name in tiny.BUILT_FILES:
        (folder / name).write_text("{}")
    (folder / "config.json").write_text('{"model_type": "llama"}')


def test_the_model_files_are_those_of_save_pretrained(tmp_path) -> None:
    # written directly (save_pretrained skips them on ranks other than 0), byte for byte the same
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=64, pad_token_id=0, bos_token_id=1, eos_token_id=2, **tiny._RECIPE["model"]
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    (tmp_path / "ours").mkdir()
    tiny.save_model(model, tmp_path / "ours")
    model.save_pretrained(tmp_path / "theirs")
    assert _digest(tmp_path / "ours") == _digest(tmp_path / "theirs")
    assert set(_digest(tmp_path / "ours")) == {
        "config.json",
        "generation_config.json",
        "model.safetensors",
    }


def test_a_build_that_leaves_out_a_file_is_not_published(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TUNEMATRIX_CACHE", str(tmp_path))

    def tokenizer_only(folder: Path) -> None:
        _fake_build(folder)
        (folder / "model.safetensors").unlink()

    monkeypatch.setattr(tiny, "build", tokenizer_only)
    with pytest.raises(RuntimeError, match=r"wrote no model\.safetensors"):
        tiny.ensure_tiny()
    assert not tiny.tiny_path().exists()
    assert _private(tmp_path) == []


def _private(cache: Path) -> list[str]:
    return sorted(p.name for p in cache.iterdir() if p.is_dir() and p.name.startswith("."))


def test_a_half_built_folder_is_not_taken_but_replaced(tmp_path, monkeypatch) -> None:
    # left by other means than a build (a copy cut short, an older layout): only the
    # tokenizer, or even the config, without the marker of a finished build
    monkeypatch.setenv("TUNEMATRIX_CACHE", str(tmp_path))
    monkeypatch.setattr(tiny, "build", _fake_build)
    target = tiny.tiny_path()
    for leftover in ("tokenizer.json", "config.json"):
        target.mkdir(exist_ok=True)
        (target / leftover).write_text("half")
        (target / tiny.COMPLETE).unlink(missing_ok=True)
        assert not tiny.is_complete(target)
        assert tiny.ensure_tiny() == target
        assert tiny.is_complete(target)
        assert (target / "config.json").read_text() == '{"model_type": "llama"}'
        assert (target / "model.safetensors").read_text() == "{}"
        assert _private(tmp_path) == []


def test_the_loser_of_a_race_takes_the_winners_folder(tmp_path, monkeypatch) -> None:
    # another builder (on a file system whose lock did not keep it out) publishes
    # while this one builds: this one's rename meets a finished folder
    monkeypatch.setenv("TUNEMATRIX_CACHE", str(tmp_path))
    target = tiny.tiny_path()

    def build_and_lose(folder: Path) -> None:
        _fake_build(folder)
        winner = tmp_path / "winner"
        winner.mkdir()
        (winner / "config.json").write_text("the winner's")
        (winner / tiny.COMPLETE).write_text(tiny.TINY.key())
        os.rename(winner, target)

    monkeypatch.setattr(tiny, "build", build_and_lose)
    assert tiny.ensure_tiny() == target
    assert (target / "config.json").read_text() == "the winner's"
    assert _private(tmp_path) == []


def test_a_failed_build_leaves_nothing(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TUNEMATRIX_CACHE", str(tmp_path))

    def broken(folder: Path) -> None:
        _fake_build(folder)
        raise RuntimeError("no space left")

    monkeypatch.setattr(tiny, "build", broken)
    with pytest.raises(RuntimeError, match="no space left"):
        tiny.ensure_tiny()
    assert not tiny.tiny_path().exists()
    assert _private(tmp_path) == []


def test_stale_private_folders_are_removed_live_ones_kept(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TUNEMATRIX_CACHE", str(tmp_path))
    monkeypatch.setattr(tiny, "build", _fake_build)
    name = tiny.tiny_path().name
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    dead = tmp_path / f".{name}.{buildonce.host()}-{int(gone.stdout)}-0123abcd"
    alive = tmp_path / f".{name}.{buildonce.host()}-{os.getppid()}-0123abcd"
    elsewhere = tmp_path / f".{name}.otherhost-{os.getppid()}-0123abcd"
    old_elsewhere = tmp_path / f".{name}.otherhost-{os.getppid()}-4567abcd"
    older_naming = tmp_path / f".{name}.x1y2z3_w"
    for folder in (dead, alive, elsewhere, old_elsewhere, older_naming):
        folder.mkdir()
        (folder / "config.json").write_text("half")
    hours_ago = time.time() - 2 * buildonce.STALE_AFTER_S
    for folder in (old_elsewhere, older_naming):
        os.utime(folder, (hours_ago, hours_ago))
    tiny.ensure_tiny()
    assert _private(tmp_path) == sorted([alive.name, elsewhere.name])


def test_the_published_folder_follows_the_umask_not_0700(tmp_path, monkeypatch) -> None:
    # a shared cache: the other users must be able to read the model and take the lock
    monkeypatch.setenv("TUNEMATRIX_CACHE", str(tmp_path))
    monkeypatch.setattr(tiny, "build", _fake_build)
    old = os.umask(0o022)
    try:
        target = tiny.ensure_tiny()
    finally:
        os.umask(old)
    assert stat.S_IMODE(target.stat().st_mode) == 0o755
    lock = tmp_path / f".{target.name}.lock"
    assert stat.S_IMODE(lock.stat().st_mode) == 0o644


def test_without_a_working_lock_the_build_still_happens(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TUNEMATRIX_CACHE", str(tmp_path))
    monkeypatch.setattr(tiny, "build", _fake_build)

    def no_lock(fd: int, op: int) -> None:
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(buildonce.fcntl, "flock", no_lock)
    assert tiny.is_complete(tiny.ensure_tiny())
