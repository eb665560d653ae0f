"""``seq-classification``: one class per text, on an encoder (or any model with a classification head).

**Model.** ``AutoModelForSequenceClassification``, with ``num_labels``,
``id2label`` and ``label2id`` read from the dataset's labels. Under LoRA,
PEFT's ``SEQ_CLS`` task type, and the new head (the model's parts outside its
backbone: ``classifier``, DistilBERT's ``pre_classifier``, a decoder's
``score``) is trained in full.

**Data.** The shipped review set (``trainer_entry/assets/reviews.jsonl``,
three classes) when the scenario names no dataset, else a local file or a hub
dataset (``trainer_entry.data.sources``). Each record's ``text_field`` (default
``text``) is tokenized with the tokenizer's special tokens (``[CLS] … [SEP]``
for BERT) and truncated to ``max_seq_len`` by the tokenizer, which keeps those
tokens; ``label_field`` (default ``label``) is its class. Labels:

- integers (or strings of digits, as a CSV file gives them) are class ids as
  they are: ``num_labels`` is the largest plus one, and class ``i`` is named
  ``"i"``;
- other strings are class names: sorted, and numbered from 0 in that order
  (``negative``, ``mixed``, ``positive`` → 1, 0, 2);
- a mix of the two, another type, a missing label, a negative id or fewer
  than two classes is an error naming the record.

Prepared data is cached under the results folder's ``data/`` like a language
model's (``trainer_entry.data.cache``: the same key inputs, its own folder
prefix ``cls1-`` and file layout, published once). ``no_data_processing``
takes records as they are: their ``input_ids`` when they have them (else the
text tokenized), cut to ``max_seq_len``, with their label; no cache.

**Counts.** A sample is a sequence: samples/s counts them, tokens/s their
real tokens. The data record's ``label_tokens`` is the number of labelled
samples (one label per sequence), ``sequences`` the same number.

**FLOPs.** See ``per_sample_modules``: a pooled head runs once per sequence.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trainer_entry.data.cache import cache_key, cached_entry
from trainer_entry.data.collate import padded_batch
from trainer_entry.data.formats import field
from trainer_entry.data.sources import load_records
from trainer_entry.data.tokenize import cut_texts, tokenizer_identity
from trainer_entry.models.tiny_bert import REVIEWS
from trainer_entry.settings.parsed import DataConfig, ParsedArguments
from trainer_entry.spec_errors import SpecError
from trainer_entry.tasks.task_protocol import (
    ColumnDataset,
    ReadOnce,
    TaskData,
    TaskDefaults,
    refuse_for_texts,
    with_split_sequences,
)

#: the cache folder's prefix; a change of the layout below changes it
CACHE_PREFIX = "cls1-"
_DIGITS = re.compile(r"[0-9]+")


@dataclass
class ClassifiedTexts:
    """Tokenized sequences, one class id each, and what the preparation did."""

    input_ids: list[np.ndarray]
    labels: np.ndarray
    meta: dict[str, Any]

    def lengths(self) -> list[int]:
        return [len(x) for x in self.input_ids]


def data_config(cfg: DataConfig) -> DataConfig:
    """``cfg`` with the shipped review set standing in for no dataset."""
    return cfg if cfg.dataset is not None else replace(cfg, dataset=str(REVIEWS))


def classes(records: Sequence[dict[str, Any]], label_field: str) -> tuple[list[int], list[str]]:
    """(each record's class id, the class names in id order) from the records' labels."""
    values: list[Any] = []
    for i, record in enumerate(records):
        if label_field not in record or record[label_field] is None:
            fields = ", ".join(sorted(map(str, record))) or "none"
            raise SpecError(
                f"record {i} has no label field '{label_field}' (set label_field); "
                f"its fields: {fields}"
            )
        values.append(record[label_field])
    for i, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, int | str):
            raise SpecError(
                f"record {i}: label {v!r} is a {type(v).__name__}; a label is a class id "
                "(an integer ≥ 0) or a class name (a string)"
            )
        if isinstance(v, int) and v < 0:
            raise SpecError(f"record {i}: label {v} is negative; class ids start at 0")
    # a class id: an integer, or a string of digits (a CSV file's integers)
    numeric = [isinstance(v, int) or bool(_DIGITS.fullmatch(v.strip())) for v in values]
    if all(numeric):
        ids = [int(v) for v in values]
        names = [str(i) for i in range(max(ids) + 1)]
    elif any(numeric):
        first = numeric.index(True)
        other = numeric.index(False)
        raise SpecError(
            f"labels mix class ids and class names (record {first}: {values[first]!r}, "
            f"record {other}: {values[other]!r}); use one or the other"
        )
    else:
        names = sorted(set(values))
        index = {name: i for i, name in enumerate(names)}
        ids = [index[v] for v in values]
    if len(names) < 2:
        raise SpecError(
            f"the labels name {len(names)} class ({', '.join(map(repr, names))}); "
            "classification needs at least 2"
        )
    return ids, names


def tokenize_texts(
    records: Sequence[dict[str, Any]], cfg: DataConfig, tokenizer: Any
) -> tuple[list[np.ndarray], int]:
    """(sequences, how many were cut): each record's text with special tokens,
    cut to ``max_seq_len`` by the tokenizer (which keeps its special tokens)."""
    texts = [field(r, cfg.text_field, i) for i, r in enumerate(records)]
    special = tokenizer.num_special_tokens_to_add()
    if cfg.max_seq_len <= special:
        raise SpecError(
            f"max_seq_len {cfg.max_seq_len} leaves no room for text: the tokenizer adds "
            f"{special} special tokens to every sequence"
        )
    ids, cut = cut_texts(texts, tokenizer, cfg.max_seq_len)
    return ids, len(cut)


def _finish(
    ids: list[np.ndarray], labels: list[int], meta: dict[str, Any], truncated: int
) -> ClassifiedTexts:
    """Drop empty sequences (nothing to feed) and fill in the counts."""
    kept = [(x, y) for x, y in zip(ids, labels, strict=True) if len(x) > 0]
    if not kept:
        raise SpecError("no record has any token to classify")
    meta.update(
        examples_truncated=truncated,
        examples_dropped=len(ids) - len(kept),
        sequences=len(kept),
        tokens=int(sum(len(x) for x, _ in kept)),
        # one label per sequence: the labelled samples
        label_tokens=len(kept),
    )
    return ClassifiedTexts(
        input_ids=[x for x, _ in kept],
        labels=np.asarray([y for _, y in kept], dtype=np.int64),
        meta=meta,
    )


def _save(folder: Path, data: ClassifiedTexts) -> None:
    """``tokens.npz`` (the sequences end to end, their lengths, their class ids), ``meta.json`` last."""
    np.savez(
        folder / "tokens.npz",
        input_ids=np.concatenate(data.input_ids),
        lengths=np.asarray(data.lengths(), dtype=np.int64),
        labels=data.labels,
    )
    (folder / "meta.json").write_text(json.dumps(data.meta, indent=2, sort_keys=True) + "\n")


def _load(folder: Path) -> ClassifiedTexts:
    with np.load(folder / "tokens.npz") as npz:
        ends = np.cumsum(npz["lengths"])
        ids = np.split(npz["input_ids"], ends[:-1])
        labels = npz["labels"]
    meta = json.loads((folder / "meta.json").read_text())
    return ClassifiedTexts(input_ids=list(ids), labels=labels, meta=meta)


def _labels(records: Sequence[dict[str, Any]], cfg: DataConfig, labelled: bool) -> list[int]:
    """Each record's class id; all 0 for texts without classes (``masked-lm``'s)."""
    return classes(records, cfg.label_field)[0] if labelled else [0] * len(records)


def prepare_texts(
    cfg: DataConfig,
    tokenizer: Any,
    data_dir: Path,
    records: Sequence[dict[str, Any]],
    source: dict[str, Any],
    *,
    prefix: str = CACHE_PREFIX,
    labelled: bool = True,
) -> ClassifiedTexts:
    """Tokenized, labelled sequences: from the cache when it has them, else made and cached.

    ``labelled``: False for texts without classes (every label 0); ``prefix``: the
    cache folder's (a task of its own keeps its own entries)."""
    key = prefix + cache_key(cfg, source, tokenizer_identity(tokenizer))

    def make() -> ClassifiedTexts:
        meta: dict[str, Any] = {
            "source": source,
            "examples": len(records),
            "max_seq_len": cfg.max_seq_len,
        }
        labels = _labels(records, cfg, labelled)
        ids, truncated = tokenize_texts(records, cfg, tokenizer)
        return _finish(ids, labels, meta, truncated)

    return cached_entry(data_dir, key, make, _save, _load)


def texts_as_given(
    cfg: DataConfig,
    tokenizer: Any,
    records: Sequence[dict[str, Any]],
    source: dict[str, Any],
    *,
    labelled: bool = True,
) -> ClassifiedTexts:
    """``no_data_processing``: each record's ``input_ids`` (else its text tokenized), cut to
    ``max_seq_len``, with its label (0 where not ``labelled``); no cache."""
    labels = _labels(records, cfg, labelled)
    meta: dict[str, Any] = {
        "source": source,
        "examples": len(records),
        "processing": "none",
        "max_seq_len": cfg.max_seq_len,
    }
    ids: list[np.ndarray] = []
    truncated = 0
    for i, record in enumerate(records):
        if "input_ids" in record:
            seq = [int(t) for t in record["input_ids"]]
        else:
            seq = list(tokenizer(field(record, cfg.text_field, i))["input_ids"])
        if len(seq) > cfg.max_seq_len:
            truncated += 1
            seq = seq[: cfg.max_seq_len]
        ids.append(np.asarray(seq, dtype=np.int64))
    data = _finish(ids, labels, meta, truncated)
    data.meta.update(cache_hit=None, cache_path=None)
    return data


def check_positions(data: ClassifiedTexts, model_config: Any, what: str) -> None:
    """``SpecError`` where ``what`` (``a text``) of ``data`` is longer than the model's
    positions (``max_position_embeddings``)."""
    limit = getattr(model_config, "max_position_embeddings", None)
    longest = max(data.lengths())
    if isinstance(limit, int) and longest > limit:
        raise SpecError(
            f"{what} is {longest} tokens long but the model has {limit} positions "
            f"(max_position_embeddings); set max_seq_len to {limit} or less"
        )


@dataclass
class ClassificationCollator:
    """Right-pads a batch of sequences; ``labels`` is one class id per row.

    Adds the counts ``trainer_entry.data.collate.pop_counts`` takes out: real
    tokens, the padded rectangle (after ``pad_to_multiple_of``), each row's
    real length (samples and attention FLOPs come from them).
    """

    pad_token_id: int
    pad_to_multiple_of: int | None = None

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        batch = padded_batch(features, self.pad_token_id, self.pad_to_multiple_of)
        labels = torch.as_tensor([int(f["labels"]) for f in features], dtype=torch.long)
        return {**batch, "labels": labels}


def _transformers_model(model: Any) -> Any:
    """The transformers model inside a PEFT wrapper (the model itself otherwise)."""
    inner = getattr(model, "get_base_model", None)
    return inner() if callable(inner) else model


def _backbone(model: Any) -> Any:
    """The model's backbone (``BertModel`` in ``BertForSequenceClassification``); None if none."""
    backbone = getattr(model, "base_model", None)
    return backbone if isinstance(backbone, torch.nn.Module) and backbone is not model else None


class SeqClassificationTask(TaskDefaults):
    name = "seq-classification"
    sample_unit = "sequences"
    modality = "text"
    auto_class = "AutoModelForSequenceClassification"
    #: False: the models' losses are the mean over a micro-batch's samples and ignore
    #: the item count a trainer passes for token-level losses (BERT's and RoBERTa's
    #: heads accept ``num_items_in_batch`` and drop it), so a trainer must divide
    #: the loss by the accumulation steps and not scale it by the processes itself;
    #: without that the loss and the gradients come out that many times too large
    tokenizer_model: str | None = "tiny-bert"
    loss_counts_items = False

    def __init__(self) -> None:
        # the records read for model_kwargs, reused by prepare (one read per run)
        self._records = ReadOnce(load_records)

    def _read(self, cfg: DataConfig) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        return self._records(data_config(cfg))

    def model_kwargs(self, parsed: ParsedArguments) -> dict[str, Any]:
        """``num_labels``, ``id2label`` and ``label2id`` from the dataset's labels."""
        records, _ = self._read(parsed.data)
        _, names = classes(records, parsed.data.label_field)
        return {
            "num_labels": len(names),
            "id2label": dict(enumerate(names)),
            "label2id": {name: i for i, name in enumerate(names)},
            # never regression (one label) or multi-label (float labels): one class per text
            "problem_type": "single_label_classification",
        }

    def peft_task_type(self) -> str | None:
        return "SEQ_CLS"

    def head_modules(self, model: Any) -> list[str]:
        """The parts of the model outside its backbone that hold weights: the new head."""
        inner = _transformers_model(model)
        backbone = _backbone(inner)
        if backbone is None:
            return []
        return [
            name
            for name, child in inner.named_children()
            if child is not backbone and any(True for _ in child.parameters())
        ]

    def prepare(
        self,
        parsed: ParsedArguments,
        processor: Any,
        data_dir: Path,
        *,
        as_given: bool,
        model_config: Any = None,
    ) -> TaskData:
        cfg = data_config(parsed.data)
        if cfg.packing:
            raise SpecError("packing does not apply to seq-classification: one text is one sample")
        refuse_for_texts(cfg, processor, self.name, "the class")
        records, source = self._read(cfg)
        data = (
            texts_as_given(cfg, processor, records, source)
            if as_given
            else prepare_texts(cfg, processor, data_dir, records, source)
        )
        check_positions(data, model_config, "a sequence")
        return with_split_sequences(data, parsed)  # one text is one document

    def dataset(self, data: TaskData) -> torch.utils.data.Dataset[Any]:
        texts: ClassifiedTexts = data.examples
        return ColumnDataset(input_ids=texts.input_ids, labels=texts.labels.tolist())

    def collator(self, processor: Any, parsed: ParsedArguments) -> Any:
        return ClassificationCollator(processor.pad_token_id, parsed.pad_to_multiple_of)

    def per_sample_modules(self, model: Any) -> set[int]:
        """ids of the modules that run once per sequence: the pooled head.

        The rule, by the model's structure: a model whose backbone attends
        bidirectionally (no attention module with ``is_causal`` set) pools
        its sequence into one vector (the first token, or a mean) before the
        head, so every part outside the backbone (BERT's ``classifier``,
        RoBERTa's ``classifier`` head of ``dense`` and ``out_proj``,
        DistilBERT's ``pre_classifier`` and ``classifier``, DeBERTa's
        ``pooler``) and the backbone's own ``pooler`` (BERT's) run once per
        sample. A causal backbone cannot pool from its first token, which has
        seen nothing: its head (``score``) runs on every position and the
        model then picks each row's last real one, so nothing is per sample.
        An encoder-decoder with a causal decoder (BART) is counted that way
        too, which overstates its small head.
        """
        inner = _transformers_model(model)
        backbone = _backbone(inner)
        if backbone is None:
            return set()
        if any(getattr(m, "is_causal", False) is True for m in backbone.modules()):
            return set()
        heads = [child for child in inner.children() if child is not backbone]
        pooler = getattr(backbone, "pooler", None)
        if isinstance(pooler, torch.nn.Module):
            heads.append(pooler)
        return {id(m) for m in heads}

    def probe_batch(self, model_config: Any, lengths: Mapping[str, int]) -> dict[str, Any]:
        ids = torch.ones((1, lengths["tokens"]), dtype=torch.long, device="meta")
        return {"input_ids": ids, "labels": torch.zeros((1,), dtype=torch.long, device="meta")}
