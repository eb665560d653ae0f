"""What every command shares: the parser classes, number types, the energy prices.

Light on purpose: ``tunematrix report``, ``compare`` and ``history`` import only
this, their own module and the API (which imports what a call needs when called);
the flags that plan a matrix (``plan``, ``run``, ``fit``) are in ``selection``.
"""

from __future__ import annotations

import argparse
from typing import NoReturn

from orchestrator.contract.errors import UserError

PROG = "tunematrix"


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (and exit code 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


class Formatter(argparse.RawDescriptionHelpFormatter):
    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=32)


def parse_int_list(text: str, flag: str) -> tuple[int, ...]:
    """``"1 2"`` or ``"1,2"`` -> ``(1, 2)``; every value a distinct positive integer."""
    values: list[int] = []
    for word in text.replace(",", " ").split():
        try:
            value = int(word)
        except ValueError:
            raise UserError(f"{flag}: {word!r} is not an integer (got {text!r})") from None
        if value <= 0:
            raise UserError(f"{flag}: {value} is not a positive integer (got {text!r})")
        if value in values:
            raise UserError(f"{flag}: {value} is listed twice (got {text!r})")
        values.append(value)
    if not values:
        raise UserError(f'{flag}: no values given; write them like "1 2"')
    return tuple(values)


def add_recheck_arg(group: argparse._ArgumentGroup) -> None:
    """``--recheck``, which ``run`` and ``fit`` take alike (``check_stack``'s ``recheck``)."""
    group.add_argument(
        "--recheck",
        action="store_true",
        help="check every cell again, even one whose verdict was kept from an earlier check "
        "of the same stack, code, settings and files (by default only the cells not seen "
        "before are checked; kept in ~/.cache/tunematrix/checks, or $TUNEMATRIX_CACHE)",
    )


def positive_float(text: str) -> float:
    """An argparse type: a number above 0 (a price, a rate)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{value:g} is not a positive number")
    if value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def add_energy_prices(group: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """``--usd-per-kwh`` and ``--grams-co2-per-kwh``, which ``run`` and ``report`` take."""
    group.add_argument(
        "--usd-per-kwh",
        type=positive_float,
        metavar="USD",
        help="price of a kWh: the report adds the energy's cost per 1M tokens "
        "(default: the scenarios file's cost:; for a results folder, the run's)",
    )
    group.add_argument(
        "--grams-co2-per-kwh",
        type=positive_float,
        metavar="G",
        help="your grid's emissions per kWh: the report adds grams of CO2 per 1M tokens "
        "(default: the scenarios file's cost:; for a results folder, the run's)",
    )
