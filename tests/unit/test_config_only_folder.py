"""A local folder holding only a ``config.json``: an architecture, built with random weights.

For each task family the folder of a tiny model's config alone loads through the
project's loader with that family's tiny tokenizer (speech: the processor of the
config's kind, Whisper's or wav2vec2's; vision-language: tiny-vlm's processor), and the check before launch says what it will
do with it.
"""

from __future__ import annotations

import importlib
import shutil
from pathlib import Path

import pytest

from trainer_entry.models.kinds import TINY_MODELS, config_only, model_kind
from trainer_entry.models.load import load_model
from trainer_entry.models.resolve import resolve
from trainer_entry.settings.parsed import ModelConfig, PeftConfig
from trainer_entry.tasks import get_task


def _tiny(name: str) -> Path:
    module, _, function = TINY_MODELS[name].partition(":")
    return Path(getattr(importlib.import_module(module), function)())


def _config_folder(tmp_path: Path, tiny: str) -> Path:
    folder = tmp_path / f"{tiny}-architecture"
    folder.mkdir()
    shutil.copy(_tiny(tiny) / "config.json", folder / "config.json")
    return folder


def test_a_folder_with_weights_or_an_adapter_is_not_one(tmp_path: Path) -> None:
    folder = _config_folder(tmp_path, "tiny-t5")
    assert config_only(str(folder)) and model_kind(str(folder)) == "config"
    (folder / "model.safetensors").write_bytes(b"")
    assert not config_only(str(folder)) and model_kind(str(folder)) == "pretrained"
    assert not config_only(str(tmp_path / "missing"))


@pytest.mark.parametrize(
    ("task", "tiny", "tokenizer"),
    [
        ("seq2seq-lm", "tiny-t5", "tiny-t5"),
        ("seq2seq-lm", "tiny-bart", "tiny-t5"),
        ("masked-lm", "tiny-bert", "tiny-bert"),
        # speech: the processor (features and tokenizer) of the config's family
        ("speech-recognition", "tiny-whisper", "tiny-whisper"),
        ("speech-recognition", "tiny-wav2vec2", "tiny-wav2vec2"),
        # vision-language: the tiny VLM's processor (image processor, tokenizer, template)
        ("vision-language", "tiny-vlm", "tiny-vlm"),
    ],
)
def test_it_trains_with_the_familys_tiny_tokenizer(
    tmp_path: Path, task: str, tiny: str, tokenizer: str
) -> None:
    folder = _config_folder(tmp_path, tiny)
    where = resolve(str(folder))
    assert where.where == "architecture"
    assert "no weights" in where.describe() and "tiny" in where.describe()
    loaded = load_model(
        ModelConfig(name=str(folder)),
        PeftConfig(),
        on_gpu=False,
        local_rank=0,
        task=get_task(task),
    )
    assert loaded.info["kind"] == "config"
    inner = getattr(loaded.tokenizer, "tokenizer", loaded.tokenizer)  # a processor's
    assert Path(inner.name_or_path).resolve() == _tiny(tokenizer).resolve()
