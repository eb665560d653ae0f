"""pyproject.toml's floors and the floor env that runs them (tox -e floor) agree."""

from __future__ import annotations

from floors import FLOORED, floors, release, tox_pins


def test_the_floor_env_installs_exactly_pyprojects_lower_bounds() -> None:
    bounds = floors()
    assert sorted(bounds) == sorted(FLOORED), "every floored package has a lower bound"
    pins = tox_pins()
    assert sorted(pins) == sorted(FLOORED)
    assert {n: release(v) for n, v in pins.items()} == {n: release(v) for n, v in bounds.items()}


def test_transformers_floor_is_the_cuda_images_or_older() -> None:
    # the CUDA images GPU users start from carry transformers 5.17
    assert release(floors()["transformers"]) <= (5, 17, 0)
