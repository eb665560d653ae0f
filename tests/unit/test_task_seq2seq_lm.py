"""The ``seq2seq-lm`` task: pairs, their counts, their FLOPs against PyTorch's counter.

The FLOPs of every shipped encoder-decoder architecture (``model_type`` t5 or
bart, shrunk with its structure kept) and of the tiny models are checked, full,
LoRA and under activation checkpointing, against ``FlopCounterMode`` summed over
rows of different source and target lengths (``tests/countedcheck.py``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from countedcheck import counted_over_reference, in_mode

from orchestrator.contract.trainers import task_backends
from trainer_entry.data.collate import COUNTS, PADDED_TOKENS, REAL_TOKENS, ROW_DIMS, pop_counts
from trainer_entry.data.formats import IGNORE_INDEX
from trainer_entry.models.load import ARCHITECTURES, shipped_architectures
from trainer_entry.settings.parsed import DataConfig
from trainer_entry.spec_errors import SpecError
from trainer_entry.tasks.seq2seq_lm import PairCollator, Seq2SeqLMTask, read_pairs, tokenize_pairs

#: the model types whose shipped architectures this file checks
SEQ2SEQ_TYPES = ("t5", "bart")
#: rows of clearly different source and target lengths
ROWS = [{"source": 25, "target": 10}, {"source": 40, "target": 7}, {"source": 12, "target": 20}]


def _model_type(name: str) -> str:
    return str(json.loads((ARCHITECTURES / f"{name}.json").read_text())["model_type"])


SHIPPED = [n for n in shipped_architectures() if _model_type(n) in SEQ2SEQ_TYPES]


def _shrunk(name: str):
    """A shipped architecture at a tiny size, its structure (gated FFN, tied head) kept."""
    from transformers import AutoConfig

    config = {
        k: v
        for k, v in json.loads((ARCHITECTURES / f"{name}.json").read_text()).items()
        if not k.startswith("_")
    }
    if config["model_type"] == "t5":
        config.update(d_model=64, d_ff=128, d_kv=16, num_heads=4, num_layers=2)
        config.update(num_decoder_layers=2, vocab_size=512)
    else:
        config.update(d_model=64, encoder_ffn_dim=128, decoder_ffn_dim=128, vocab_size=512)
        config.update(encoder_layers=2, decoder_layers=2)
        config.update(encoder_attention_heads=4, decoder_attention_heads=4)
    return AutoConfig.for_model(**config)


def _model(name: str, mode: str):
    from transformers import AutoModelForSeq2SeqLM

    torch.manual_seed(0)
    if name.startswith("tiny-"):
        from trainer_entry.models.kinds import TINY_MODELS

        module, _, function = TINY_MODELS[name].partition(":")
        import importlib

        folder = getattr(importlib.import_module(module), function)()
        model = AutoModelForSeq2SeqLM.from_pretrained(folder, attn_implementation="eager")
    else:
        model = AutoModelForSeq2SeqLM.from_config(_shrunk(name), attn_implementation="eager")
    return in_mode(model, Seq2SeqLMTask(), mode, "all-linear")


def test_the_shipped_encoder_decoders_are_here() -> None:
    assert {"t5-base", "t5-large", "bart-large"} <= set(SHIPPED)


@pytest.mark.parametrize(
    ("name", "mode"),
    [
        ("tiny-t5", "full"),
        ("tiny-bart", "full"),
        *((name, mode) for name in SHIPPED for mode in ("full", "lora", "checkpointed")),
    ],
)
def test_counted_flops_match_the_flop_counter(name: str, mode: str) -> None:
    """Within 10% (the fit is exact for these: a polynomial of degree two in the lengths)."""
    model = _model(name, mode)
    ratio = counted_over_reference(
        Seq2SeqLMTask(), model, ROWS, checkpointing=mode == "checkpointed"
    )
    assert ratio == pytest.approx(1.0, rel=0.10)
    assert ratio == pytest.approx(1.0, rel=1e-6)


def test_the_collator_counts_each_side_and_excludes_padding() -> None:
    collate = PairCollator(pad_token_id=0)
    features = [
        {"input_ids": [5, 6, 7, 1], "labels": [8, 1]},
        {"input_ids": [5, 1], "labels": [8, 9, 10, 1]},
    ]
    batch = collate(features)
    assert batch["input_ids"].tolist() == [[5, 6, 7, 1], [5, 1, 0, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]
    assert batch["labels"].tolist() == [
        [8, 1, IGNORE_INDEX, IGNORE_INDEX],
        [8, 9, 10, 1],
    ]
    assert batch[REAL_TOKENS] == 6 + 6 and batch[PADDED_TOKENS] == 8 + 8
    assert batch[COUNTS] == {"source_tokens": 6, "target_tokens": 6}
    assert batch[ROW_DIMS] == {"source": [4, 2], "target": [2, 4]}
    counts = pop_counts(batch)
    assert set(batch) == {"input_ids", "attention_mask", "labels"}
    assert counts.dims == {"source": [4, 2], "target": [2, 4]} and counts.lengths == [6, 6]


def _tokenizer():
    from transformers import AutoTokenizer

    from trainer_entry.models.tiny_t5 import ensure_tiny_t5

    return AutoTokenizer.from_pretrained(ensure_tiny_t5())


def test_a_users_jsonl_of_pairs_is_tokenized_and_cut(tmp_path: Path) -> None:
    path = tmp_path / "pairs.jsonl"
    long = " ".join(["word"] * 200)
    records = [
        {"document": "summarize: the cat sat", "summary": "a cat"},
        {"document": long, "summary": "long"},
        {"document": "nothing to say", "summary": ""},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    cfg = DataConfig(
        dataset=str(path), source_field="document", target_field="summary", max_seq_len=32
    )
    tokenizer = _tokenizer()
    read, source, read_cfg = read_pairs(cfg)
    pairs = tokenize_pairs(read, read_cfg, tokenizer, source)
    # the empty target's pair is dropped; the long source is cut, its </s> kept
    assert pairs.meta["examples"] == 3 and pairs.meta["examples_dropped"] == 1
    assert pairs.meta["examples_truncated"] == 1
    assert len(pairs.sources[1]) == 32 and pairs.sources[1][-1] == tokenizer.eos_token_id
    expected = tokenizer("summarize: the cat sat")["input_ids"]
    assert pairs.sources[0].tolist() == expected
    counts = pairs.meta["counts"]
    assert counts["source_tokens"] == sum(len(s) for s in pairs.sources)
    assert counts["target_tokens"] == pairs.meta["label_tokens"]
    assert pairs.meta["tokens"] == counts["source_tokens"] + counts["target_tokens"]


def test_a_missing_field_names_the_record(tmp_path: Path) -> None:
    path = tmp_path / "pairs.jsonl"
    path.write_text(json.dumps({"source": "a"}) + "\n")
    cfg = DataConfig(dataset=str(path))
    read, source, read_cfg = read_pairs(cfg)
    with pytest.raises(SpecError, match="target"):
        tokenize_pairs(read, read_cfg, _tokenizer(), source)


def test_the_shipped_instructions_are_pairs() -> None:
    read, _, cfg = read_pairs(DataConfig())
    assert (cfg.source_field, cfg.target_field) == ("source", "target")
    assert len(read) > 100 and all(r["source"] and r["target"] for r in read[:20])


def test_only_the_hf_trainer_trains_it() -> None:
    assert task_backends("seq2seq-lm") == ("hf",)
