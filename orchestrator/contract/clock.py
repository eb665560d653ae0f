"""The clock every record's timestamps come from: UTC, ISO 8601."""

from __future__ import annotations

from datetime import datetime, timezone


def now(timespec: str = "seconds") -> str:
    """UTC now, ISO 8601 (``timespec="milliseconds"`` where latencies are read from it)."""
    return datetime.now(timezone.utc).isoformat(timespec=timespec)


def at(unix: float, timespec: str = "milliseconds") -> str:
    """A Unix time as ``now`` writes it."""
    return datetime.fromtimestamp(unix, timezone.utc).isoformat(timespec=timespec)
