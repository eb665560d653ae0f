"""The embedded encoder-decoder ``tiny-bart``: built offline, deterministically, once.

The second sequence-to-sequence model beside ``tiny-t5`` (``trainer_entry.models.tiny_t5``):
a byte-level BPE tokenizer trained on the shipped texts (the review set and
the instruction set) and a two-layer BART (two encoder layers, two decoder
layers, GELU, learned positions), initialised from a fixed seed. Nothing is
downloaded. The saved model is the whole ``BartForConditionalGeneration``:
loaded as ``AutoModelForSeq2SeqLM`` it has its language-model head, tied to
the shared embedding (stored once) as in BART.

BART's conventions: ``<s>`` is id 0, ``<pad>`` 1, ``</s>`` 2, ``<unk>`` 3,
``<mask>`` 4; every encoded text is ``<s> text </s>`` (a pair:
``<s> a </s> </s> b </s>``); the decoder starts from ``</s>``
(``decoder_start_token_id`` 2) and generation is made to end in ``</s>``
(``forced_eos_token_id`` 2). As in BART the byte-level pre-tokenizer adds no
space before the first word, and byte-level BPE never needs ``<unk>``: it is
there for code that expects one.

Built, cached and published as every tiny model is
(``trainer_entry.models.tiny.TinyModel``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainer_entry.models import tiny

TINY_BART_NAME = "tiny-bart"

# The recipe. Changing any of it changes the cache key.
_RECIPE: dict[str, Any] = {
    "version": 1,
    "seed": 8765,
    "vocab_size": 1024,
    # in BART's order: bos 0, pad 1, eos 2, unk 3, mask 4
    "special_tokens": ["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
    "model": {
        "d_model": 64,
        "encoder_layers": 2,
        "decoder_layers": 2,
        "encoder_attention_heads": 4,
        "decoder_attention_heads": 4,
        "encoder_ffn_dim": 128,
        "decoder_ffn_dim": 128,
        "max_position_embeddings": 512,
        "activation_function": "gelu",
    },
}

#: What a build must have written before it is marked finished.
BUILT_FILES = (*tiny.BUILT_FILES, "generation_config.json")


TINY_BART = tiny.TinyModel(
    TINY_BART_NAME, _RECIPE, tiny.SHIPPED_TEXTS, lambda folder: build(folder), BUILT_FILES
)
tiny_bart_path, is_complete, ensure_tiny_bart = TINY_BART.functions()


def build(folder: Path) -> None:
    """Train the tokenizer, initialise the model, save both to ``folder``."""
    from transformers import BartConfig, BartForConditionalGeneration

    bos, pad, eos, unk, mask = _RECIPE["special_tokens"]
    tok = tiny.byte_level_bpe(
        tiny.shipped_texts(), _RECIPE["special_tokens"], _RECIPE["vocab_size"], unk=unk
    )
    # Like BART's tokenizer (RoBERTa's): <s> text </s>, a pair <s> a </s> </s> b </s>.
    tokenizer = tiny.fast_tokenizer(
        tok,
        (f"{bos} $A {eos}", f"{bos} $A {eos} {eos} $B {eos}"),
        [bos, eos],
        _RECIPE["model"]["max_position_embeddings"],
        bos_token=bos,
        pad_token=pad,
        eos_token=eos,
        unk_token=unk,
        mask_token=mask,
    )
    tokenizer.save_pretrained(folder)
    eos_id = tokenizer.eos_token_id
    config = BartConfig(
        **tiny.token_ids(tokenizer, "pad", "bos", "eos"),
        decoder_start_token_id=eos_id,
        forced_eos_token_id=eos_id,
        **_RECIPE["model"],
    )
    tiny.save_model(tiny.seeded(BartForConditionalGeneration, config, _RECIPE["seed"]), folder)
