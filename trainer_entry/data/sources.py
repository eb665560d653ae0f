"""Where the records of a dataset come from: a local file, the hub, or the shipped one.

A local ``.jsonl``, ``.json`` (a list of records, or ``{"data": [...]}``),
``.csv`` or ``.txt`` (one text per line, in field ``text``) file; anything
else that is not a path is a Hugging Face datasets name. Each source has an identity for the cache key: a file's content hash
(not its name), a hub dataset's name, split and fingerprint.
"""

from __future__ import annotations

import csv
import hashlib
import json
from pathlib import Path
from typing import Any

from orchestrator.contract.modelnames import hub_offline
from trainer_entry import ASSETS
from trainer_entry.settings.parsed import DataConfig
from trainer_entry.spec_errors import SpecError, first_line

#: the dataset a scenario without one trains on (and the tiny model's tokenizer is trained on)
SHIPPED_DATASET = ASSETS / "instructions.jsonl"

#: file types read as local datasets
LOCAL_SUFFIXES = (".jsonl", ".json", ".csv", ".txt")


def file_records(path: Path) -> list[dict[str, Any]]:
    """The records of a local dataset file."""
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
        if suffix == ".txt":  # plain text: one text per non-blank line, in field "text"
            with path.open(encoding="utf-8") as f:
                return [{"text": line.rstrip("\n")} for line in f if line.strip()]
    except json.JSONDecodeError as exc:
        raise SpecError(f"dataset {path}: not valid JSON ({exc.msg}, line {exc.lineno})") from None
    except UnicodeDecodeError:
        raise SpecError(f"dataset {path}: not UTF-8 text") from None
    raise SpecError(
        f"dataset {path}: unsupported file type '{suffix}'; use .jsonl, .json, .csv or .txt"
    )


def load_hub_dataset(name: str, cfg: DataConfig, *, besides: str = "") -> Any:
    """Hub dataset ``name`` (``cfg``'s split and keyword arguments); one line if it cannot load.

    ``besides`` names what else the name is not (``or synthetic-shapes``).
    """
    try:
        import datasets
    except ImportError:
        raise SpecError(
            f"dataset '{name}' is not a local file, and the datasets package is not installed"
        ) from None
    try:
        return datasets.load_dataset(name, split=cfg.split, **cfg.dataset_kwargs)
    except Exception as exc:  # the library raises many types; all mean "cannot load"
        hint = " and the hub is offline (HF_HUB_OFFLINE=1)" if hub_offline() else ""
        first = (str(exc).strip().splitlines() or [""])[0]
        raise SpecError(
            f"dataset '{name}' is not a local file{besides}{hint}; loading it failed: "
            f"{type(exc).__name__}: {first}"
        ) from None


def load_records(cfg: DataConfig) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The records of the dataset and an identity for the cache key."""
    name = cfg.dataset
    path = SHIPPED_DATASET if name is None else Path(name).expanduser()
    local = name is None or path.suffix.lower() in LOCAL_SUFFIXES or path.exists()
    if local:
        if not path.is_file():
            raise SpecError(f"dataset file not found: {path}")
        records = file_records(path)
        identity: dict[str, Any] = {
            "file": path.name,
            "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        }
    else:
        assert name is not None  # no name: the shipped file, local
        ds = load_hub_dataset(name, cfg)
        try:
            records = [dict(r) for r in ds]
        except ImportError as exc:  # a column decoded by a package not installed (audio)
            raise SpecError(
                f"dataset '{name}': reading its records needs a package that is not installed: "
                f"{first_line(exc)}"
            ) from None
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
