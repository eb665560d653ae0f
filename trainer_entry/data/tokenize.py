"""Records to training sequences: tokenize, mask the prompt, truncate or pack.

Packing concatenates the tokenized examples (each ending with EOS) and cuts
the stream into blocks of exactly ``max_seq_len`` tokens: no padding, every
position a real token. Without packing, examples are truncated to
``max_seq_len`` (and padded per batch by the collator); an example left with
no token to learn from is dropped. ``DataConfig.truncate`` False leaves them
whole, for a trainer that truncates and packs itself (TRL's, the ``sft`` backend).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from trainer_entry.data.formats import (
    IGNORE_INDEX,
    chat_messages,
    field,
    instruct_parts,
    render_template,
    split_at_response,
)
from trainer_entry.settings.parsed import DataConfig
from trainer_entry.spec_errors import SpecError


@dataclass
class PreparedData:
    """Tokenized sequences with their labels, and what the preparation did."""

    input_ids: list[np.ndarray]
    labels: list[np.ndarray]
    meta: dict[str, Any]

    def lengths(self) -> list[int]:
        return [len(x) for x in self.input_ids]


def encode(tokenizer: Any, text: str, *, special: bool) -> list[int]:
    return list(tokenizer(text, add_special_tokens=special)["input_ids"])


def _chat_ids(
    tokenizer: Any, messages: list[dict[str, Any]], template: str | None, **kw: Any
) -> list[int]:
    out = tokenizer.apply_chat_template(messages, tokenize=True, chat_template=template, **kw)
    if isinstance(out, dict) or hasattr(out, "keys"):
        out = out["input_ids"]
    return list(out)


def tokenize_record(
    record: dict[str, Any], index: int, cfg: DataConfig, tokenizer: Any, env: Any
) -> tuple[list[int], list[int]]:
    """(input_ids, labels) of one record; labels mask the prompt when asked to."""
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    if cfg.formatting == "text":
        ids = encode(tokenizer, field(record, cfg.text_field, index), special=True) + eos
        return ids, list(ids)

    if cfg.formatting == "instruct":
        prompt, response = instruct_parts(record, index, cfg)
        p = encode(tokenizer, prompt, special=True)
        r = encode(tokenizer, response, special=False) + eos
        labels = ([IGNORE_INDEX] * len(p) if cfg.completion_only_loss else p) + r
        return p + r, labels

    if cfg.formatting == "template":
        text = render_template(record, cfg, tokenizer, env)
        if not cfg.completion_only_loss:
            ids = encode(tokenizer, text, special=True)
            return ids, list(ids)
        prompt, response = split_at_response(text, index, cfg)
        p = encode(tokenizer, prompt, special=True)
        r = encode(tokenizer, response, special=False)
        return p + r, [IGNORE_INDEX] * len(p) + r

    # chat
    messages = chat_messages(record, index, cfg)
    ids = _chat_ids(tokenizer, messages, cfg.chat_template)
    if not cfg.completion_only_loss:
        return ids, list(ids)
    labels = [IGNORE_INDEX] * len(ids)
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        start = len(
            _chat_ids(tokenizer, messages[:i], cfg.chat_template, add_generation_prompt=True)
        )
        end = len(_chat_ids(tokenizer, messages[: i + 1], cfg.chat_template))
        labels[start:end] = ids[start:end]
    return ids, labels


def cut_texts(
    texts: Sequence[str], tokenizer: Any, limit: int
) -> tuple[list[np.ndarray], set[int]]:
    """(each text's ids with the tokenizer's special tokens, cut to ``limit`` by the
    tokenizer, which keeps them; the indices of the texts that were cut). Every text is
    tokenized once; only those found too long are tokenized again, cut."""
    encoded = [list(x) for x in tokenizer(list(texts), add_special_tokens=True)["input_ids"]]
    long = [i for i, ids in enumerate(encoded) if len(ids) > limit]
    if long:
        cut = tokenizer(
            [texts[i] for i in long], add_special_tokens=True, truncation=True, max_length=limit
        )["input_ids"]
        for i, ids in zip(long, cut, strict=True):
            encoded[i] = list(ids)
    return [np.asarray(ids, dtype=np.int64) for ids in encoded], set(long)


def tokenizer_identity(tokenizer: Any) -> str:
    """A hash of everything about a tokenizer that changes its output."""
    h = hashlib.sha256()
    backend = getattr(tokenizer, "backend_tokenizer", None)
    h.update(
        backend.to_str().encode() if backend is not None else repr(tokenizer.get_vocab()).encode()
    )
    for name in ("bos_token", "eos_token", "pad_token", "chat_template"):
        h.update(repr(getattr(tokenizer, name, None)).encode())
    return h.hexdigest()


def sequences(
    tokenized: Iterable[tuple[Sequence[int] | np.ndarray, Sequence[int] | np.ndarray]],
    cfg: DataConfig,
    meta: dict[str, Any],
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Truncated (or packed) sequences and their labels; what was cut goes into ``meta``."""
    ids_out: list[np.ndarray] = []
    labels_out: list[np.ndarray] = []
    if cfg.packing:
        flat_ids: list[int] = []
        flat_labels: list[int] = []
        for ids, labels in tokenized:
            flat_ids.extend(ids)
            flat_labels.extend(labels)
        n_blocks = len(flat_ids) // cfg.max_seq_len
        if n_blocks == 0:
            raise SpecError(
                f"the dataset has {len(flat_ids)} tokens, fewer than one packed block of "
                f"max_seq_len {cfg.max_seq_len}"
            )
        ids_arr = np.asarray(flat_ids[: n_blocks * cfg.max_seq_len], dtype=np.int64)
        labels_arr = np.asarray(flat_labels[: n_blocks * cfg.max_seq_len], dtype=np.int64)
        ids_out = list(ids_arr.reshape(n_blocks, cfg.max_seq_len))
        labels_out = list(labels_arr.reshape(n_blocks, cfg.max_seq_len))
        meta["tokens_dropped"] = len(flat_ids) - n_blocks * cfg.max_seq_len
    elif not cfg.truncate:  # left whole: the trainer truncates, drops and packs (sft)
        for ids, labels in tokenized:
            ids_out.append(np.asarray(ids, dtype=np.int64))
            labels_out.append(np.asarray(labels, dtype=np.int64))
        if not ids_out:
            raise SpecError("the dataset has no example")
    else:
        truncated = dropped = 0
        for ids, labels in tokenized:
            if len(ids) > cfg.max_seq_len:
                truncated += 1
                ids, labels = ids[: cfg.max_seq_len], labels[: cfg.max_seq_len]
            if all(label == IGNORE_INDEX for label in labels):
                dropped += 1  # nothing to learn from: the prompt filled max_seq_len
                continue
            ids_out.append(np.asarray(ids, dtype=np.int64))
            labels_out.append(np.asarray(labels, dtype=np.int64))
        meta["examples_truncated"] = truncated
        meta["examples_dropped"] = dropped
        if not ids_out:
            raise SpecError(f"no example is left after truncating to max_seq_len {cfg.max_seq_len}")
    meta["sequences"] = len(ids_out)
    meta["tokens"] = int(sum(len(x) for x in ids_out))
    meta["label_tokens"] = int(sum(int((x != IGNORE_INDEX).sum()) for x in labels_out))
    return ids_out, labels_out


def tokenize_records(
    records: Sequence[dict[str, Any]], cfg: DataConfig, tokenizer: Any, meta: dict[str, Any]
) -> PreparedData:
    """The training sequences of ``records`` in ``cfg``'s formatting."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment()
    meta.update(
        examples=len(records),
        formatting=cfg.formatting,
        max_seq_len=cfg.max_seq_len,
        packing=cfg.packing,
    )
    tokenized = (tokenize_record(r, i, cfg, tokenizer, env) for i, r in enumerate(records))
    ids, labels = sequences(tokenized, cfg, meta)
    return PreparedData(input_ids=ids, labels=labels, meta=meta)


def as_given(
    records: Sequence[dict[str, Any]], cfg: DataConfig, tokenizer: Any
) -> Iterator[tuple[list[int], list[int]]]:
    """(input_ids, labels) of records taken as they are: their ``input_ids`` (and
    ``labels``), else their ``dataset_text_field`` tokenized as plain text."""
    for i, r in enumerate(records):
        if "input_ids" in r:
            ids = [int(t) for t in r["input_ids"]]
            labels = [int(t) for t in r.get("labels", ids)]
            if len(labels) != len(ids):
                raise SpecError(f"record {i}: labels and input_ids differ in length")
            yield ids, labels
        else:
            ids = encode(tokenizer, field(r, cfg.text_field, i), special=True)
            yield ids, list(ids)
