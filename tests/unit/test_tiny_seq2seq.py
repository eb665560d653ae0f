"""The embedded encoder-decoders ``tiny-t5`` and ``tiny-bart``, and the shipped seq2seq configs.

Each tiny model is built into the session's temporary cache (``TUNEMATRIX_CACHE``,
set by ``tests/conftest.py``), found there again without a rebuild, built a
second time elsewhere with the same bytes, and loaded back as a seq2seq LM
whose tokenizer follows its family's conventions and whose loss on a batch is
finite. The shipped ``t5-base``, ``t5-large`` and ``bart-large`` architectures
are built on the meta device and counted.
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

import pytest
import torch

from trainer_entry.models import tiny_bart, tiny_t5
from trainer_entry.models.resolve import architecture_config

#: each tiny model's module and the function that builds it into the cache
TINY_MODELS = {
    "tiny-t5": (tiny_t5, tiny_t5.ensure_tiny_t5, tiny_t5.tiny_t5_path),
    "tiny-bart": (tiny_bart, tiny_bart.ensure_tiny_bart, tiny_bart.tiny_bart_path),
}

#: the published parameter counts (embedding tied to the head, counted once)
PUBLISHED = {"t5-base": 223e6, "t5-large": 738e6, "bart-large": 406e6}


def _digest(folder: Path) -> dict[str, str]:
    """What the build wrote (the completion marker aside), file by file."""
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.iterdir())
        if p.is_file() and not p.name.startswith(".")
    }


@pytest.fixture(scope="module")
def t5_path(_hermetic_cache: Path) -> Path:
    return tiny_t5.ensure_tiny_t5()


@pytest.fixture(scope="module")
def bart_path(_hermetic_cache: Path) -> Path:
    return tiny_bart.ensure_tiny_bart()


def _loss(path: Path) -> tuple[object, float]:
    """The tokenizer, and the loss of the saved model on a padded batch with labels."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSeq2SeqLM.from_pretrained(path)
    assert len(tokenizer) == model.get_input_embeddings().num_embeddings == 1024
    # the head is the shared embedding, as in the real models
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    assert sum(p.numel() for p in model.parameters()) < 400_000
    batch = tokenizer(
        ["Summarize: the film was long but the ending paid off.", "Translate: hello"],
        text_target=["A slow film with a good ending.", "bonjour"],
        padding=True,
        return_tensors="pt",
    )
    batch["labels"][batch["labels"] == tokenizer.pad_token_id] = -100
    with torch.no_grad():
        loss = model(**batch).loss
    return tokenizer, float(loss)


@pytest.mark.parametrize("name", list(TINY_MODELS))
def test_built_once_into_the_cache_and_the_same_when_built_again(
    name: str, tmp_path: Path, _hermetic_cache: Path
) -> None:
    module, ensure, where = TINY_MODELS[name]
    path = ensure()
    assert path == where() and path.parent == _hermetic_cache and path.name.startswith(name + "-")
    assert module.is_complete(path)
    stamp = (path / "model.safetensors").stat().st_mtime_ns
    assert ensure() == path and (path / "model.safetensors").stat().st_mtime_ns == stamp
    module.build(tmp_path / "again")
    built = _digest(path)
    assert built == _digest(tmp_path / "again")  # the weights' hash included
    assert set(module.BUILT_FILES) <= set(built)


def test_tiny_t5_keeps_t5s_conventions_and_learns(t5_path: Path) -> None:
    tokenizer, loss = _loss(t5_path)
    assert (tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.unk_token_id) == (0, 1, 2)
    assert tokenizer.bos_token_id is None
    assert tokenizer("hi")["input_ids"][-1] == 1  # </s> after every text, nothing before
    ids = tokenizer("Explain LoRA in a few sentences.")["input_ids"]
    assert ids[-1] == 1 and ids.count(1) == 1 and 0 not in ids
    assert tokenizer.decode(ids, skip_special_tokens=True) == "Explain LoRA in a few sentences."
    assert tokenizer("a", "b")["input_ids"].count(1) == 2
    assert math.isfinite(loss) and loss > 0


def test_tiny_t5_config_is_t5_v1_0(t5_path: Path) -> None:
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(t5_path)
    assert config.model_type == "t5" and config.architectures == ["T5ForConditionalGeneration"]
    assert (config.pad_token_id, config.eos_token_id, config.decoder_start_token_id) == (0, 1, 0)
    assert (config.d_model, config.d_ff, config.d_kv, config.num_heads) == (64, 128, 16, 4)
    assert (config.num_layers, config.num_decoder_layers) == (2, 2)
    assert config.feed_forward_proj == "relu" and config.tie_word_embeddings


def test_tiny_bart_keeps_barts_conventions_and_learns(bart_path: Path) -> None:
    tokenizer, loss = _loss(bart_path)
    specials = ("bos", "pad", "eos", "unk", "mask")
    assert tuple(getattr(tokenizer, f"{s}_token_id") for s in specials) == (0, 1, 2, 3, 4)
    ids = tokenizer("Explain LoRA in a few sentences.")["input_ids"]
    assert (ids[0], ids[-1]) == (0, 2)
    assert tokenizer.decode(ids, skip_special_tokens=True) == "Explain LoRA in a few sentences."
    pair = tokenizer("a", "b")["input_ids"]
    assert pair[0] == 0 and pair.count(2) == 3 and pair[-1] == 2
    assert math.isfinite(loss) and loss > 0


def test_tiny_bart_config_and_generation_settings(bart_path: Path) -> None:
    from transformers import AutoConfig, GenerationConfig

    config = AutoConfig.from_pretrained(bart_path)
    assert config.model_type == "bart" and config.architectures == ["BartForConditionalGeneration"]
    assert (config.bos_token_id, config.pad_token_id, config.eos_token_id) == (0, 1, 2)
    assert (config.d_model, config.encoder_layers, config.decoder_layers) == (64, 2, 2)
    assert config.max_position_embeddings == 512
    generation = GenerationConfig.from_pretrained(bart_path)
    assert (generation.decoder_start_token_id, generation.forced_eos_token_id) == (2, 2)


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_shipped_seq2seq_architectures_have_the_published_size(name: str) -> None:
    from transformers import AutoConfig, AutoModelForSeq2SeqLM

    config = AutoConfig.for_model(**architecture_config(f"config:{name}"))
    with torch.device("meta"):
        model = AutoModelForSeq2SeqLM.from_config(config)
    assert type(model).__name__ == config.architectures[0]
    count = sum(p.numel() for p in model.parameters())
    assert abs(count - PUBLISHED[name]) / PUBLISHED[name] < 0.02, f"{name}: {count:,}"
