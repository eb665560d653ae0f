"""Reading a results folder's ``env.json`` (what the run ran on, and its price).

The run writes it (``orchestrator.running.envinfo``); the report only reads
it, so reading lives here, beside the other readers of results.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from orchestrator.contract.layout import ResultsLayout


def read_env(root: Path) -> dict[str, Any] | None:
    """A results folder's env.json; None where it is missing or unreadable."""
    try:
        env = json.loads(ResultsLayout(root).env.read_text())
    except (OSError, ValueError):
        return None
    return env if isinstance(env, dict) else None


def cost_from_env(root: Path, name: str = "usd_per_gpu_hour") -> float | None:
    """A price the run recorded in its env.json (from the command line or the scenarios
    file's ``cost:``): ``usd_per_gpu_hour``, ``usd_per_kwh`` or ``grams_co2_per_kwh``."""
    env = read_env(root)
    if env is None:
        return None
    value = (env.get("cost") or {}).get(name)
    return float(value) if isinstance(value, (int, float)) else None
