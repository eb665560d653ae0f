"""No module name repeats, but in the two patterns ARCHITECTURE.md names."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
#: the cluster executors' packages have the same files, one per part an executor plugs in
EXECUTOR_PACKAGES = ("orchestrator/executors/slurm", "orchestrator/executors/raycluster")


def _modules() -> dict[str, list[str]]:
    found: dict[str, list[str]] = defaultdict(list)
    for package in ("orchestrator", "trainer_entry"):
        for path in sorted((REPO / package).rglob("*.py")):
            relative = path.relative_to(REPO).as_posix()
            if path.stem in ("__init__", "__main__") or "/assets/" in relative:
                continue
            found[path.name].append(relative)
    return found


def _allowed(paths: list[str]) -> bool:
    """A command's module beside the engine of the same name, or the executor packages'
    shared file set."""
    rest = [p for p in paths if not p.startswith("orchestrator/cli/")]
    if len(rest) == 1 and len(paths) == 2:
        return True
    outside = [p for p in rest if not p.startswith(EXECUTOR_PACKAGES)]
    return len(outside) <= 1


def test_no_module_name_repeats_outside_the_two_patterns() -> None:
    repeated = {name: paths for name, paths in _modules().items() if len(paths) > 1}
    assert repeated  # the patterns are in use: the check sees the tree
    assert {name: paths for name, paths in repeated.items() if not _allowed(paths)} == {}


def test_the_rule_refuses_a_repeat() -> None:
    assert not _allowed(["orchestrator/results/steady.py", "orchestrator/contract/steady.py"])
    assert not _allowed(["trainer_entry/data/load.py", "trainer_entry/models/load.py"])
    assert _allowed(["orchestrator/cli/report.py", "orchestrator/results/report.py"])
    assert _allowed(
        [
            "orchestrator/cli/doctor.py",
            "orchestrator/doctor.py",
            "orchestrator/executors/slurm/doctor.py",
            "orchestrator/executors/raycluster/doctor.py",
        ]
    )
