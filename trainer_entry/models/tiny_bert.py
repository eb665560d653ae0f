"""The embedded encoder ``tiny-bert``: built offline, deterministically, once.

The sequence-classification counterpart of ``tiny-llama`` (``trainer_entry.models.tiny``):
a byte-level BPE tokenizer trained on the shipped texts (the review set and
the instruction set) and a two-layer BERT encoder with its pooler,
initialised from a fixed seed. Nothing is downloaded. The saved model is the
encoder alone (``BertModel``); loaded as ``AutoModelForSequenceClassification``
it gains a new classifier sized to the data's classes, as a pretrained
encoder does.

BERT's conventions: every encoded text is ``[CLS] text [SEP]`` (a pair:
``[CLS] a [SEP] b [SEP]``), ``[PAD]`` is id 0, and there are ``[UNK]`` and
``[MASK]`` tokens (byte-level BPE never needs ``[UNK]``; it is there for code
that expects one).

Built, cached and published as every tiny model is
(``trainer_entry.models.tiny.TinyModel``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainer_entry import ASSETS
from trainer_entry.models import tiny

TINY_BERT_NAME = "tiny-bert"
#: the labelled review set the seq-classification task trains on by default
REVIEWS = ASSETS / "reviews.jsonl"

# The recipe. Changing any of it changes the cache key.
_RECIPE: dict[str, Any] = {
    "version": 1,
    "seed": 4321,
    "vocab_size": 1024,
    # pad first: id 0, as in BERT
    "special_tokens": ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"],
    "model": {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "max_position_embeddings": 512,
        "type_vocab_size": 2,
        "layer_norm_eps": 1e-12,
    },
}

#: What a build must have written before it is marked finished.
BUILT_FILES = tiny.BUILT_FILES


TINY_BERT = tiny.TinyModel(
    TINY_BERT_NAME, _RECIPE, tiny.SHIPPED_TEXTS, lambda folder: build(folder), BUILT_FILES
)
tiny_bert_path, is_complete, ensure_tiny_bert = TINY_BERT.functions()


def build(folder: Path) -> None:
    """Train the tokenizer, initialise the encoder, save both to ``folder``."""
    from transformers import BertConfig, BertModel

    pad, unk, cls, sep, mask = _RECIPE["special_tokens"]
    tok = tiny.byte_level_bpe(
        tiny.shipped_texts(),
        _RECIPE["special_tokens"],
        _RECIPE["vocab_size"],
        unk=unk,
        prefix_space=True,
    )
    tokenizer = tiny.fast_tokenizer(
        tok,
        (f"{cls} $A {sep}", f"{cls} $A {sep} $B:1 {sep}:1"),
        [cls, sep],
        _RECIPE["model"]["max_position_embeddings"],
        pad_token=pad,
        unk_token=unk,
        cls_token=cls,
        sep_token=sep,
        mask_token=mask,
    )
    tokenizer.save_pretrained(folder)
    config = BertConfig(**tiny.token_ids(tokenizer, "pad"), **_RECIPE["model"])
    tiny.save_model(tiny.seeded(BertModel, config, _RECIPE["seed"]), folder)
