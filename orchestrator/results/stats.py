"""Small statistics for comparing repeated measurements. Pure Python.

The Mann–Whitney U test asks whether one sample tends to be larger than the
other without assuming a distribution, which suits throughput samples of a few
repeats. Small samples without ties get the exact distribution of U; others
the normal approximation with the tie correction.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache

EXACT_LIMIT = 10_000  # n1 * n2 up to which the exact distribution is used


def _ranks(values: Sequence[float]) -> tuple[list[float], list[int]]:
    """Average ranks (1-based) and the sizes of tied groups."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    ties: list[int] = []
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        average = (i + j) / 2 + 1
        for k in range(i, j + 1):
            ranks[order[k]] = average
        if j > i:
            ties.append(j - i + 1)
        i = j + 1
    return ranks, ties


@lru_cache(maxsize=256)
def _u_counts(n1: int, n2: int) -> tuple[int, ...]:
    """How many of the C(n1+n2, n1) arrangements give each value of U (0..n1·n2)."""
    # f(m, n)[u]: arrangements of m x's and n y's with u (x > y) pairs
    table: list[list[tuple[int, ...]]] = [
        [(1,) if m == 0 or n == 0 else () for n in range(n2 + 1)] for m in range(n1 + 1)
    ]
    for m in range(1, n1 + 1):
        for n in range(1, n2 + 1):
            size = m * n + 1
            counts = [0] * size
            # the largest element is an x (contributing n) or a y (contributing 0)
            for u, c in enumerate(table[m - 1][n]):
                counts[u + n] += c
            for u, c in enumerate(table[m][n - 1]):
                counts[u] += c
            table[m][n] = tuple(counts)
    return table[n1][n2]


def _normal_sf(z: float) -> float:
    return 0.5 * math.erfc(z / math.sqrt(2))


def mann_whitney_u(
    x: Sequence[float], y: Sequence[float], alternative: str = "less"
) -> tuple[float, float]:
    """U of ``x`` (pairs where x > y, ties counting half) and the p-value.

    ``alternative``: ``less`` (x tends to be smaller than y), ``greater`` or
    ``two-sided``.
    """
    n1, n2 = len(x), len(y)
    if n1 == 0 or n2 == 0:
        raise ValueError("both samples need at least one value")
    ranks, ties = _ranks([*x, *y])
    u = sum(ranks[:n1]) - n1 * (n1 + 1) / 2
    if not ties and n1 * n2 <= EXACT_LIMIT:
        counts = _u_counts(n1, n2)
        total = math.comb(n1 + n2, n1)
        k = round(u)
        p_le = sum(counts[: k + 1]) / total
        p_ge = sum(counts[k:]) / total
    else:
        mean = n1 * n2 / 2
        n = n1 + n2
        tie_term = sum(t**3 - t for t in ties) / (n * (n - 1))
        sd = math.sqrt(n1 * n2 / 12 * ((n + 1) - tie_term))
        if sd == 0:
            return u, 1.0
        p_le = 1 - _normal_sf((u - mean + 0.5) / sd)
        p_ge = _normal_sf((u - mean - 0.5) / sd)
    if alternative == "less":
        return u, min(1.0, p_le)
    if alternative == "greater":
        return u, min(1.0, p_ge)
    if alternative == "two-sided":
        return u, min(1.0, 2 * min(p_le, p_ge))
    raise ValueError(f"alternative must be less, greater or two-sided, got {alternative!r}")


def cv(values: Sequence[float]) -> float | None:
    """Coefficient of variation: the sample standard deviation (ddof=1) over the mean.

    The repeats are a sample of the run-to-run spread, so the sample standard
    deviation (as pandas' ``std()``) estimates it; the population one (numpy's
    default) understates it, by a factor of sqrt((n - 1) / n), about 18% for 3 repeats.
    ``None`` for fewer than two values or a zero mean.
    """
    if len(values) < 2:
        return None
    mean = sum(values) / len(values)
    if mean == 0:
        return None
    var = sum((v - mean) ** 2 for v in values) / (len(values) - 1)
    return math.sqrt(var) / abs(mean)
