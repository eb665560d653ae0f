"""Training data: load, format, tokenize, pack, cache; and the batch collator.

A dataset is prepared once per (data, tokenizer, formatting, max_seq_len,
packing, loss masking) and cached under ``RESULT_DIR/data/<key>/``, the key
being a hash of all of those (the data file's content, not its name), so a
second run reuses it without tokenizing again and a change of any input
prepares a new one.

Formatting:

- ``instruct`` (default): Alpaca-style prompt from ``instruction``/``input``
  fields, the ``output`` field as the response;
- ``chat``: a ``messages`` list (role/content) through the tokenizer's chat
  template (or ``chat_template``); records without one are turned into a
  user/assistant exchange from their instruction fields;
- ``text``: the ``dataset_text_field`` as it is;
- ``template``: a Jinja template rendered with ``messages=[record]``, the
  predecessor's ``data_processing.chat_template``.

Packing concatenates the tokenized examples (each ending with EOS) and cuts
the stream into blocks of exactly ``max_seq_len`` tokens: no padding, every
position a real token. Without packing, examples are truncated to
``max_seq_len`` and padded per batch. The collator reports the real (non
padding) and padded token counts of every batch, which is what throughput is
computed from.
"""

from __future__ import annotations

import csv
import fcntl
import hashlib
import itertools
import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trainer_entry.arguments import DataConfig
from trainer_entry.errors import SpecError

DATA_FORMAT_VERSION = 1
IGNORE_INDEX = -100

INSTRUCT_PROMPT = (
    "Below is an instruction that describes a task, paired with an input that provides "
    "further context. Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n"
)
INSTRUCT_PROMPT_NO_INPUT = (
    "Below is an instruction that describes a task. Write a response that appropriately "
    "completes the request.\n\n### Instruction:\n{instruction}\n\n### Response:\n"
)


@dataclass
class PreparedData:
    """Tokenized sequences with their labels, and what the preparation did."""

    input_ids: list[np.ndarray]
    labels: list[np.ndarray]
    meta: dict[str, Any]

    def lengths(self) -> list[int]:
        return [len(x) for x in self.input_ids]


# ---------------------------------------------------------------------------
# Loading records
# ---------------------------------------------------------------------------


def shipped_dataset() -> Path:
    from trainer_entry.models.tiny import DATASET

    return DATASET


def _file_records(path: Path) -> list[dict[str, Any]]:
    suffix = path.suffix.lower()
    try:
        if suffix == ".jsonl":
            records = []
            with path.open(encoding="utf-8") as f:
                for n, line in enumerate(f, 1):
                    if line.strip():
                        try:
                            records.append(json.loads(line))
                        except json.JSONDecodeError as exc:
                            raise SpecError(
                                f"dataset {path}:{n}: not valid JSON ({exc.msg})"
                            ) from None
            return records
        if suffix == ".json":
            data = json.loads(path.read_text(encoding="utf-8"))
            if isinstance(data, dict) and isinstance(data.get("data"), list):
                data = data["data"]
            if not isinstance(data, list):
                raise SpecError(f"dataset {path}: a .json dataset must be a list of records")
            return data
        if suffix == ".csv":
            with path.open(encoding="utf-8", newline="") as f:
                return list(csv.DictReader(f))
    except json.JSONDecodeError as exc:
        raise SpecError(f"dataset {path}: not valid JSON ({exc.msg}, line {exc.lineno})") from None
    except UnicodeDecodeError:
        raise SpecError(f"dataset {path}: not UTF-8 text") from None
    raise SpecError(f"dataset {path}: unsupported file type '{suffix}'; use .jsonl, .json or .csv")


def load_records(cfg: DataConfig) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The records of the dataset and an identity for the cache key."""
    name = cfg.dataset
    path = shipped_dataset() if name is None else Path(name).expanduser()
    local = name is None or path.suffix.lower() in (".jsonl", ".json", ".csv") or path.exists()
    if local:
        if not path.is_file():
            raise SpecError(f"dataset file not found: {path}")
        records = _file_records(path)
        identity = {
            "file": path.name,
            "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        }
    else:
        try:
            import datasets
        except ImportError:
            raise SpecError(
                f"dataset '{name}' is not a local file, and the datasets package is not installed"
            ) from None
        try:
            ds = datasets.load_dataset(name, split=cfg.split, **cfg.dataset_kwargs)
        except Exception as exc:  # the library raises many types; all mean "cannot load"
            offline = os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0")
            hint = " and the hub is offline (HF_HUB_OFFLINE=1)" if offline else ""
            raise SpecError(
                f"dataset '{name}' is not a local file{hint}; loading it failed: "
                f"{type(exc).__name__}: {exc}"
            ) from None
        records = [dict(r) for r in ds]
        identity = {
            "name": name,
            "split": cfg.split,
            "fingerprint": getattr(ds, "_fingerprint", None),
        }
    if not records:
        raise SpecError(f"dataset {name or path} has no records")
    if not all(isinstance(r, dict) for r in records):
        raise SpecError(f"dataset {name or path}: every record must be an object with fields")
    return records, identity


# ---------------------------------------------------------------------------
# Formatting and tokenizing one record
# ---------------------------------------------------------------------------


def _field(record: dict[str, Any], name: str, index: int) -> str:
    if name not in record:
        fields = ", ".join(sorted(map(str, record))) or "none"
        raise SpecError(f"dataset field '{name}' not found in record {index}; its fields: {fields}")
    value = record[name]
    return "" if value is None else str(value)


def _encode(tokenizer: Any, text: str, *, special: bool) -> list[int]:
    return list(tokenizer(text, add_special_tokens=special)["input_ids"])


def _chat_ids(
    tokenizer: Any, messages: list[dict[str, Any]], template: str | None, **kw: Any
) -> list[int]:
    out = tokenizer.apply_chat_template(messages, tokenize=True, chat_template=template, **kw)
    if isinstance(out, dict) or hasattr(out, "keys"):
        out = out["input_ids"]
    return list(out)


def _tokenize_record(
    record: dict[str, Any], index: int, cfg: DataConfig, tokenizer: Any, env: Any
) -> tuple[list[int], list[int]]:
    """(input_ids, labels) of one record; labels mask the prompt when asked to."""
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    if cfg.formatting == "text":
        ids = _encode(tokenizer, _field(record, cfg.text_field, index), special=True) + eos
        return ids, list(ids)

    if cfg.formatting == "instruct":
        instruction = _field(record, cfg.instruction_field, index)
        extra = str(record.get(cfg.input_field) or "")
        template = INSTRUCT_PROMPT if extra else INSTRUCT_PROMPT_NO_INPUT
        prompt = template.format(instruction=instruction, input=extra)
        response = _field(record, cfg.response_field, index)
        p = _encode(tokenizer, prompt, special=True)
        r = _encode(tokenizer, response, special=False) + eos
        labels = ([IGNORE_INDEX] * len(p) if cfg.completion_only_loss else p) + r
        return p + r, labels

    if cfg.formatting == "template":
        assert cfg.chat_template is not None
        text = env.from_string(cfg.chat_template).render(
            messages=[record],
            eos_token=tokenizer.eos_token or "",
            bos_token=tokenizer.bos_token or "",
        )
        if not cfg.completion_only_loss:
            ids = _encode(tokenizer, text, special=True)
            return ids, list(ids)
        assert cfg.response_template is not None
        cut = text.rfind(cfg.response_template)
        if cut < 0:
            raise SpecError(
                f"record {index}: the response_template {cfg.response_template!r} does not "
                "occur in the formatted text, so the prompt cannot be masked"
            )
        cut += len(cfg.response_template)
        p = _encode(tokenizer, text[:cut], special=True)
        r = _encode(tokenizer, text[cut:], special=False)
        return p + r, [IGNORE_INDEX] * len(p) + r

    # chat
    messages = record.get(cfg.messages_field)
    if messages is None:
        instruction = _field(record, cfg.instruction_field, index)
        extra = str(record.get(cfg.input_field) or "")
        messages = [
            {"role": "user", "content": instruction + (f"\n\n{extra}" if extra else "")},
            {"role": "assistant", "content": _field(record, cfg.response_field, index)},
        ]
    if not isinstance(messages, list) or not all(
        isinstance(m, dict) and "role" in m and "content" in m for m in messages
    ):
        raise SpecError(
            f"record {index}: '{cfg.messages_field}' must be a list of {{role, content}}"
        )
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


# ---------------------------------------------------------------------------
# Preparation (with the cache)
# ---------------------------------------------------------------------------


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


def cache_key(cfg: DataConfig, source: dict[str, Any], tokenizer_id: str) -> str:
    """The cache folder name: a hash of the content and of every setting that shapes it.

    A data file is identified by its content, so a renamed or moved copy finds
    the same cache entry, and an edited file does not.
    """
    settings = asdict(cfg)
    settings.pop("dataset")  # the source's identity stands for it
    identity = {k: v for k, v in source.items() if k != "file"}
    blob = json.dumps(
        {
            "version": DATA_FORMAT_VERSION,
            "source": identity,
            "settings": settings,
            "tokenizer": tokenizer_id,
        },
        sort_keys=True,
        default=str,
    )
    digest = hashlib.sha256(blob.encode()).hexdigest()[:16]
    return f"L{cfg.max_seq_len}{'-packed' if cfg.packing else ''}-{digest}"


def _validate(cfg: DataConfig, tokenizer: Any) -> None:
    """What only the tokenizer can tell (the rest is checked when the arguments are parsed)."""
    if cfg.formatting == "chat" and not (
        cfg.chat_template or getattr(tokenizer, "chat_template", None)
    ):
        raise SpecError(
            "formatting 'chat' needs a chat template: the tokenizer has none; set chat_template"
        )


def _sequences(
    tokenized: Iterable[tuple[list[int], list[int]]], cfg: DataConfig, meta: dict[str, Any]
) -> tuple[list[np.ndarray], list[np.ndarray]]:
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


def _save(folder: Path, data: PreparedData) -> None:
    lengths = np.asarray(data.lengths(), dtype=np.int64)
    np.savez(
        folder / "tokens.npz",
        input_ids=np.concatenate(data.input_ids),
        labels=np.concatenate(data.labels),
        lengths=lengths,
    )
    (folder / "meta.json").write_text(json.dumps(data.meta, indent=2, sort_keys=True) + "\n")


def _load(folder: Path) -> PreparedData:
    with np.load(folder / "tokens.npz") as npz:
        offsets = np.concatenate([[0], np.cumsum(npz["lengths"])])
        ids, labels = npz["input_ids"], npz["labels"]
        pieces = list(itertools.pairwise(offsets))
        input_ids = [ids[a:b] for a, b in pieces]
        label_list = [labels[a:b] for a, b in pieces]
    meta = json.loads((folder / "meta.json").read_text())
    return PreparedData(input_ids=input_ids, labels=label_list, meta=meta)


def prepare(cfg: DataConfig, tokenizer: Any, data_dir: Path) -> PreparedData:
    """Prepared sequences for ``cfg``: from the cache when it has them, else made and cached."""
    _validate(cfg, tokenizer)
    records, source = load_records(cfg)
    key = cache_key(cfg, source, tokenizer_identity(tokenizer))
    folder = data_dir / key
    if (folder / "meta.json").is_file():
        data = _load(folder)
        data.meta.update(cache_hit=True, cache_path=str(folder))
        return data
    data_dir.mkdir(parents=True, exist_ok=True)
    with open(data_dir / f".{key}.lock", "w") as lock:
        # Ranks of one job (and jobs sharing a results folder) prepare once.
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (folder / "meta.json").is_file():
            data = _load(folder)
            data.meta.update(cache_hit=True, cache_path=str(folder))
            return data
        data = _prepare_records(records, cfg, tokenizer, {"cache_key": key, "source": source})
        tmp = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=data_dir))
        try:
            _save(tmp, data)
            os.rename(tmp, folder)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    data.meta.update(cache_hit=False, cache_path=str(folder))
    return data


def _prepare_records(
    records: Sequence[dict[str, Any]], cfg: DataConfig, tokenizer: Any, meta: dict[str, Any]
) -> PreparedData:
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment()
    meta.update(
        examples=len(records),
        formatting=cfg.formatting,
        max_seq_len=cfg.max_seq_len,
        packing=cfg.packing,
    )
    tokenized = (_tokenize_record(r, i, cfg, tokenizer, env) for i, r in enumerate(records))
    ids, labels = _sequences(tokenized, cfg, meta)
    return PreparedData(input_ids=ids, labels=labels, meta=meta)


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

    def pairs() -> Iterable[tuple[list[int], list[int]]]:
        for i, r in enumerate(records):
            if "input_ids" in r:
                ids = [int(t) for t in r["input_ids"]]
                labels = [int(t) for t in r.get("labels", ids)]
                if len(labels) != len(ids):
                    raise SpecError(f"record {i}: labels and input_ids differ in length")
                yield ids, labels
            else:
                ids = _encode(tokenizer, _field(r, cfg.text_field, i), special=True)
                yield ids, list(ids)

    ids, labels = _sequences(pairs(), cfg, meta)
    meta.update(cache_hit=None, cache_path=None)
    return PreparedData(input_ids=ids, labels=labels, meta=meta)


# ---------------------------------------------------------------------------
# Torch side
# ---------------------------------------------------------------------------


class SequenceDataset(torch.utils.data.Dataset[dict[str, np.ndarray]]):
    def __init__(self, data: PreparedData) -> None:
        self.data = data

    def __len__(self) -> int:
        return len(self.data.input_ids)

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        return {"input_ids": self.data.input_ids[i], "labels": self.data.labels[i]}


@dataclass
class Collator:
    """Right-pads a batch and says how many of its tokens are real.

    ``num_real_tokens`` (attention-mask ones), ``num_padded_tokens`` (the
    whole rectangle) and ``real_lengths`` (each row's real length, what
    attention FLOPs are computed from) ride along as plain ints, which the
    trainer removes before the forward pass; being ints, they never touch the
    device. A packed row is one sequence of its full length: packing keeps no
    document boundaries, so its tokens attend across the whole row.
    """

    pad_token_id: int
    pad_to_multiple_of: int | None = None

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        lengths = [len(f["input_ids"]) for f in features]
        width = max(lengths)
        if self.pad_to_multiple_of:
            m = self.pad_to_multiple_of
            width = (width + m - 1) // m * m
        n = len(features)
        input_ids = torch.full((n, width), self.pad_token_id, dtype=torch.long)
        labels = torch.full((n, width), IGNORE_INDEX, dtype=torch.long)
        attention = torch.zeros((n, width), dtype=torch.long)
        for row, (f, length) in enumerate(zip(features, lengths, strict=True)):
            input_ids[row, :length] = torch.as_tensor(f["input_ids"])
            labels[row, :length] = torch.as_tensor(f["labels"])
            attention[row, :length] = 1
        return {
            "input_ids": input_ids,
            "attention_mask": attention,
            "labels": labels,
            "num_real_tokens": int(sum(lengths)),
            "num_padded_tokens": n * width,
            "real_lengths": lengths,
        }
