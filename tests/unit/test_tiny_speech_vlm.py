"""The embedded speech and vision-language models, and the shipped architectures of their kinds.

``tiny-whisper``, ``tiny-wav2vec2`` and ``tiny-vlm``: each builds offline into the
cache, loads back with its Auto classes, learns from a batch with labels (a finite
loss), and builds the same bytes twice, its weights those ``save_pretrained`` writes. The
shipped Whisper, wav2vec 2.0, LLaVA and Qwen2-VL architectures build on the meta device
at their published sizes.
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from trainer_entry.models import tiny_vlm, tiny_wav2vec2, tiny_whisper
from trainer_entry.models.tiny import COMPLETE


def _digest(folder: Path) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.iterdir())
        if p.is_file() and p.name != COMPLETE
    }


def _weights_of_save_pretrained(model, folder: Path, tmp_path: Path) -> None:
    """The weights in ``folder`` are those ``save_pretrained`` writes: its names (no tied
    copy, the hub's layout), byte for byte. (A loaded model's config is not the one that
    was saved: loading adds to it.)"""
    model.save_pretrained(tmp_path / "theirs")
    assert _digest(tmp_path / "theirs")["model.safetensors"] == _digest(folder)["model.safetensors"]


def _audio(seconds: list[float]) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [(0.1 * rng.standard_normal(int(16000 * s))).astype(np.float32) for s in seconds]


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "cache"
    monkeypatch.setenv("TUNEMATRIX_CACHE", str(folder))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return folder


def test_tiny_whisper_builds_loads_and_learns(cache, tmp_path) -> None:
    from transformers import (
        AutoFeatureExtractor,
        AutoModelForSpeechSeq2Seq,
        AutoProcessor,
        AutoTokenizer,
        WhisperProcessor,
    )

    path = tiny_whisper.ensure_tiny_whisper()
    assert path == tiny_whisper.tiny_whisper_path() and path.parent == cache
    assert tiny_whisper.is_complete(path) and path.name.startswith("tiny-whisper-")
    assert tiny_whisper.ensure_tiny_whisper() == path  # built once

    tokenizer = AutoTokenizer.from_pretrained(path)
    features = AutoFeatureExtractor.from_pretrained(path)
    assert isinstance(AutoProcessor.from_pretrained(path), WhisperProcessor)
    model = AutoModelForSpeechSeq2Seq.from_pretrained(path)
    config = model.config
    assert len(tokenizer) == config.vocab_size == 1024
    sot = tokenizer.convert_tokens_to_ids("<|startoftranscript|>")
    eot = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    assert (config.decoder_start_token_id, config.bos_token_id) == (sot, sot)
    assert (config.eos_token_id, config.pad_token_id) == (eot, eot)
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id) == (
        sot,
        eot,
        eot,
    )
    ids = tokenizer("The blade is excellent.")["input_ids"]
    assert ids[0] == sot and ids[-1] == eot
    assert tokenizer.decode(ids, skip_special_tokens=True) == "The blade is excellent."

    # any length of audio comes out as the encoder's 2 x max_source_positions frames
    batch = features(_audio([0.5, 3.0]), sampling_rate=16000, return_tensors="pt")
    assert batch["input_features"].shape == (2, 80, 2 * config.max_source_positions)
    labels = tokenizer(
        ["a short one", "the edge works perfectly"], padding=True, return_tensors="pt"
    )
    targets = labels["input_ids"].masked_fill(labels["attention_mask"] == 0, -100)[:, 1:]
    loss = model(input_features=batch["input_features"], labels=targets).loss
    assert math.isfinite(loss.item())
    loss.backward()

    tiny_whisper.build(tmp_path / "again")
    assert _digest(tmp_path / "again") == _digest(path)
    _weights_of_save_pretrained(model, path, tmp_path)


def test_tiny_wav2vec2_builds_loads_and_learns(cache, tmp_path) -> None:
    from transformers import AutoModelForCTC, AutoProcessor, Wav2Vec2Processor

    path = tiny_wav2vec2.ensure_tiny_wav2vec2()
    assert path == tiny_wav2vec2.tiny_wav2vec2_path() and path.parent == cache
    assert tiny_wav2vec2.is_complete(path) and path.name.startswith("tiny-wav2vec2-")

    processor = AutoProcessor.from_pretrained(path)
    assert isinstance(processor, Wav2Vec2Processor)
    tokenizer = processor.tokenizer
    model = AutoModelForCTC.from_pretrained(path)
    assert len(tokenizer) == model.config.vocab_size == len(tiny_wav2vec2.vocabulary())
    assert tokenizer.pad_token_id == model.config.pad_token_id == 0
    assert tokenizer.convert_ids_to_tokens([0, 4]) == ["<pad>", "|"]
    assert tokenizer.unk_token_id not in tokenizer("the tip is excellent, 42.")["input_ids"]
    assert model.config.ctc_loss_reduction == "mean"
    # one frame per 160 samples
    lengths = model._get_feat_extract_output_lengths(torch.tensor([16000, 32000]))
    assert lengths.tolist() == [99, 199]

    batch = processor(
        audio=_audio([1.0, 1.5]), sampling_rate=16000, return_tensors="pt", padding=True
    )
    assert batch["attention_mask"].sum(1).tolist() == [16000, 24000]
    labels = processor(
        text=["a short one", "the edge works perfectly"], padding=True, return_tensors="pt"
    )
    targets = labels["input_ids"].masked_fill(labels["attention_mask"] == 0, -100)
    model.train()
    loss = model(**batch, labels=targets).loss
    assert math.isfinite(loss.item())
    loss.backward()

    tiny_wav2vec2.build(tmp_path / "again")
    assert _digest(tmp_path / "again") == _digest(path)
    _weights_of_save_pretrained(model, path, tmp_path)


def test_tiny_vlm_builds_loads_and_learns(cache, tmp_path) -> None:
    from transformers import AutoModelForImageTextToText, AutoProcessor, LlavaProcessor

    path = tiny_vlm.ensure_tiny_vlm()
    assert path == tiny_vlm.tiny_vlm_path() and path.parent == cache
    assert tiny_vlm.is_complete(path) and path.name.startswith("tiny-vlm-")

    processor = AutoProcessor.from_pretrained(path)
    assert isinstance(processor, LlavaProcessor)
    model = AutoModelForImageTextToText.from_pretrained(path)
    config = model.config
    image = processor.tokenizer.convert_tokens_to_ids("<image>")
    assert image == config.image_token_index == processor.image_token_id == 1024
    assert len(processor.tokenizer) == config.text_config.vocab_size == 1025

    messages = [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Which shape?"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "A circle."}]},
    ]
    prompt = processor.apply_chat_template(messages)
    assert prompt.count("<image>") == 1
    pictures = (np.random.default_rng(0).random((2, 48, 40, 3)) * 255).astype(np.uint8)
    batch = processor(
        images=list(pictures), text=[prompt, "<image>\nshort"], padding=True, return_tensors="pt"
    )
    assert batch["pixel_values"].shape == (2, 3, 32, 32)
    assert (batch["input_ids"] == image).sum(1).tolist() == [64, 64]
    ignored = (batch["attention_mask"] == 0) | (batch["input_ids"] == image)
    labels = batch["input_ids"].masked_fill(ignored, -100)
    loss = model(**batch, labels=labels).loss
    assert math.isfinite(loss.item())
    loss.backward()

    tiny_vlm.build(tmp_path / "again")
    assert _digest(tmp_path / "again") == _digest(path)
    _weights_of_save_pretrained(model, path, tmp_path)


#: shipped architecture -> (its Auto class, its published parameter count)
PUBLISHED = {
    "whisper-small": ("AutoModelForSpeechSeq2Seq", 242e6),
    "whisper-large-v3": ("AutoModelForSpeechSeq2Seq", 1.55e9),
    "wav2vec2-base": ("AutoModelForCTC", 94.4e6),
    "llava-1.5-7b": ("AutoModelForImageTextToText", 7.06e9),
    "qwen2-vl-7b": ("AutoModelForImageTextToText", 8.29e9),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_the_shipped_architecture_builds_at_its_published_size(name) -> None:
    import transformers
    from transformers import AutoConfig

    from trainer_entry.models.resolve import architecture_config

    auto, published = PUBLISHED[name]
    config = AutoConfig.for_model(**architecture_config(f"config:{name}"))
    with torch.device("meta"):
        model = getattr(transformers, auto).from_config(config)
    count = sum(p.numel() for p in model.parameters())
    assert abs(count - published) / published < 0.02, f"{name}: {count:,}"
    assert config.architectures == [type(model).__name__]
