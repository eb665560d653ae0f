"""The embedded default model: built offline, deterministic, loadable."""

from __future__ import annotations

import hashlib
from pathlib import Path

from trainer_entry import tiny


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
