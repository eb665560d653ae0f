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

Built into the same cache as ``tiny-llama`` (``cache_root``), under a name
carrying a hash of the recipe and of the texts, and published once however
many processes ask (``trainer_entry.buildonce``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainer_entry import ASSETS
from trainer_entry.models.tiny import (
    SHIPPED_TEXTS,
    TinyModel,
    byte_level_bpe,
    save_model,
    shipped_texts,
)

TINY_BERT_NAME = "tiny-bert"
#: the labelled review set the seq-classification task trains on by default
REVIEWS = ASSETS / "reviews.jsonl"
#: what the tokenizer is trained on (part of the cache key)
TEXTS = SHIPPED_TEXTS

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
BUILT_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


TINY_BERT = TinyModel(TINY_BERT_NAME, _RECIPE, TEXTS, lambda folder: build(folder), BUILT_FILES)
tiny_bert_path, is_complete, ensure_tiny_bert = (
    TINY_BERT.path,
    TINY_BERT.is_complete,
    TINY_BERT.ensure,
)


def build(folder: Path) -> None:
    """Train the tokenizer, initialise the encoder, save both to ``folder``."""
    import torch
    from tokenizers import processors
    from transformers import BertConfig, BertModel, PreTrainedTokenizerFast

    pad, unk, cls, sep, mask = _RECIPE["special_tokens"]
    tok = byte_level_bpe(
        shipped_texts(),
        _RECIPE["special_tokens"],
        _RECIPE["vocab_size"],
        unk=unk,
        prefix_space=True,
    )
    cls_id, sep_id = tok.token_to_id(cls), tok.token_to_id(sep)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{cls} $A {sep}",
        pair=f"{cls} $A {sep} $B:1 {sep}:1",
        special_tokens=[(cls, cls_id), (sep, sep_id)],
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=pad,
        unk_token=unk,
        cls_token=cls,
        sep_token=sep,
        mask_token=mask,
        model_max_length=_RECIPE["model"]["max_position_embeddings"],
    )
    tokenizer.save_pretrained(folder)

    config = BertConfig(
        vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, **_RECIPE["model"]
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(_RECIPE["seed"])
        model = BertModel(config)
    # save_pretrained writes the config and weights on rank 0 only under a process
    # group: whichever rank builds the model, it must come out whole
    save_model(model, folder)
