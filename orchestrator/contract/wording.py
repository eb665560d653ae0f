"""Words for figures a user reads: relative differences, and GPUs or processes.

One place decides how "how much slower" is said, so every table, note and
plot says it the same way, and one place decides whether a count is of GPUs
or, on the CPU, of processes.
"""

from __future__ import annotations

from collections.abc import Iterable


def fewer(winner: float, other: float, unit: str = "tokens/s") -> str:
    """How far ``other`` falls below ``winner``, said of ``other``: "20.7% fewer tokens/s".

    The share is ``1 − other/winner``: 12,877 against 16,245 is 20.7% fewer,
    never the 26.2% by which the winner exceeds it (that is ``times``: 1.26×).
    """
    if winner <= 0:
        return f"{other:,.0f} against {winner:,.0f} {unit}"
    return f"{100 * (1.0 - other / winner):.1f}% fewer {unit}"


def times(faster: float, slower: float) -> str:
    """How many times ``slower`` the ``faster`` figure is: "1.26×" (n/a where slower is 0)."""
    return f"{faster / slower:.2f}×" if slower > 0 else "n/a"


def signed_change(fraction: float) -> str:
    """A change already computed as ``new/reference − 1``: "+3.1%", "-20.7%"."""
    return f"{100 * fraction:+.1f}%"


def on_cpu(devices: Iterable[object]) -> bool:
    """True where every device named is the CPU (a run of processes, not GPUs)."""
    seen = {str(d).lower() for d in devices if d is not None and str(d) not in ("", "nan")}
    return bool(seen) and seen == {"cpu"}


def worker(cpu: bool) -> str:
    """One worker, without a count: "GPU", or "process" on the CPU."""
    return "process" if cpu else "GPU"


def workers(cpu: bool, count: int | None = None, *, short: bool = False) -> str:
    """ "GPUs"/"processes" (a count gives "1 GPU", "2 processes"); ``short``: "GPU"/"proc"."""
    if short:
        word = "proc" if cpu else "GPU"
        return word if count is None else f"{count} {word}"
    one, many = ("process", "processes") if cpu else ("GPU", "GPUs")
    if count is None:
        return many
    return f"{count} {one if count == 1 else many}"
