"""An interpreter that cannot import some packages, for tests of what a user
without them gets: a ``sitecustomize`` that refuses them, put first on PYTHONPATH."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def pythonpath_hiding(folder: Path, *packages: str) -> str:
    """A PYTHONPATH (the blocker, then the checkout) under which ``packages`` are absent."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(
        "import sys\n"
        "class _Hide:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        f"        if name.split('.')[0] in {tuple(packages)!r}:\n"
        "            raise ModuleNotFoundError(name)\n"
        "sys.meta_path.insert(0, _Hide())\n"
    )
    return f"{folder}{os.pathsep}{REPO}"
