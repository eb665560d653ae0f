"""Mann–Whitney U against values worked out by hand."""

from __future__ import annotations

import math

import pytest

from orchestrator.results.stats import cv, mann_whitney_u


def test_fully_separated_samples_exact() -> None:
    # x all below y: U = 0; exactly one of C(n1+n2, n1) orderings is that extreme
    assert mann_whitney_u([1, 2, 3], [4, 5, 6], "less") == (0.0, pytest.approx(1 / 20))
    assert mann_whitney_u([1, 2, 3, 4], [5, 6, 7, 8], "less") == (0.0, pytest.approx(1 / 70))
    assert mann_whitney_u([1, 2, 3], [4, 5, 6], "two-sided")[1] == pytest.approx(2 / 20)
    assert mann_whitney_u([1, 2, 3], [4, 5, 6], "greater")[1] == pytest.approx(1.0)


def test_small_exact_case_by_enumeration() -> None:
    # x = [1, 4], y = [2, 3]: U = 2 pairs (4 > 2, 4 > 3); of the 6 orderings, U ≤ 2 in 4
    u, p = mann_whitney_u([1, 4], [2, 3], "less")
    assert u == 2.0 and p == pytest.approx(4 / 6)


def test_ties_use_the_normal_approximation() -> None:
    x, y = [1, 2, 2, 3], [2, 3, 3, 4]
    u, p = mann_whitney_u(x, y, "less")
    # ranks of 1,2,2,2,3,3,3,4: 1, 3, 3, 3, 6, 6, 6, 8 -> R_x = 1 + 3 + 3 + 6 = 13, U = 13 - 10 = 3
    assert u == 3.0
    ties = (3**3 - 3) + (3**3 - 3)
    sd = math.sqrt(16 / 12 * (9 - ties / (8 * 7)))
    z = (3 - 8 + 0.5) / sd
    assert p == pytest.approx(0.5 * math.erfc(-z / math.sqrt(2)))


def test_bad_input() -> None:
    with pytest.raises(ValueError, match="at least one value"):
        mann_whitney_u([], [1.0])
    with pytest.raises(ValueError, match="alternative"):
        mann_whitney_u([1.0], [2.0], "sideways")


def test_cv_uses_the_sample_standard_deviation() -> None:
    assert cv([1.0]) is None
    assert cv([0.0, 0.0]) is None
    assert cv([2.0, 2.0]) == 0.0
    # mean 2, squared deviations 1 + 1 over n - 1 = 1: sd sqrt(2) (the population sd is 1)
    assert cv([1.0, 3.0]) == pytest.approx(math.sqrt(2) / 2)
    # 900, 1000, 1200: mean 1033.3, squared deviations 17777.8 + 1111.1 + 27777.8 = 46666.7
    assert cv([900.0, 1000.0, 1200.0]) == pytest.approx(math.sqrt(46666.67 / 2) / 1033.333)


def test_report_cells_use_the_sample_standard_deviation(tmp_path) -> None:
    """The report's CV of repeats agrees with ``cv`` (ddof=1), not numpy's population default."""
    from fakeruns import write_run

    from orchestrator.results import collect
    from orchestrator.results.aggregate import CostSettings, add_derived, aggregate

    for r, tps in enumerate((900.0, 1000.0, 1200.0)):
        write_run(tmp_path, f"a.r{r}", cell_id="a", repeat=r, tps=tps)
    cells = aggregate(add_derived(collect.load(tmp_path), CostSettings()))
    (cell,) = cells.to_dict("records")
    assert cell["tokens_per_second_global_cv"] == pytest.approx(cv([900.0, 1000.0, 1200.0]))
    assert cell["tokens_per_second_global_cv"] == pytest.approx(0.14783, abs=1e-5)
