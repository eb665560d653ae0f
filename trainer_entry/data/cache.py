"""The cache of prepared datasets: one folder per key under the results folder's ``data/``.

A dataset is prepared once per (data, tokenizer, formatting, max_seq_len,
packing, loss masking) and cached under ``RESULT_DIR/data/<key>/``, the key
being a hash of all of those (the data file's content, not its name), so a
second run reuses it without tokenizing again and a change of any input
prepares a new one.

The ranks of a job and the jobs sharing a results folder may all ask for one
key at once: the folder is built once and published whole
(``trainer_entry.buildonce``). ``meta.json`` is written last, so a folder with
it is finished.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any, Protocol, TypeVar

import numpy as np

from trainer_entry.buildonce import build_once
from trainer_entry.data.tokenize import PreparedData
from trainer_entry.settings.parsed import DataConfig

DATA_FORMAT_VERSION = 1
#: what a cache folder holds; the second is written last
CACHE_FILES = ("tokens.npz", "meta.json")


#: data settings added after the key's layout, and their defaults
_LATER_DEFAULTS = {
    name: getattr(DataConfig, name)
    for name in ("source_field", "target_field", "mlm_probability", "audio_field")
}


def cache_key(cfg: DataConfig, source: dict[str, Any], tokenizer_id: str) -> str:
    """The cache folder name: a hash of the content and of every setting that shapes it.

    A data file is identified by its content, so a renamed or moved copy finds
    the same cache entry, and an edited file does not.
    """
    settings = asdict(cfg)
    settings.pop("dataset")  # the source's identity stands for it
    for name, default in _LATER_DEFAULTS.items():
        # settings added after the cache's layout: at their defaults, keys stay as they were
        if settings.get(name) == default:
            settings.pop(name)
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


def is_cached(folder: Path) -> bool:
    """Whether ``folder`` holds a finished entry."""
    return all((folder / name).is_file() for name in CACHE_FILES)


def save(folder: Path, data: PreparedData) -> None:
    """Write ``data`` into ``folder``, ``meta.json`` last."""
    lengths = np.asarray(data.lengths(), dtype=np.int64)
    np.savez(
        folder / "tokens.npz",
        input_ids=np.concatenate(data.input_ids),
        labels=np.concatenate(data.labels),
        lengths=lengths,
    )
    (folder / "meta.json").write_text(json.dumps(data.meta, indent=2, sort_keys=True) + "\n")


def load(folder: Path) -> PreparedData:
    with np.load(folder / "tokens.npz") as npz:
        offsets = np.concatenate([[0], np.cumsum(npz["lengths"])])
        ids, labels = npz["input_ids"], npz["labels"]
        pieces = list(itertools.pairwise(offsets))
        input_ids = [ids[a:b] for a, b in pieces]
        label_list = [labels[a:b] for a, b in pieces]
    meta = json.loads((folder / "meta.json").read_text())
    return PreparedData(input_ids=input_ids, labels=label_list, meta=meta)


def cached(data_dir: Path, key: str, make: Callable[[], PreparedData]) -> PreparedData:
    """The entry ``key`` of the cache in ``data_dir``: prepared sequences, made by ``make``
    when it is not there (``cached_entry``)."""
    return cached_entry(data_dir, key, make, save, load)


class _Prepared(Protocol):
    """Prepared examples: what the preparation did (``meta``)."""

    meta: dict[str, Any]


P = TypeVar("P", bound=_Prepared)


def cached_entry(
    data_dir: Path,
    key: str,
    make: Callable[[], P],
    save: Callable[[Path, P], None],
    load: Callable[[Path], P],
) -> P:
    """The entry ``data_dir/key``: read by ``load`` where it is there, else made by ``make``
    (``cache_key`` in its ``meta``) and published once by ``save`` (a task's own examples
    are saved and read by its own functions). ``meta`` says which: ``cache_hit`` (False
    when this process made it) and ``cache_path``.
    """
    folder = data_dir / key
    made: list[P] = []

    def build(tmp: Path) -> None:
        made.append(make())
        made[0].meta["cache_key"] = key
        save(tmp, made[0])

    build_once(folder, build, is_cached, what=f"the prepared dataset {key}")
    data = made[0] if made else load(folder)
    data.meta.update(cache_hit=not made, cache_path=str(folder))
    return data
