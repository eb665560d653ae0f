"""The embedded CTC speech model ``tiny-wav2vec2``: built offline, deterministically, once.

A two-layer wav2vec 2.0 encoder (width 64) with a CTC head over characters,
initialised from a fixed seed, with its character tokenizer and raw-waveform
feature extractor. Nothing is downloaded.

The convolutional feature encoder is three layers of 32 channels, kernels
(10, 8, 4) and strides (5, 8, 4): an overall stride of 160 samples, one frame
per 10 ms of 16 kHz audio (100 frames a second, where wav2vec 2.0 Base has 50),
each seeing 165 samples. Its convolutions are layer-normalised and the
transformer is pre-norm (``feat_extract_norm`` "layer", ``do_stable_layer_norm``),
as in the wav2vec 2.0 models whose feature extractor returns an attention mask
for padded batches; layerdrop is off, so every step runs both layers (a
skipped layer also leaves DDP parameters without gradients).

The tokenizer is ``Wav2Vec2CTCTokenizer`` over a ``vocab.json`` written here:
``<pad>`` (id 0, the CTC blank and the model's ``pad_token_id``), ``<s>``,
``</s>``, ``<unk>``, ``|`` (the word delimiter a space becomes) and then every
character of the shipped texts (the review set and the instruction set),
lowercased, whitespace left out. A text is to be lowercased, and its
whitespace made single spaces, before it is tokenized: the tokenizer reads an
upper-case letter, a newline or a character the shipped texts lack as
``<unk>``. The feature extractor takes 16 kHz mono audio,
normalises it to zero mean and unit variance and returns an attention mask;
both are saved as a ``Wav2Vec2Processor`` (``AutoProcessor``).

Built, cached and published as every tiny model is
(``trainer_entry.models.tiny.TinyModel``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trainer_entry.models import tiny

TINY_WAV2VEC2_NAME = "tiny-wav2vec2"

# The recipe. Changing any of it changes the cache key.
_RECIPE: dict[str, Any] = {
    "version": 1,
    "seed": 1357,
    # pad first: id 0, the CTC blank
    "special_tokens": ["<pad>", "<s>", "</s>", "<unk>"],
    "word_delimiter": "|",
    "feature_extractor": {
        "feature_size": 1,
        "sampling_rate": 16000,
        "padding_value": 0.0,
        "do_normalize": True,
        "return_attention_mask": True,
    },
    "model": {
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 128,
        # overall stride 5 * 8 * 4 = 160 samples (10 ms at 16 kHz)
        "conv_dim": [32, 32, 32],
        "conv_kernel": [10, 8, 4],
        "conv_stride": [5, 8, 4],
        "conv_bias": True,
        "feat_extract_norm": "layer",
        "do_stable_layer_norm": True,
        "num_conv_pos_embeddings": 16,
        "num_conv_pos_embedding_groups": 4,
        "layerdrop": 0.0,
        "ctc_loss_reduction": "mean",
    },
}

#: What a build must have written before it is marked finished.
BUILT_FILES = (
    "config.json",
    "model.safetensors",
    "vocab.json",
    "tokenizer_config.json",
    "processor_config.json",
)


TINY_WAV2VEC2 = tiny.TinyModel(
    TINY_WAV2VEC2_NAME, _RECIPE, tiny.SHIPPED_TEXTS, lambda folder: build(folder), BUILT_FILES
)
tiny_wav2vec2_path, is_complete, ensure_tiny_wav2vec2 = TINY_WAV2VEC2.functions()


def vocabulary() -> dict[str, int]:
    """The CTC vocabulary: the special tokens, the word delimiter, then the characters of
    the shipped texts, lowercased, in code-point order."""
    characters = {c for text in tiny.shipped_texts() for c in text.lower() if not c.isspace()}
    tokens = [*_RECIPE["special_tokens"], _RECIPE["word_delimiter"], *sorted(characters)]
    return {token: i for i, token in enumerate(tokens)}


def build(folder: Path) -> None:
    """Write the vocabulary, initialise the model, save both and the feature extractor to
    ``folder``."""
    from transformers import (
        Wav2Vec2Config,
        Wav2Vec2CTCTokenizer,
        Wav2Vec2FeatureExtractor,
        Wav2Vec2ForCTC,
        Wav2Vec2Processor,
    )

    pad, bos, eos, unk = _RECIPE["special_tokens"]
    folder.mkdir(parents=True, exist_ok=True)
    vocab_file = folder / "vocab.json"
    vocab_file.write_text(json.dumps(vocabulary(), ensure_ascii=False), encoding="utf-8")
    tokenizer = Wav2Vec2CTCTokenizer(
        str(vocab_file),
        bos_token=bos,
        eos_token=eos,
        unk_token=unk,
        pad_token=pad,
        word_delimiter_token=_RECIPE["word_delimiter"],
    )
    feature_extractor = Wav2Vec2FeatureExtractor(**_RECIPE["feature_extractor"])
    # rewrites vocab.json in the tokenizer's own layout
    Wav2Vec2Processor(feature_extractor=feature_extractor, tokenizer=tokenizer).save_pretrained(
        folder
    )
    config = Wav2Vec2Config(**tiny.token_ids(tokenizer, "pad", "bos", "eos"), **_RECIPE["model"])
    tiny.save_model(tiny.seeded(Wav2Vec2ForCTC, config, _RECIPE["seed"]), folder)
