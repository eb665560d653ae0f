"""The flags of steady-state measuring, shared by ``plan`` and ``run`` (not a command)."""

from __future__ import annotations

import argparse
from typing import Any

from orchestrator.contract.choices import positive_int
from orchestrator.contract.steady import DEFAULT_MAX_STEPS, DEFAULT_MIN_STEPS, DEFAULT_PRECISION


def _precision(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not between 0 and 1 (0.02 is ±2%)")
    return value


def add_measure_args(g: Any) -> None:
    g.add_argument(
        "--until",
        choices=("steps", "steady"),
        help="how long each cell runs: steps, its fixed max_steps argument (the default); "
        "steady, until the 95%% interval of its mean step time (batch means) is within "
        "--precision of the mean. Overrides every scenario's `measure:` setting",
    )
    g.add_argument(
        "--precision",
        type=_precision,
        metavar="P",
        help=f"with --until steady: the interval's half-width over the mean at which a cell "
        f"stops (default: the scenario's, else {DEFAULT_PRECISION}, i.e. ±2%%)",
    )
    g.add_argument(
        "--min-steps",
        type=positive_int,
        metavar="N",
        help=f"with --until steady: measured steps before a cell may stop (default: the "
        f"scenario's, else {DEFAULT_MIN_STEPS})",
    )
    g.add_argument(
        "--max-steps",
        type=positive_int,
        metavar="N",
        help=f"with --until steady: the step cap of a cell that does not settle (default: "
        f"the scenario's, else {DEFAULT_MAX_STEPS})",
    )


def measure_from_args(args: argparse.Namespace) -> dict[str, Any] | None:
    """The flags as the API's ``measure=`` (None: the scenarios' own)."""
    given = {
        key: getattr(args, key, None)
        for key in ("until", "precision", "min_steps", "max_steps")
        if getattr(args, key, None) is not None
    }
    return given or None
