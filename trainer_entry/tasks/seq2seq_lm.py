"""``seq2seq-lm``: an encoder-decoder (T5, BART) learns to write a target text from a source text.

**Model.** ``AutoModelForSeq2SeqLM``; under LoRA, PEFT's ``SEQ_2_SEQ_LM`` task
type. A ``config:`` model (``config:t5-large``) takes ``tiny-t5``'s tokenizer
unless the scenario names one; the decoder's start token is the model's own
(``decoder_start_token_id``), which shifts the labels right as it trains.

**Data.** The shipped instruction set when the scenario names no dataset (its
instruction and input are the source, its output the target), else a local
file or hub dataset whose records hold a ``source_field`` (default ``source``)
and a ``target_field`` (default ``target``), e.g. JSONL lines
``{"source": "summarize: …", "target": "…"}``. Each side is tokenized with the
tokenizer's special tokens (T5 appends ``</s>``) and cut to ``max_seq_len``;
a record with an empty side is dropped. Prepared data is cached under the
results folder's ``data/`` like a language model's (prefix ``s2s1-``).
``no_data_processing`` tokenizes the records as they are, with no cache.

**Counts.** A sample is a source/target pair. A token is a real token of
either side: tokens/s counts source and target tokens together, and the row
also has each apart (``source_tokens_per_second_global``,
``target_tokens_per_second_global``). Padding of either side is excluded.

**FLOPs.** Counted (``trainer_entry.measure.counted``) along ``source`` and
``target``: the encoder over the source, the decoder over the target, its
cross-attention over both; split by part (encoder, decoder, LM head).

**Not taken.** Packing (a pair is one sample; refused before launch by the
settings table), ``completion_only_loss`` (the loss is on the target), and
trainer ``sft`` (TRL trains decoder-only language models and vision-language
models).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trainer_entry.data.cache import cache_key, cached_entry
from trainer_entry.data.collate import (
    COUNTS,
    PADDED_TOKENS,
    REAL_LENGTHS,
    REAL_TOKENS,
    ROW_DIMS,
    pad_rows,
    padded_batch,
)
from trainer_entry.data.formats import IGNORE_INDEX, field
from trainer_entry.data.sources import SHIPPED_DATASET, load_records
from trainer_entry.data.tokenize import cut_texts, tokenizer_identity
from trainer_entry.settings.parsed import DataConfig, ParsedArguments
from trainer_entry.spec_errors import SpecError
from trainer_entry.tasks.task_protocol import (
    ColumnDataset,
    ReadOnce,
    TaskData,
    TaskDefaults,
    refuse_for_texts,
    with_holdout,
)

#: the cache folder's prefix; a change of the layout below changes it
CACHE_PREFIX = "s2s1-"


@dataclass
class Pairs:
    """Tokenized source/target pairs and what the preparation did."""

    sources: list[np.ndarray]
    targets: list[np.ndarray]
    meta: dict[str, Any]

    def take(self, indices: Sequence[int]) -> Pairs:
        sources = [self.sources[i] for i in indices]
        targets = [self.targets[i] for i in indices]
        meta = {**self.meta, **_counts(sources, targets)}
        return Pairs(sources, targets, meta)


def _counts(sources: Sequence[np.ndarray], targets: Sequence[np.ndarray]) -> dict[str, Any]:
    source = int(sum(len(x) for x in sources))
    target = int(sum(len(x) for x in targets))
    return {
        "sequences": len(sources),
        "tokens": source + target,
        "label_tokens": target,
        "counts": {"source_tokens": source, "target_tokens": target},
    }


def _shipped_records() -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The shipped instruction set as pairs: instruction and input in, output out."""
    records, source = load_records(DataConfig(dataset=str(SHIPPED_DATASET)))
    pairs = []
    for r in records:
        prompt = str(r.get("instruction") or "")
        if r.get("input"):
            prompt += "\n" + str(r["input"])
        pairs.append({"source": prompt, "target": str(r.get("output") or "")})
    return pairs, source


def read_pairs(cfg: DataConfig) -> tuple[list[dict[str, Any]], dict[str, Any], DataConfig]:
    """(the records, their source's identity, the config the fields are read with)."""
    if cfg.dataset is None:
        records, source = _shipped_records()
        return records, source, replace(cfg, source_field="source", target_field="target")
    records, source = load_records(cfg)
    return records, source, cfg


def tokenize_pairs(
    records: Sequence[Mapping[str, Any]], cfg: DataConfig, tokenizer: Any, source: dict[str, Any]
) -> Pairs:
    """The pairs tokenized and cut to ``max_seq_len``; pairs with a blank side dropped."""
    sources = [field(dict(r), cfg.source_field, i) for i, r in enumerate(records)]
    targets = [field(dict(r), cfg.target_field, i) for i, r in enumerate(records)]
    # a side with no text has nothing to learn (its special tokens alone are left)
    whole = [
        i for i, (s, t) in enumerate(zip(sources, targets, strict=True)) if s.strip() and t.strip()
    ]
    if not whole:
        raise SpecError("no record has both a source and a target text")
    src, src_cut = cut_texts([sources[i] for i in whole], tokenizer, cfg.max_seq_len)
    tgt, tgt_cut = cut_texts([targets[i] for i in whole], tokenizer, cfg.max_seq_len)
    kept = list(zip(src, tgt, strict=True))
    sources_kept = [s for s, _ in kept]
    targets_kept = [t for _, t in kept]
    meta = {
        "source": source,
        "examples": len(records),
        "max_seq_len": cfg.max_seq_len,
        # pairs with either side cut
        "examples_truncated": len(src_cut | tgt_cut),
        "examples_dropped": len(records) - len(kept),
        **_counts(sources_kept, targets_kept),
    }
    return Pairs(sources_kept, targets_kept, meta)


def _save(folder: Path, data: Pairs) -> None:
    np.savez(
        folder / "tokens.npz",
        sources=np.concatenate(data.sources),
        source_lengths=np.asarray([len(x) for x in data.sources], dtype=np.int64),
        targets=np.concatenate(data.targets),
        target_lengths=np.asarray([len(x) for x in data.targets], dtype=np.int64),
    )
    (folder / "meta.json").write_text(json.dumps(data.meta, indent=2, sort_keys=True) + "\n")


def _load(folder: Path) -> Pairs:
    with np.load(folder / "tokens.npz") as npz:
        sources = np.split(npz["sources"], np.cumsum(npz["source_lengths"])[:-1])
        targets = np.split(npz["targets"], np.cumsum(npz["target_lengths"])[:-1])
    meta = json.loads((folder / "meta.json").read_text())
    return Pairs(list(sources), list(targets), meta)


def prepare_pairs(
    cfg: DataConfig,
    tokenizer: Any,
    data_dir: Path,
    records: Sequence[Mapping[str, Any]],
    source: dict[str, Any],
) -> Pairs:
    """Tokenized pairs: from the cache when it has them, else made and cached."""
    key = CACHE_PREFIX + cache_key(cfg, source, tokenizer_identity(tokenizer))
    return cached_entry(
        data_dir, key, lambda: tokenize_pairs(records, cfg, tokenizer, source), _save, _load
    )


@dataclass
class PairCollator:
    """Right-pads the sources (``input_ids``, ``attention_mask``) and the targets (``labels``,
    padding ignored by the loss), and counts each side's real tokens and each row's lengths."""

    pad_token_id: int
    pad_to_multiple_of: int | None = None

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        sources = padded_batch(features, self.pad_token_id, self.pad_to_multiple_of)
        targets = [f["labels"] for f in features]
        labels = pad_rows(targets, IGNORE_INDEX, self.pad_to_multiple_of)
        src = sources[REAL_LENGTHS]
        tgt = [len(t) for t in targets]
        return {
            "input_ids": sources["input_ids"],
            "attention_mask": sources["attention_mask"],
            "labels": labels,
            REAL_TOKENS: sum(src) + sum(tgt),
            PADDED_TOKENS: sources[PADDED_TOKENS] + int(labels.numel()),
            # a row's tokens, both sides: samples are counted from these
            REAL_LENGTHS: [s + t for s, t in zip(src, tgt, strict=True)],
            COUNTS: {"source_tokens": sum(src), "target_tokens": sum(tgt)},
            ROW_DIMS: {"source": src, "target": tgt},
        }


class Seq2SeqLMTask(TaskDefaults):
    name = "seq2seq-lm"
    sample_unit = "pairs"
    modality = "text"
    auto_class = "AutoModelForSeq2SeqLM"
    tokenizer_model: str | None = "tiny-t5"
    #: False: T5's and BART's losses are the mean over the micro-batch's label tokens and
    #: ignore the item count a trainer passes
    loss_counts_items = False
    flop_dims: tuple[str, ...] = ("source", "target")

    def __init__(self) -> None:
        self._records = ReadOnce(read_pairs)

    def peft_task_type(self) -> str | None:
        return "SEQ_2_SEQ_LM"

    def prepare(
        self,
        parsed: ParsedArguments,
        processor: Any,
        data_dir: Path,
        *,
        as_given: bool,
        model_config: Any = None,
    ) -> TaskData:
        cfg = parsed.data
        refuse_for_texts(cfg, processor, self.name, "on the target")
        limit = getattr(model_config, "max_position_embeddings", None)
        if isinstance(limit, int) and cfg.max_seq_len > limit:
            # learned positions (BART's): a longer side would index past them mid-training
            raise SpecError(
                f"max_seq_len {cfg.max_seq_len} is longer than the model's {limit} positions "
                f"(max_position_embeddings); set max_seq_len to {limit} or less"
            )
        records, source, read_cfg = self._records(cfg)
        if as_given:
            data = tokenize_pairs(records, read_cfg, processor, source)
            data.meta.update(processing="none", cache_hit=None, cache_path=None)
        else:
            data = prepare_pairs(read_cfg, processor, data_dir, records, source)
        # each example is a document: the two parts are disjoint
        return with_holdout(data, len(data.sources), parsed)

    def dataset(self, data: TaskData) -> torch.utils.data.Dataset[Any]:
        return ColumnDataset(input_ids=data.examples.sources, labels=data.examples.targets)

    def collator(self, processor: Any, parsed: ParsedArguments) -> Any:
        return PairCollator(processor.pad_token_id, parsed.pad_to_multiple_of)

    def longest(self, parsed: ParsedArguments, model_config: Any) -> dict[str, int] | None:
        length = parsed.data.max_seq_len
        return {"source": length, "target": length}

    def probe_batch(self, model_config: Any, lengths: Mapping[str, int]) -> dict[str, Any]:
        meta = torch.device("meta")
        return {
            "input_ids": torch.ones((1, lengths["source"]), dtype=torch.long, device=meta),
            "labels": torch.ones((1, lengths["target"]), dtype=torch.long, device=meta),
        }
