"""Model names that both sides read: ``python:<module>:<function>``.

A ``model_name_or_path`` of the form ``python:my_models.factory:build`` names
a function of the user's that builds the model. The parent only checks the
name's form (the scenarios file is refused at load time, with one line) and
makes a short label of it; it never imports the module. The child imports it
and calls the function when it trains that experiment
(``trainer_entry.models.load``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

PYTHON_PREFIX = "python:"
#: the embedded tiny models, built offline by the child (``trainer_entry.models.kinds``)
TINY_MODEL_NAMES = (
    "tiny-llama",
    "tiny-bert",
    "tiny-vit",
    "tiny-t5",
    "tiny-bart",
    "tiny-whisper",
    "tiny-wav2vec2",
    "tiny-vlm",
)
EXAMPLE = "python:my_models.factory:build"


def is_python_model(name: object) -> bool:
    """Whether ``name`` is a ``python:`` model name (well formed or not)."""
    return isinstance(name, str) and name.startswith(PYTHON_PREFIX)


def python_factory(name: str) -> tuple[str, str]:
    """(dotted module path, function name) of ``python:<module>:<function>``.

    Raises ``ValueError`` with one line saying what is wrong with the name.
    """
    target = name.removeprefix(PYTHON_PREFIX)
    module, sep, function = target.rpartition(":")
    if not sep or not module or not function:
        raise ValueError(
            f"model {name!r} names no factory; write python:<module>:<function>, e.g. {EXAMPLE}"
        )
    if not all(part.isidentifier() for part in module.split(".")):
        raise ValueError(
            f"model {name!r}: {module!r} is not a dotted module path "
            "(names of letters, digits and _ joined by dots)"
        )
    if not function.isidentifier():
        raise ValueError(f"model {name!r}: {function!r} is not a function name")
    return module, function


def python_model_problem(name: str) -> str | None:
    """Why ``name`` (a ``python:`` name) is malformed, or None if it is well formed."""
    try:
        python_factory(name)
    except ValueError as exc:
        return str(exc)
    return None


def hub_offline(env: Mapping[str, str] = os.environ) -> bool:
    """Whether the environment keeps the Hugging Face hub offline: ``HF_HUB_OFFLINE`` (or
    transformers' older ``TRANSFORMERS_OFFLINE``) set to what huggingface_hub reads as
    true (1, true, yes, on)."""
    return any(
        env.get(name, "").strip().lower() in ("1", "true", "yes", "on")
        for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )
