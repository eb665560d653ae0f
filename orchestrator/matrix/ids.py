"""Experiment ids: readable, stable, and safe as folder names.

``<scenario>.<model-short>.<framework or none>[.<environment>].g<N>.eb<B>[.r<k>]-<hash8>``

The environment's name is there only when the scenarios file lists
``environments:``; its resolved versions are then hashed too, so an
environment whose packages changed gives new ids.

The hash covers the fully resolved spec of the cell (every trainer argument,
the data stanza, the accelerate config's parsed content, the environment
overlay, GPU count and batch sizes), so the same inputs give the same id on
every machine and in every process, and any change of an argument gives a new
one. The repeat index is the ``.r<k>`` part (absent for the first run), so
raising ``repeats`` later keeps the ids of the runs already made.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import Any

from orchestrator.config.values import canonical_json
from orchestrator.contract.modelnames import is_python_model

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
MODEL_SHORT_MAX = 48


def model_short_name(model_name_or_path: str) -> str:
    """A short, path-safe label for a model: the last part of its name or path.

    ``mistralai/Mistral-7B-v0.1`` -> ``Mistral-7B-v0.1``; ``config:llama-3.1-8b``
    -> ``llama-3.1-8b``; ``python:my_models.factory:build_tiny`` -> ``build_tiny``
    (the factory's name); ``../../etc`` -> ``etc``. Never empty, never a path.
    """
    name = model_name_or_path.removeprefix("config:")
    if is_python_model(name):
        name = name.rpartition(":")[2]
    parts = [p for p in re.split(r"[/\\]+", name) if p not in ("", ".", "..")]
    short = _UNSAFE.sub("-", parts[-1] if parts else "")
    short = short.strip(".-_")[:MODEL_SHORT_MAX].strip(".-_")
    short = re.sub(r"\.{2,}", ".", short)
    return short or "model"


def spec_digest(identity: Mapping[str, Any]) -> str:
    """The SHA-256 (64 hex digits) of the canonical JSON of ``identity``."""
    return hashlib.sha256(canonical_json(identity).encode()).hexdigest()


def spec_hash(identity: Mapping[str, Any]) -> str:
    """First 8 hex digits of :func:`spec_digest`: the ``-<hash8>`` of an experiment id."""
    return spec_digest(identity)[:8]


def experiment_id(
    *,
    scenario: str,
    model_name_or_path: str,
    framework: str,
    num_gpus: int,
    effective_batch_size: int,
    repeat: int,
    digest: str,
    environment: str | None = None,
) -> str:
    # an environment's name follows the framework (its versions are in the hash)
    readable = (
        f"{scenario}.{model_short_name(model_name_or_path)}.{framework}"
        + (f".{environment}" if environment is not None else "")
        + f".g{num_gpus}.eb{effective_batch_size}"
    )
    if repeat:
        readable += f".r{repeat}"
    return f"{readable}-{digest}"
