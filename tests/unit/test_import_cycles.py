"""No circle of imports in the orchestrator or the training child: every import counts, at the top of a module,
inside a function or under ``TYPE_CHECKING``.

The stages' order between packages is import-linter's layers contract
(pyproject.toml); this finds circles within a package too, from the source alone.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _modules(package: str, repo: Path = REPO) -> dict[str, Path]:
    found = {}
    for path in (repo / package).rglob("*.py"):
        parts = list(path.relative_to(repo).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _imported(name: str, path: Path, known: dict[str, Path]) -> Iterator[str]:
    """The project modules ``name`` imports, wherever in it the import is."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            # "from pkg import mod" imports the module pkg.mod; "from mod import name", mod
            targets = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                for alias in node.names
            ]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            # a module importing its own parent package is how Python loads it, not a circle
            if target and target != name and not name.startswith(target + "."):
                yield target


def _circles(package: str, repo: Path = REPO) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan)."""
    known = _modules(package, repo)
    edges = {name: sorted(set(_imported(name, path, known))) for name, path in known.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                circles.append(sorted(group))

    for name in sorted(known):
        if name not in index:
            visit(name)
    return circles


def test_the_finder_sees_a_circle(tmp_path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from pkg.b import g\n")
    (pkg / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import f\n"
    )
    (pkg / "c.py").write_text("from pkg import a\n")
    # a circle through an import inside a function and a type-only relative import
    assert _circles("pkg", tmp_path) == [["pkg.a", "pkg.b"]]
    (pkg / "b.py").write_text("import os\n")
    assert _circles("pkg", tmp_path) == []


def test_no_circle_in_the_orchestrator_or_the_child() -> None:
    assert len(_modules("orchestrator")) > 100 and len(_modules("trainer_entry")) > 40
    assert _circles("orchestrator") == []
    assert _circles("trainer_entry") == []
