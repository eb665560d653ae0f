"""ARCHITECTURE.md's tree names every module of the two packages, in its own folder (or
the package's README.md does).

The tree is read as it is written: a line whose first word ends in ``/`` opens a
folder at its indentation, and every ``name.py`` on the lines inside it (its
descriptions included) is named in that folder. A cluster executor's package may
be named by the files its parent's lines say every such package has. A package's
``__init__.py`` is its folder's, and needs no line of its own.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("orchestrator", "trainer_entry")


def named_in_tree() -> dict[str, set[str]]:
    """Per folder (``orchestrator/contract/``), the names its lines carry."""
    text = (REPO / "ARCHITECTURE.md").read_text()
    block = text.split("## The tree", 1)[1].split("```", 2)[1]
    named: dict[str, set[str]] = {}
    stack: list[tuple[int, str]] = []
    for line in block.splitlines():
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        first = line.split()[0]
        if first.endswith("/"):
            while stack and stack[-1][0] >= indent:
                stack.pop()
            stack.append((indent, (stack[-1][1] if stack else "") + first))
        assert stack, f"a line of the tree outside any folder: {line!r}"
        named.setdefault(stack[-1][1], set()).update(re.findall(r"(?<![\w/.])\w+\.py\b|\w+/", line))
    return named


def modules() -> list[Path]:
    found = [p.relative_to(REPO) for package in PACKAGES for p in (REPO / package).rglob("*.py")]
    return sorted(p for p in found if p.name != "__init__.py" or p.parent == Path(PACKAGES[0]))


def is_named(module: Path, named: dict[str, set[str]]) -> bool:
    folder = module.parent.as_posix() + "/"
    if module.name in named.get(folder, set()):
        return True
    # or its package's README (the tree points to it), as `name.py`
    readme = REPO / module.parent / "README.md"
    if readme.is_file() and f"`{module.name}`" in readme.read_text():
        return True
    parent = named.get(module.parent.parent.as_posix() + "/", set())
    return module.parent.name + "/" in parent and module.name in parent


def test_every_module_is_named_in_the_tree() -> None:
    named = named_in_tree()
    found = modules()
    assert len(found) > 150  # the walk found the packages
    missing = [m.as_posix() for m in found if not is_named(m, named)]
    assert missing == [], f"ARCHITECTURE.md's tree names none of: {', '.join(missing)}"


def test_every_module_the_tree_names_exists() -> None:
    stale = []
    for folder, names in named_in_tree().items():
        here = REPO / folder
        for name in names:
            if name.endswith(".py") and not any(here.rglob(name)):
                stale.append(folder + name)
    assert stale == [], f"ARCHITECTURE.md's tree names what is not there: {', '.join(stale)}"


def test_a_module_left_out_is_found() -> None:
    named = named_in_tree()
    assert not is_named(Path("orchestrator/contract/nowhere.py"), named)
    assert is_named(Path("orchestrator/contract/spec.py"), named)
    # a cluster package's shared files, named once by its parent's lines
    assert is_named(Path("orchestrator/executors/slurm/submit.py"), named)
    # a module its package's README names
    assert is_named(Path("trainer_entry/models/custom.py"), named)
    assert not is_named(Path("trainer_entry/models/nowhere.py"), named)
