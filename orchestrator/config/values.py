"""Rules for names and values that come from config files.

Scenario and framework names become parts of experiment ids, which are folder
names; argument values travel to the child as JSON. These checks say why a
name or value is refused, in words a user can act on.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from typing import Any

from orchestrator.config.yamlio import Loc, YamlDoc
from orchestrator.contract.modelnames import is_python_model, python_model_problem

#: Matrix axes: set under ``matrix:`` (or on the command line); a scenario may
#: pin one in its ``arguments`` or sweep it, but defaults.yaml may not set them.
AXES = ("effective_batch_size", "max_seq_len", "packing")

#: Keys that are not trainer arguments and so may not appear in ``arguments``.
RESERVED_ARGUMENTS = ("num_gpus", "repeat", "repeats")

#: The framework label used for "no overlay" (``null`` in ``framework_config``).
NO_FRAMEWORK = "none"

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_NAME_MAX = 64
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")


def check_name(value: str, what: str) -> str | None:
    """Why ``value`` cannot name a scenario or framework, or None if it can.

    These names become parts of experiment ids, which are folder names under
    the results folder, so nothing that could leave that folder is allowed.
    """
    if "\x00" in value:
        return f"{what} {value!r} contains a NUL character"
    if not value:
        return f"{what} is empty"
    if "/" in value or "\\" in value or value.startswith("."):
        return (
            f"{what} {value!r} would escape the results folder; "
            "use letters, digits, '-', '_' and '.', starting with a letter or digit"
        )
    if ".." in value:
        return f"{what} {value!r} must not contain '..'"
    if not _NAME_RE.match(value):
        return (
            f"{what} {value!r} has characters that are not allowed; "
            "use letters, digits, '-', '_' and '.', starting with a letter or digit"
        )
    if len(value) > _NAME_MAX:
        return f"{what} {value!r} is longer than {_NAME_MAX} characters"
    return None


def check_model_name(value: object) -> str | None:
    """Why ``value`` cannot be a ``model_name_or_path``, or None if it can.

    Hub ids, local folders (relative or absolute) and ``config:<arch>`` are
    all fine: a model name never becomes a path under the results folder, only
    a sanitised short form of it does (see ``orchestrator.matrix.ids``).
    """
    if not isinstance(value, str):
        return f"a model name must be a string, got {type_name(value)} {value!r}"
    if not value:
        return "a model name is empty"
    if "\x00" in value:
        return f"model name {value!r} contains a NUL character"
    if _CONTROL_RE.search(value):
        return f"model name {value!r} contains a control character"
    if value != value.strip():
        return f"model name {value!r} has leading or trailing spaces"
    if is_python_model(value):
        # its form only: the module is the child's to import
        return python_model_problem(value)
    return None


def type_name(value: object) -> str:
    return {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean"}.get(
        type(value), type(value).__name__
    )


def check_value(value: object, loc: Loc) -> tuple[str, Loc] | None:
    """Why ``value`` is not a plain JSON value (None if it is), and where.

    Arguments travel to the child as JSON (``spec.json``), so only JSON types
    are allowed: null, booleans, numbers, strings, lists and string-keyed maps.
    """
    if value is None or isinstance(value, (bool, int, str)):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else (f"{value} is not a finite number", loc)
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            problem = check_value(item, (*loc, i))
            if problem:
                return problem
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return (f"mapping keys must be strings, got {key!r}", loc)
            problem = check_value(item, (*loc, key))
            if problem:
                return problem
        return None
    return (f"unsupported value {value!r} ({type(value).__name__}); quote it as a string", loc)


def canonical_json(value: Any) -> str:
    """The one JSON text of ``value`` used for hashing: sorted keys, no spaces."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)


def check_unique(
    doc: YamlDoc, values: Sequence[Any], loc: Loc, what: str, *, key: str | None = None
) -> None:
    """Refuse a value listed twice in the list at ``loc``, at the second one (its ``key``,
    where given): ``<what> 'x' is listed twice (items i and j)``."""
    seen: dict[str, int] = {}
    for i, value in enumerate(values):
        text = canonical_json(value)
        if text in seen:
            raise doc.error(
                f"{what} {value!r} is listed twice (items {seen[text]} and {i})",
                (*loc, i, *((key,) if key is not None else ())),
            )
        seen[text] = i
