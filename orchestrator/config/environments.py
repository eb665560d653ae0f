"""Environments: the Python interpreters a matrix runs under (``environments:``).

An entry names a venv's interpreter (``python: PATH``, relative to the
scenarios file's folder, ``~`` expanded) or a tox env of the project
(``tox: NAME``: ``<project>/.tox/NAME/bin/python``). Before anything runs,
each interpreter is asked once, in a process of its own and without importing
the training stack, which versions of the stack it has (``probe``); a missing
interpreter, one that cannot run the child, or one without the training stack
is one line naming the entry. The versions go into the experiment ids, the
rows and ``env.json``.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.config.values import canonical_json, check_name, check_unique
from orchestrator.config.yamlio import Loc, YamlDoc
from orchestrator.contract.applicability import TRAIN_STACK
from orchestrator.contract.errors import ConfigError
from orchestrator.contract.layout import PROJECT_ROOT, project_pythonpath

#: what the child cannot train without
REQUIRED = TRAIN_STACK
#: the training stack whose versions an environment records, in this order (deepspeed
#: and bitsandbytes: what DeepSpeed and qlora cells need, checked before launch)
STACK = (
    "torch",
    "transformers",
    "accelerate",
    "trl",
    "peft",
    "datasets",
    "deepspeed",
    "bitsandbytes",
)
#: what the child's own contract needs besides the stack
CONTRACT = ("pydantic",)
PROBE_TIMEOUT_S = 120.0

# Run by the environment's interpreter: versions from the packages' metadata (nothing of
# the stack is imported), and the child's package and its contract, found and loaded the
# way a job finds them (the project first on PYTHONPATH).
_PROBE = """\
import importlib.metadata as m, importlib.util as u, json, platform, sys
out = {"python": platform.python_version(), "executable": sys.executable, "versions": {}}
for name in sys.argv[1:]:
    try:
        out["versions"][name] = m.version(name)
    except m.PackageNotFoundError:
        out["versions"][name] = None
out["child"] = u.find_spec("trainer_entry") is not None
try:
    import orchestrator.contract.spec
    out["contract"] = None
except Exception as exc:
    out["contract"] = f"{type(exc).__name__}: {exc}"
print(json.dumps(out))
"""


@dataclass(frozen=True)
class EnvironmentEntry:
    """One entry of ``environments:`` as written, its interpreter's path resolved."""

    name: str
    #: the interpreter (absolute; links are not followed: a venv's python is a link)
    python: Path
    #: the tox env it names, if it names one
    tox: str | None
    file: str
    line: int | None
    key: str

    def error(self, message: str) -> ConfigError:
        """``<file>:<line>: environments[i]: environment 'NAME': <message>``."""
        return ConfigError(
            f"environment '{self.name}': {message}", file=self.file, line=self.line, key=self.key
        )


@dataclass(frozen=True)
class Environment:
    """An environment resolved at plan time: its interpreter and the versions it has."""

    name: str
    python: str
    #: ``python`` and each package of ``STACK`` -> its version (None: not installed)
    versions: Mapping[str, str | None]
    tox: str | None = None

    @property
    def digest(self) -> str:
        """What experiment ids hash for the environment: its name and its versions."""
        return canonical_json({"name": self.name, "versions": dict(self.versions)})

    def label(self) -> str:
        """``python 3.11.9, torch 2.13.0, …``: every version it has, in ``STACK`` order."""
        return versions_text(self.versions)

    def record(self) -> dict[str, Any]:
        """Its entry in ``env.json``."""
        return {
            "name": self.name,
            "python": self.python,
            "tox": self.tox,
            "versions": dict(self.versions),
        }


def versions_text(versions: Mapping[str, Any]) -> str:
    """``python 3.11.9, torch 2.13.0, …`` (missing packages left out)."""
    order = ("python", *STACK)
    names = [*order, *sorted(k for k in versions if k not in order)]
    return ", ".join(f"{n} {versions[n]}" for n in names if versions.get(n))


def tox_python(name: str, root: Path = PROJECT_ROOT) -> Path:
    """The interpreter of the project's tox env ``name``."""
    return root / ".tox" / name / "bin" / "python"


def load_environments(doc: YamlDoc, models: Sequence[Any]) -> tuple[EnvironmentEntry, ...]:
    """The ``environments:`` entries, checked: a name each (safe in ids and folder names,
    unique) and exactly one of ``python`` and ``tox``. Nothing is run here."""
    if not models:
        raise doc.error(
            "empty list; name at least one environment or remove the key", ("environments",)
        )
    base = Path(doc.file).parent
    for i, model in enumerate(models):
        problem = check_name(model.name, "environment name")
        if problem:
            raise doc.error(problem, ("environments", i, "name"))
    check_unique(doc, [m.name for m in models], ("environments",), "environment", key="name")
    out: list[EnvironmentEntry] = []
    for i, model in enumerate(models):
        loc: Loc = ("environments", i)
        if (model.python is None) == (model.tox is None):
            raise doc.error(
                f"environment '{model.name}': give exactly one of python: (an interpreter, "
                "such as a venv's bin/python) and tox: (a tox env of the project)",
                loc,
            )
        if model.tox is not None:
            problem = check_name(model.tox, "tox env name")
            if problem:
                raise doc.error(problem, (*loc, "tox"))
            python = tox_python(model.tox)
        else:
            python = Path(os.path.expanduser(model.python))
            if not python.is_absolute():
                python = base / python
            python = Path(os.path.abspath(python))
        out.append(
            EnvironmentEntry(
                name=model.name,
                python=python,
                tox=model.tox,
                file=doc.file,
                line=doc.line_of(loc),
                key=f"environments[{i}]",
            )
        )
    return tuple(out)


def probe_output(python: Path) -> dict[str, Any]:
    """What ``python`` reports (``_PROBE``), run with the project first on PYTHONPATH as a
    job runs; a ``RuntimeError`` saying why when it cannot run or reports nothing.

    Not kept: a plan probes each environment once, and its run uses the plan's
    ``environments``."""
    env = {**os.environ, "PYTHONPATH": project_pythonpath()}
    try:
        proc = subprocess.run(
            [str(python), "-c", _PROBE, *STACK, *CONTRACT],
            capture_output=True,
            text=True,
            env=env,
            timeout=PROBE_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"did not answer in {PROBE_TIMEOUT_S:.0f} s") from None
    except OSError as exc:
        raise RuntimeError(f"cannot be run ({exc.strerror or exc})") from None
    lines = proc.stdout.strip().splitlines()
    try:
        found = json.loads(lines[-1]) if lines else None
    except ValueError:
        found = None
    if proc.returncode != 0 or not isinstance(found, dict):
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"failed to report its versions (exit {proc.returncode}: {last})")
    return found


def resolve(entry: EnvironmentEntry) -> Environment:
    """Probe one entry; every problem is one ``ConfigError`` line naming it."""
    python = entry.python
    if not python.exists():
        if entry.tox is not None:
            raise entry.error(
                f"tox env '{entry.tox}' does not exist yet ({python} is missing); create it "
                f"with `tox -e {entry.tox} --notest` in {PROJECT_ROOT}"
            )
        raise entry.error(f"{python} does not exist")
    if python.is_dir() or not os.access(python, os.X_OK):
        raise entry.error(f"{python} is not an executable file")
    try:
        found = probe_output(python)
    except RuntimeError as exc:
        raise entry.error(f"{python} {exc}") from None
    reported = found.get("versions") or {}
    missing = [name for name in REQUIRED if not reported.get(name)]
    if missing:
        raise entry.error(
            f"{python} has no {', '.join(missing)} (the training stack needs {', '.join(REQUIRED)})"
        )
    if found.get("contract") or not found.get("child"):
        why = found.get("contract") or "trainer_entry is not found"
        raise entry.error(
            f"{python} cannot load the training child with {PROJECT_ROOT} on PYTHONPATH ({why})"
        )
    versions: dict[str, str | None] = {"python": str(found.get("python"))}
    versions.update((name, reported.get(name)) for name in STACK)
    return Environment(name=entry.name, python=str(python), versions=versions, tox=entry.tox)


def resolve_all(entries: Sequence[EnvironmentEntry]) -> tuple[Environment, ...]:
    """Every entry probed, in file order (the first problem stops)."""
    return tuple(resolve(entry) for entry in entries)


def differing(versions: Sequence[Mapping[str, Any]]) -> list[str]:
    """The names (``python`` and the stack, in that order) whose versions are not the same
    in all of ``versions``."""
    order = ("python", *STACK)
    names = [*order, *sorted({k for v in versions for k in v} - set(order))]
    return [n for n in names if len({v.get(n) for v in versions}) > 1]


def short_labels(versions: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    """Per environment name, its versions of only the packages that differ between them
    (``torch 2.12.0, transformers 5.22.0``); ``same versions`` where none differ."""
    names = differing(list(versions.values()))
    return {
        env: ", ".join(f"{n} {v.get(n) or 'not installed'}" for n in names) or "same versions"
        for env, v in versions.items()
    }


def drift(planned: Mapping[str, Any], ran: Mapping[str, Any]) -> list[str]:
    """The packages whose version the run reported differs from the plan's probe
    (``peft 0.20.0 planned, 0.21.0 ran``): only names both record with a version."""
    out = []
    for name, version in planned.items():
        other = ran.get(name)
        if version and other and str(version) != str(other):
            out.append(f"{name} {version} planned, {other} ran")
    return out
