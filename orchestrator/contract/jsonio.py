"""Reading the JSON records of a results folder, fast where it can be.

A report reads three records per run folder (``spec.json``, ``outcome.json``,
``result.json``): over 10,000 folders, parsing is most of the read. orjson,
where it is installed (``pip install orjson``), parses them several times
faster than the standard library; what it refuses and the standard library
reads (``NaN`` and ``Infinity``, which Python's ``json.dumps`` writes, a lone
surrogate) is read by the standard library, so a file reads the same either
way. One difference is left: an integer past 64 bits comes back from orjson
as a float (no record of ours holds one).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

try:  # optional: the standard library reads the same records, slower
    import orjson
except ImportError:  # pragma: no cover - depends on the environment
    orjson = None  # type: ignore[assignment]


def parse_json(data: bytes) -> Any:
    """The value of a JSON text (UTF-8 bytes); ``ValueError`` if it is not one."""
    if orjson is not None:
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass  # NaN, Infinity, a lone surrogate: the standard library reads them
    return json.loads(data.decode("utf-8"))


def read_json_object(path: Path | str) -> dict[str, Any] | None:
    """The JSON object in the file at ``path``; None where there is no file, it cannot
    be read, or it holds no JSON object."""
    try:
        with open(path, "rb") as f:
            data = parse_json(f.read())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def read_json_object_reason(path: Path | str) -> tuple[dict[str, Any] | None, str | None]:
    """The JSON object in the file at ``path``, or why there is none: ``(object, None)``;
    ``(None, None)`` where there is no file (nor folder above it); ``(None, reason)``
    where the file is there but cannot be read (``truncated or not JSON: <the parser's
    message>``, ``not a JSON object``, or the system's reason, ``Permission denied``).

    ``read_json_object`` reads the same files, without telling missing from unreadable.
    """
    try:
        with open(path, "rb") as f:
            data = parse_json(f.read())
    except (FileNotFoundError, NotADirectoryError):
        return None, None
    except OSError as exc:
        return None, exc.strerror or str(exc)
    except ValueError as exc:  # json.JSONDecodeError, UnicodeDecodeError
        return None, f"truncated or not JSON: {exc}"
    if not isinstance(data, dict):
        return None, "not a JSON object"
    return data, None
