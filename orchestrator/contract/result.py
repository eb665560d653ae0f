"""``result.json``: the typed record a run leaves behind, and the status vocabulary.

Written by the training child (rank 0 on success, the failing rank on an
error), read by the parent and the report. The parent never scrapes numbers
from a child's output: what it knows of a run comes from here.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from orchestrator.contract.layout import write_atomic

RESULT_SCHEMA_VERSION = 1

#: Set by the parent for one launch of a job, the same on every node and rank
#: of it: a rank stopped because a peer failed recognises the peer's report.
LAUNCH_ID_ENV = "TUNEMATRIX_LAUNCH_ID"


def one_line(text: str, limit: int = 500) -> str:
    """An error message as one line: whitespace runs collapsed, long text cut."""
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _json_safe(value: Any) -> Any:
    """Replace NaN and infinities (not valid JSON) with None, recursively."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def write_result(path: Path, result: dict[str, Any]) -> None:
    """Write a result atomically: a reader sees no file or the whole file."""
    record = {"schema_version": RESULT_SCHEMA_VERSION, **result}
    write_atomic(
        path, json.dumps(_json_safe(record), indent=2, sort_keys=True, allow_nan=False) + "\n"
    )


def read_result(path: Path) -> dict[str, Any] | None:
    """The result at ``path``, or None if there is none or it cannot be read."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
