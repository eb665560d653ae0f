"""The test suite's own scheduling (tests/conftest.py): under ``--dist loadgroup`` the
system tests (``cluster``, ``faults``) share one worker, so no two of them use the
machine's daemons, cgroups and namespaces at once, and a test file stays on one worker."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]

_CONFTEST = f"""
import importlib.util
import sys

sys.path.insert(0, {str(TESTS)!r})
_spec = importlib.util.spec_from_file_location("suite_conftest", {str(TESTS / "conftest.py")!r})
_suite = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_suite)
pytest_collection_modifyitems = _suite.pytest_collection_modifyitems  # the suite's own hook
"""

_TESTS = """
import os, pytest

def _record(name):
    with open(os.environ["WHERE"], "a") as f:
        f.write(f"{{name}} {{os.environ['PYTEST_XDIST_WORKER']}}\\n")

@pytest.mark.parametrize("n", range(6))
@pytest.mark.{mark}
def test_system(n):
    _record(f"{file}-system-{{n}}")

@pytest.mark.parametrize("n", range(6))
def test_plain(n):
    _record(f"{file}-plain-{{n}}")
"""


def test_the_system_tests_share_one_worker_and_a_file_stays_on_one(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(_CONFTEST)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    cluster\n    faults\n")
    for file, mark in (("a", "cluster"), ("b", "faults"), ("c", "faults")):
        (tmp_path / f"test_{file}.py").write_text(_TESTS.format(mark=mark, file=file))
    where = tmp_path / "where.txt"
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "3"),
            *("--dist", "loadgroup", "--no-loadscope-reorder", str(tmp_path)),
        ],
        cwd=tmp_path,
        env={**os.environ, "WHERE": str(where)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    ran = dict(line.split() for line in where.read_text().splitlines())
    assert len(ran) == 36
    system = {worker for name, worker in ran.items() if "-system-" in name}
    assert len(system) == 1, ran
    for file in "abc":
        plain = {worker for name, worker in ran.items() if name.startswith(f"{file}-plain-")}
        assert len(plain) == 1, ran
