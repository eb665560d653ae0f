"""The embedded speech-to-text model ``tiny-whisper``: built offline, deterministically, once.

A Whisper encoder-decoder (two layers each, width 64) with a short audio
window, a byte-level BPE tokenizer trained on the shipped texts (the review
set and the instruction set) and Whisper's log-mel feature extractor,
initialised from a fixed seed. Nothing is downloaded.

The window is 2 s rather than Whisper's 30 s, so that CPU runs are fast: the
feature extractor pads or cuts 16 kHz audio to 2 s (``chunk_length`` 2: 32000
samples, 200 frames of 80 mel bins at hop 160), and the encoder's two
convolutions halve that to its 100 positions (``max_source_positions``). The
decoder reads at most 64 tokens (``max_target_positions``, the tokenizer's
``model_max_length``).

Whisper's conventions, as far as the training needs them: every encoded text
is ``<|startoftranscript|> <|notimestamps|> text <|endoftext|>``, as
WhisperTokenizer writes it without a language or task; ``<|endoftext|>`` is
the eos and the pad token; ``<|startoftranscript|>`` is the bos and the
decoder's start token, which the model prepends to the labels itself (a
collator drops a leading one from the labels, as for the real Whisper). The
tokenizer is saved as a plain fast tokenizer (WhisperTokenizer would need
Whisper's vocabulary files) inside a ``WhisperProcessor`` with the feature
extractor: ``AutoProcessor``, ``AutoFeatureExtractor`` and ``AutoTokenizer``
all load from the folder.

Built, cached and published as every tiny model is
(``trainer_entry.models.tiny.TinyModel``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainer_entry.models import tiny

TINY_WHISPER_NAME = "tiny-whisper"

# The recipe. Changing any of it changes the cache key.
_RECIPE: dict[str, Any] = {
    "version": 1,
    "seed": 2468,
    "vocab_size": 1024,
    # eos and pad, bos and decoder start, and the marker of a transcript without timestamps
    "special_tokens": ["<|endoftext|>", "<|startoftranscript|>", "<|notimestamps|>"],
    "feature_extractor": {
        "feature_size": 80,
        "sampling_rate": 16000,
        "hop_length": 160,
        "chunk_length": 2,
        "n_fft": 400,
    },
    "model": {
        "d_model": 64,
        "encoder_layers": 2,
        "decoder_layers": 2,
        "encoder_attention_heads": 4,
        "decoder_attention_heads": 4,
        "encoder_ffn_dim": 128,
        "decoder_ffn_dim": 128,
        "num_mel_bins": 80,
        # 2 x 100 = 200 mel frames: the feature extractor's 2 s
        "max_source_positions": 100,
        "max_target_positions": 64,
        # Whisper's defaults name ids of its own 51865-token vocabulary
        "begin_suppress_tokens": None,
        "suppress_tokens": None,
    },
}

#: What a build must have written before it is marked finished.
BUILT_FILES = (*tiny.BUILT_FILES, "generation_config.json", "processor_config.json")


TINY_WHISPER = tiny.TinyModel(
    TINY_WHISPER_NAME, _RECIPE, tiny.SHIPPED_TEXTS, lambda folder: build(folder), BUILT_FILES
)
tiny_whisper_path, is_complete, ensure_tiny_whisper = TINY_WHISPER.functions()


def build(folder: Path) -> None:
    """Train the tokenizer, initialise the model, save both and the feature extractor to
    ``folder``."""
    from transformers import (
        WhisperConfig,
        WhisperFeatureExtractor,
        WhisperForConditionalGeneration,
        WhisperProcessor,
    )

    eot, sot, no_timestamps = _RECIPE["special_tokens"]
    tok = tiny.byte_level_bpe(
        tiny.shipped_texts(), _RECIPE["special_tokens"], _RECIPE["vocab_size"]
    )
    # Like WhisperTokenizer without a language or task: the prefix, the text, the end.
    tokenizer = tiny.fast_tokenizer(
        tok,
        (f"{sot} {no_timestamps} $A {eot}", f"{sot} {no_timestamps} $A $B {eot}"),
        _RECIPE["special_tokens"],
        _RECIPE["model"]["max_target_positions"],
        bos_token=sot,
        eos_token=eot,
        pad_token=eot,
        extra_special_tokens=[no_timestamps],
    )
    feature_extractor = WhisperFeatureExtractor(**_RECIPE["feature_extractor"])
    WhisperProcessor(feature_extractor=feature_extractor, tokenizer=tokenizer).save_pretrained(
        folder
    )
    config = WhisperConfig(
        **tiny.token_ids(tokenizer, "pad", "bos", "eos"),
        decoder_start_token_id=tokenizer.bos_token_id,
        **_RECIPE["model"],
    )
    tiny.save_model(tiny.seeded(WhisperForConditionalGeneration, config, _RECIPE["seed"]), folder)
