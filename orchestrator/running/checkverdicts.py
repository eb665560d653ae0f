"""The check's verdicts, kept: a rerun on the same stack does not pay for the check again.

The check before launch (``orchestrator.running.stackcheck``) imports the
training stack and builds each cell's trainer configuration: 6 s for the
shipped CPU matrix here, 17-22 s per run on a GPU machine. What it finds for a
cell depends on nothing but:

- the interpreter and every package installed where it looks (names and
  versions, as ``importlib.metadata`` lists them there, with its ``sys.path``);
- tunematrix's own code the check runs (``trainer_entry``, ``orchestrator/contract``);
- the cell's settings (its spec, without the run's id, repeat and position);
- the files and folders those settings name (a dataset, a local model, a
  ``config.json``): whether each exists, its size and modification time;
- the variables the check runs with that the libraries read (the hub's, CUDA's,
  Python's path), the working folder, and this machine's GPUs (how many, which,
  their driver: a setting such as ``bf16`` is refused on a GPU without it).

A verdict is kept in the user's cache (``checks/`` under ``cache_root``) under a
key of all of these, and is used only where every part is the same again. Only
a cell that passed is kept, and only where its model was found without the
network (shipped, an architecture, a function, a local folder): a model on the
hub, or in the hub's cache, is asked after again. ``--recheck`` asks for all.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import subprocess
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.contract.layout import PROJECT_ROOT, cache_root, write_atomic
from orchestrator.job.hardware import gpu_count
from orchestrator.matrix.experiment import Experiment
from orchestrator.running.envinfo import nvml_gpus

#: where a model was found that no network or hub cache decided (``Resolved.where``)
OFFLINE_WHERE = ("shipped", "architecture", "function", "local folder")
#: the variables of the check's environment a verdict depends on (by prefix)
ENV_PREFIXES = (
    "HF_",
    "HUGGINGFACE_",
    "TRANSFORMERS_",
    "CUDA_",
    "PYTHON",
    "TORCH",
    "PYTORCH_",
    "ACCELERATE_",
    "LD_LIBRARY_PATH",
)
#: the spec's fields that differ between runs of one cell and change no verdict
_PER_RUN = ("experiment_id", "repeat", "position")
#: tunematrix's code the check runs, under the project root
_CHECKED_CODE = ("trainer_entry", "orchestrator/contract")
#: kept verdicts per stack, at most (the oldest go first)
MAX_KEPT = 5000
#: the files of a named folder stat'd, at most (a local model's are a few)
_MAX_INNER = 200
#: the interpreter's packages and path, without importing any of them
_PROBE = """\
import importlib.metadata as m, json, os, sys
dists = sorted({(d.metadata["Name"] or "", d.version or "") for d in m.distributions()})
print(json.dumps({"executable": os.path.realpath(sys.executable), "version": sys.version,
                  "path": sys.path, "dists": dists}))
"""


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


def _stat(path: Path) -> list[Any] | None:
    try:
        st = path.stat()
    except (OSError, ValueError):
        return None
    return [st.st_mtime_ns, st.st_size, path.is_dir()]


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _strings(item)


def named_paths(spec: Mapping[str, Any]) -> dict[str, list[Any] | None]:
    """Every string of ``spec`` read as a path (``config:<path>`` too), with its stat; a
    folder's files with it (a local model: its config, its code), and where a
    ``python:`` model's package is found (what the check finds, without importing it)."""
    out: dict[str, list[Any] | None] = {}
    for text in _strings(spec):
        if not text or len(text) > 4096 or "\0" in text or "\n" in text:
            continue
        path = Path(text.removeprefix("config:")).expanduser()
        found = _stat(path)
        out[text] = found
        model_folder = (
            found is not None
            and found[2]
            and any((path / name).is_file() for name in ("config.json", "adapter_config.json"))
        )
        if model_folder:
            try:
                with os.scandir(path) as entries:
                    inner = sorted(e.name for e in itertools.islice(entries, _MAX_INNER))
            except OSError:
                inner = []
            for name in inner:
                out[f"{text}/{name}"] = _stat(path / name)
    model = str(spec.get("model_name_or_path") or "")
    if model.startswith("python:"):
        out[model] = _package_stat(model, spec.get("python_path") or [])
    return out


def _package_stat(model: str, python_path: Iterable[str]) -> list[Any] | None:
    """Where ``python:<package>…`` would be found (the check's ``find_spec``, on
    ``python_path`` then the working folder), with its stat; None where nowhere."""
    top = model.removeprefix("python:").split(":", 1)[0].split(".", 1)[0]
    for folder in [*python_path, os.getcwd()]:
        for candidate in (Path(folder) / top / "__init__.py", Path(folder) / f"{top}.py"):
            found = _stat(candidate)
            if found is not None:
                return [str(candidate), *found]
    return None


def code_fingerprint(root: Path = PROJECT_ROOT) -> str:
    """The code the check runs, by each file's path, size and modification time."""
    files = []
    for part in _CHECKED_CODE:
        for path in sorted((root / part).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                st = path.stat()
                files.append((str(path.relative_to(root)), st.st_size, st.st_mtime_ns))
    return _digest(files)


def stack_fingerprint(python: str, env: Mapping[str, str]) -> dict[str, Any] | None:
    """The interpreter's packages and path as the check would see them (run there, nothing
    imported); None when it cannot say (then nothing is kept)."""
    try:
        proc = subprocess.run(
            [python, "-c", _PROBE], env=dict(env), capture_output=True, text=True, timeout=60
        )
        found = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return None
    return found if isinstance(found, dict) else None


@dataclass
class StackVerdicts:
    """The kept verdicts of one interpreter and environment (one group of the check)."""

    path: Path
    #: what the verdicts depend on besides each cell: the stack, the code, the environment
    context: str
    versions: dict[str, Any] = field(default_factory=dict)
    cells: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: cell id -> its key, each worked out once (its files stat'd once) per check
    _keys: dict[str, str] = field(default_factory=dict)

    def cell_key(self, experiment: Experiment) -> str:
        key = self._keys.get(experiment.cell_id)
        if key is None:
            spec = {k: v for k, v in experiment.spec().items() if k not in _PER_RUN}
            key = self._keys[experiment.cell_id] = _digest([self.context, spec, named_paths(spec)])
        return key

    def found(self, cells: Iterable[Experiment]) -> dict[str, dict[str, Any]]:
        """Cell id -> the kept verdict, for each of ``cells`` that has one."""
        out = {}
        for e in cells:
            verdict = self.cells.get(self.cell_key(e))
            if verdict is not None:
                out[e.cell_id] = verdict
        return out

    def keep(
        self,
        cells: Iterable[Experiment],
        answer: Mapping[str, Any],
        failed: set[str],
        refusals: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
    ) -> None:
        """Keep the verdict of each of ``cells`` the ``answer`` passed (``failed``: the cell
        ids with a problem) whose model was found without the network; then save.
        ``refusals``: the problems of failed cells that are kept too (the child's own
        findings about a cell, which the same stack, code, settings and files find again);
        a failed cell without any is asked again."""
        models: Mapping[str, Mapping[str, Any]] = answer.get("models") or {}
        memory: Mapping[str, Any] = answer.get("memory") or {}
        unbuilt = set(answer.get("unbuilt_cells") or [])
        now = time.time()
        for e in cells:
            found = models.get(e.model_name_or_path)
            refused = (refusals or {}).get(e.cell_id)
            if found is None or (e.cell_id in failed and not refused):
                continue
            if found.get("kind", found.get("where")) not in OFFLINE_WHERE:
                continue
            if found.get("offline"):
                continue
            key = self.cell_key(e)
            predicted = memory.get(e.cell_id)
            if predicted is None or predicted.get("retry"):  # not reached: asked again
                predicted = self.cells.get(key, {}).get("memory")
            self.cells[key] = {
                "model": e.model_name_or_path,
                "found": dict(found),
                "built": e.cell_id not in unbuilt,
                "kept_at": now,
                # its predicted memory, where it was ever asked for (the same key decides it)
                **({"memory": predicted} if predicted is not None and not refused else {}),
                **({"problems": [dict(p) for p in refused]} if refused else {}),
            }
        if answer.get("versions"):
            self.versions = dict(answer["versions"])
        newest = sorted(self.cells.items(), key=lambda kv: kv[1].get("kept_at", 0))[-MAX_KEPT:]
        self.cells = dict(newest)
        try:
            write_atomic(
                self.path, json.dumps({"versions": self.versions, "cells": self.cells}, indent=1)
            )
        except OSError:
            pass  # a cache that cannot be written costs the next run a check, nothing else


def environment_part(env: Mapping[str, str]) -> dict[str, str]:
    """What of the check's environment a verdict depends on."""
    return {k: v for k, v in sorted(env.items()) if k.startswith(ENV_PREFIXES)}


def open_verdicts(
    python: str, env: Mapping[str, str], root: Path | None = None
) -> StackVerdicts | None:
    """The kept verdicts for ``python`` run with ``env``; None where the stack cannot be
    fingerprinted (nothing is kept then)."""
    stack = stack_fingerprint(python, env)
    if stack is None:
        return None
    nvml = nvml_gpus()
    context = _digest(
        {
            "stack": stack,
            "code": code_fingerprint(),
            "env": environment_part(env),
            "cwd": os.getcwd(),
            "gpus": gpu_count(),
            "gpu_names": [d.get("name") for d in nvml.get("devices", [])],
            "driver": [nvml.get("driver"), nvml.get("cuda_driver")],
        }
    )
    path = (root or cache_root() / "checks") / f"{context[:32]}.json"
    verdicts = StackVerdicts(path=path, context=context)
    try:
        saved = json.loads(path.read_text())
        verdicts.versions = dict(saved.get("versions") or {})
        verdicts.cells = dict(saved.get("cells") or {})
    except (OSError, ValueError, AttributeError, TypeError):
        pass  # none kept yet, or unreadable: checked afresh and kept again
    return verdicts
