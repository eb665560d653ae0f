"""One table value as a number, without pandas (``tunematrix plan`` reads the history
through it and must not import pandas)."""

from __future__ import annotations

import math
from typing import Any


def whole(value: Any) -> int | None:
    """A count (GPUs, repeats) from a table value; None where ``number`` finds none."""
    found = number(value)
    return None if found is None else int(found)


def number(value: Any) -> float | None:
    """One table value as a float; None where it is missing, a boolean, no number or NaN."""
    if value is None or isinstance(value, bool):
        return None
    try:
        found = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(found) else found
