"""The two ways a run gets its training sequences: prepared (and cached), or as given.

``prepare`` loads the records (``load``), formats and tokenizes them
(``formats``, ``tokenize``) and caches the result (``cache``);
``load_unprocessed`` takes a file as it is. The trainer then batches them
with ``collate``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainer_entry.data.cache import cache_key, cached
from trainer_entry.data.formats import check_tokenizer
from trainer_entry.data.sources import load_records
from trainer_entry.data.tokenize import (
    PreparedData,
    as_given,
    sequences,
    tokenize_records,
    tokenizer_identity,
)
from trainer_entry.settings.parsed import DataConfig
from trainer_entry.spec_errors import SpecError


def prepare(cfg: DataConfig, tokenizer: Any, data_dir: Path) -> PreparedData:
    """Prepared sequences for ``cfg``: from the cache when it has them, else made and cached."""
    check_tokenizer(cfg, tokenizer)
    records, source = load_records(cfg)
    key = cache_key(cfg, source, tokenizer_identity(tokenizer))
    return cached(
        data_dir,
        key,
        lambda: tokenize_records(records, cfg, tokenizer, {"cache_key": key, "source": source}),
    )


def load_unprocessed(cfg: DataConfig, tokenizer: Any) -> PreparedData:
    """``NO_DATA_PROCESSING``: the file as it is, no template and no cache.

    Records with ``input_ids`` (and optionally ``labels``) are used as given;
    otherwise the ``dataset_text_field`` is tokenized as plain text. Sequences
    are still cut to ``max_seq_len`` (and packed when asked), since a longer
    sequence than the model is benchmarked at would change the benchmark.
    """
    if cfg.max_seq_len <= 0:
        raise SpecError(f"max_seq_len must be a positive integer, got {cfg.max_seq_len}")
    records, source = load_records(cfg)
    meta: dict[str, Any] = {"source": source, "examples": len(records), "processing": "none"}
    ids, labels = sequences(as_given(records, cfg, tokenizer), cfg, meta)
    meta.update(cache_hit=None, cache_path=None)
    return PreparedData(input_ids=ids, labels=labels, meta=meta)
