"""The embedded encoder-decoder ``tiny-t5``: built offline, deterministically, once.

The sequence-to-sequence counterpart of ``tiny-llama`` (``trainer_entry.models.tiny``):
a subword tokenizer trained on the shipped texts (the review set and the
instruction set) and a two-layer T5 (two encoder blocks, two decoder blocks,
ReLU feed-forward as in the original T5, relative position buckets),
initialised from a fixed seed. Nothing is downloaded. The saved model is the
whole ``T5ForConditionalGeneration``: loaded as ``AutoModelForSeq2SeqLM`` it
has its language-model head, which, as in T5 v1.0, is the shared input
embedding (tied, stored once).

T5's conventions: ``<pad>`` is id 0, ``</s>`` id 1, ``<unk>`` id 2; every
encoded text ends in ``</s>`` (a pair: ``a </s> b </s>``) and there is no
beginning-of-sequence token; the decoder starts from ``<pad>``, so
``decoder_start_token_id`` is 0. Words are split SentencePiece-style, a
``▁`` marking the start of a word, and a run of characters the texts never
had is one ``<unk>``. The vocabulary is learned by BPE rather than T5's
unigram model: the ``tokenizers`` unigram trainer splits its sums by the
number of threads, so its scores could differ in their last bits from one
machine to another, where BPE's merges (counts, not sums of floats) do not.
There are no ``<extra_id_*>`` sentinels (span corruption is not a task here).

Built, cached and published as every tiny model is
(``trainer_entry.models.tiny.TinyModel``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainer_entry.models import tiny

TINY_T5_NAME = "tiny-t5"

# The recipe. Changing any of it changes the cache key.
_RECIPE: dict[str, Any] = {
    "version": 1,
    "seed": 5678,
    "vocab_size": 1024,
    # in T5's order: pad 0, eos 1, unk 2
    "special_tokens": ["<pad>", "</s>", "<unk>"],
    # T5's tokenizers say 512; the model itself has relative positions and no limit
    "model_max_length": 512,
    "model": {
        "d_model": 64,
        "d_ff": 128,
        "d_kv": 16,
        "num_heads": 4,
        "num_layers": 2,
        "num_decoder_layers": 2,
        "feed_forward_proj": "relu",
        "relative_attention_num_buckets": 32,
        "relative_attention_max_distance": 128,
        "layer_norm_epsilon": 1e-6,
    },
}

#: What a build must have written before it is marked finished.
BUILT_FILES = (*tiny.BUILT_FILES, "generation_config.json")


TINY_T5 = tiny.TinyModel(
    TINY_T5_NAME, _RECIPE, tiny.SHIPPED_TEXTS, lambda folder: build(folder), BUILT_FILES
)
tiny_t5_path, is_complete, ensure_tiny_t5 = TINY_T5.functions()


def build(folder: Path) -> None:
    """Train the tokenizer, initialise the model, save both to ``folder``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import T5Config, T5ForConditionalGeneration

    pad, eos, unk = _RECIPE["special_tokens"]
    # a run of characters the texts never had is one <unk>, as in SentencePiece
    tok = Tokenizer(models.BPE(unk_token=unk, fuse_unk=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    trainer = trainers.BpeTrainer(
        vocab_size=_RECIPE["vocab_size"],
        min_frequency=2,
        special_tokens=_RECIPE["special_tokens"],
        show_progress=False,
    )
    tok.train_from_iterator(tiny.shipped_texts(), trainer=trainer)
    # Like T5's tokenizer: an EOS after every encoded text, no BOS (and no token
    # types: T5 has none).
    tokenizer = tiny.fast_tokenizer(
        tok,
        (f"$A {eos}", f"$A {eos} $B {eos}"),
        [eos],
        _RECIPE["model_max_length"],
        pad_token=pad,
        eos_token=eos,
        unk_token=unk,
    )
    tokenizer.save_pretrained(folder)
    # tie_word_embeddings left to T5Config: tied, with the decoder's output
    # scaled by d_model ** -0.5 before the head, as in T5 v1.0
    config = T5Config(
        **tiny.token_ids(tokenizer, "pad", "eos"),
        decoder_start_token_id=tokenizer.pad_token_id,
        **_RECIPE["model"],
    )
    tiny.save_model(tiny.seeded(T5ForConditionalGeneration, config, _RECIPE["seed"]), folder)
