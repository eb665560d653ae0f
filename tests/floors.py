"""The lowest versions pyproject.toml allows of the training stack, and the floor env's pins.

Read without tomllib (Python 3.10 has none): the ``train`` extra is a list of
``"name>=version"`` strings, one per line.
"""

from __future__ import annotations

import configparser
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
#: the packages whose floors ``tox -e floor`` installs
FLOORED = ("torch", "transformers", "trl", "peft", "accelerate", "datasets")


def floors(pyproject: Path = REPO / "pyproject.toml") -> dict[str, str]:
    """pyproject.toml's lower bound of each floored package (its ``train`` extra)."""
    text = pyproject.read_text()
    block = re.search(r"^train = \[(.*?)^\]", text, re.S | re.M)
    assert block, "pyproject.toml has no train = [...] extra"
    found = re.findall(r'^\s*"([A-Za-z0-9_.-]+)>=([0-9.]+)"', block.group(1), re.M)
    return {name: bound for name, bound in found if name in FLOORED}


def tox_pins(tox_ini: Path = REPO / "tox.ini") -> dict[str, str]:
    """The exact versions ``[testenv:floor]`` installs."""
    parser = configparser.ConfigParser(interpolation=None)
    parser.read(tox_ini)
    pins = {}
    for line in parser["testenv:floor"]["deps"].split():
        name, _, pinned = line.partition("==")
        pins[name] = pinned
    return pins


def release(text: str) -> tuple[int, ...]:
    """``2.11.0+cu130`` -> (2, 11, 0); ``5.0`` -> (5, 0, 0): what a floor and a version
    are compared by."""
    head = re.match(r"[0-9]+(\.[0-9]+)*", text)
    assert head, text
    parts = [int(p) for p in head.group(0).split(".")]
    return tuple(parts + [0] * (3 - len(parts)))
