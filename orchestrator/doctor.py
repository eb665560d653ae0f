"""``tunematrix doctor``: what this machine has for running matrices, and what to install.

Everything is looked up and nothing is changed: packages by ``find_spec`` (as
``orchestrator.running.needs`` does before a run) and their metadata, never imported,
so the training stack is not loaded; GPUs through NVML or the driver's
``/proc`` entries (``orchestrator.running.envinfo``, ``orchestrator.job.hardware``);
each executor looks for what it needs itself (``Executor.probe``, quick and
read-only) and says what it found (``Executor.readiness``).

``gather`` does the looking; ``diagnose`` turns the facts into rows and a
verdict and is pure, so tests can hand it any machine.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml

from orchestrator._version import __version__
from orchestrator.contract.layout import PROJECT_ROOT, free_bytes, nearest_existing
from orchestrator.contract.modelnames import hub_offline
from orchestrator.executors.base import State
from orchestrator.executors.registry import EXECUTORS
from orchestrator.job import energy, hardware
from orchestrator.running import envinfo, needs

#: below this much free space in the results folder's file system, a warning
LOW_DISK_GIB = 10.0
GIB = 1024**3
#: extras of tunematrix's own development, not looked up
_DEV_EXTRAS = ("test", "lint")

#: import names of the distributions whose names differ from them
_MODULES = {"nvidia-ml-py": "pynvml", "pyyaml": "yaml"}
#: optional packages a scenario may need, with what needs them
_OPTIONAL = {
    "bitsandbytes": ("qlora scenarios", needs.QLORA_INSTALL),
    "deepspeed": ("DeepSpeed scenarios", needs.DEEPSPEED_INSTALL),
}
#: how a row that is not a package's starts its line
_LABELS = {
    n: f"{n}:" for n in ("NVML", "GPUs", "energy", "accelerate default config", "results", "env")
}
#: environment variables worth seeing next to the rest
_ENV_SHOWN = ("CUDA_VISIBLE_DEVICES", "HF_HOME", "HF_HUB_OFFLINE", "TUNEMATRIX_CACHE")


# ---------------------------------------------------------------------------
# Facts: what gather finds, what diagnose reads
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Requirement:
    """One requirement tunematrix declares (pyproject.toml)."""

    name: str
    #: e.g. ">=2.4"; empty for any version
    specifier: str
    #: the extra it belongs to (train, ...); None for the core
    extra: str | None


@dataclass(frozen=True)
class Installed:
    #: from the distribution's metadata; None where it has none
    version: str | None
    #: whether this interpreter (and so every job) can import it
    importable: bool


@dataclass(frozen=True)
class AccelerateFacts:
    #: the file ``accelerate launch`` reads when given no ``--config_file``
    default: Path
    #: its distributed_type, num_processes, mixed_precision; None where there is no file
    fields: Mapping[str, Any] | None
    #: why it could not be read
    error: str | None
    #: the config a job gets with ``--config_file`` when its framework names none
    project: Path | None
    #: why that is unknown (the scenarios file does not load)
    project_error: str | None = None


@dataclass(frozen=True)
class DiskFacts:
    #: the results folder, absolute
    results: Path
    #: it, or its nearest parent that exists
    existing: Path
    free_bytes: int | None
    #: whether this user may create files in ``existing``
    writable: bool
    #: whether ``existing`` is a folder (not a file in the way)
    folder: bool = True


@dataclass(frozen=True)
class Facts:
    python: str
    executable: str
    requires_python: str | None
    #: by normalised distribution name; empty where tunematrix's declaration is not found
    requirements: Mapping[str, Requirement]
    #: by distribution name
    packages: Mapping[str, Installed]
    #: torch's metadata asks for nvidia-* packages (a CUDA build from PyPI)
    torch_needs_nvidia: bool
    #: ``envinfo.nvml_gpus()``
    nvml: Mapping[str, Any]
    #: ``hardware.proc_gpus()``: models and driver from /proc, without NVML
    proc_gpus: Sequence[str]
    proc_driver: str | None
    #: ``CUDA_VISIBLE_DEVICES`` entries; None where unset
    visible: Sequence[str] | None
    accelerate: AccelerateFacts
    disk: DiskFacts
    env: Mapping[str, str]
    #: what each executor's ``probe`` found, by executor name (where it looks at anything)
    executors: Mapping[str, Any] = field(default_factory=dict)
    #: the CPU packages' RAPL counters readable here, and why none where none
    #: (``energy.rapl_zones``: a CPU cell's energy)
    rapl: tuple[int, str] = (0, "not looked at")


# ---------------------------------------------------------------------------
# Gathering (reads only)
# ---------------------------------------------------------------------------


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


_REQ = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*([^;]*)(?:;(.*))?$")
_EXTRA = re.compile(r"extra\s*==\s*['\"]([^'\"]+)['\"]")


def parse_requirement(text: str, extra: str | None = None) -> Requirement | None:
    """``torch>=2.4; extra == "train"`` -> Requirement("torch", ">=2.4", "train")."""
    found = _REQ.match(text)
    if found is None:
        return None
    marker = _EXTRA.search(found.group(3) or "")
    return Requirement(found.group(1), found.group(2).strip(), marker.group(1) if marker else extra)


def declared() -> tuple[str | None, dict[str, Requirement]]:
    """``requires-python`` and the requirements of tunematrix, by normalised name.

    In a checkout, pyproject.toml itself (installed metadata can lag behind
    it); otherwise the installed distribution's metadata.
    """
    reqs: list[Requirement | None] = []
    python: str | None = None
    pyproject = PROJECT_ROOT / "pyproject.toml"
    project: dict[str, Any] | None = None
    if sys.version_info >= (3, 11) and pyproject.is_file():
        import tomllib

        try:
            project = tomllib.loads(pyproject.read_text()).get("project")
        except (OSError, ValueError):
            project = None
    if isinstance(project, dict) and project.get("name") == "tunematrix":
        python = project.get("requires-python")
        reqs += [parse_requirement(r) for r in project.get("dependencies", [])]
        for extra, items in (project.get("optional-dependencies") or {}).items():
            reqs += [parse_requirement(r, extra) for r in items]
    else:
        with suppress(metadata.PackageNotFoundError):
            python = metadata.metadata("tunematrix")["Requires-Python"]
            reqs += [parse_requirement(r) for r in metadata.requires("tunematrix") or []]
    return python, {_normalise(r.name): r for r in reqs if r is not None}


def _installed(dist: str, find: Callable[[str], Any]) -> Installed:
    module = _MODULES.get(_normalise(dist), dist)
    absent = needs.missing([needs.Need(module, "", "")], find)
    return Installed(envinfo.version(dist), importable=not absent)


def accelerate_default_config(env: Mapping[str, str]) -> Path:
    """The config file ``accelerate launch`` reads when it is given no ``--config_file``.

    accelerate's own rule, replicated because importing accelerate imports
    torch (``accelerate.commands.config.config_args``, accelerate 1.x):
    ``$HF_HOME``, else ``$XDG_CACHE_HOME/huggingface``, else
    ``~/.cache/huggingface``; then ``accelerate/default_config.yaml``.
    ``accelerate launch`` reads it only without ``--config_file``
    (``accelerate.commands.launch._validate_launch_command``).
    """
    home = env.get("HF_HOME", os.path.join(env.get("XDG_CACHE_HOME", "~/.cache"), "huggingface"))
    return Path(os.path.expanduser(home)) / "accelerate" / "default_config.yaml"


def _accelerate(
    env: Mapping[str, str], project: Path | None, project_error: str | None
) -> AccelerateFacts:
    path = accelerate_default_config(env)
    fields: dict[str, Any] | None = None
    error = None
    if path.is_file():
        try:
            doc = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError) as exc:
            doc, error = None, f"unreadable ({type(exc).__name__})"
        if isinstance(doc, dict):
            keys = ("distributed_type", "num_processes", "mixed_precision")
            fields = {k: doc[k] for k in keys if k in doc}
        elif error is None:
            error = "not a YAML mapping"
    return AccelerateFacts(path, fields, error, project, project_error)


def _disk(results: Path) -> DiskFacts:
    path = results.absolute()
    existing = nearest_existing(path)
    free = free_bytes(existing)
    folder = existing.is_dir()
    writable = folder and os.access(existing, os.W_OK | os.X_OK)
    return DiskFacts(path, existing, free, writable, folder)


def gather(
    results: Path,
    project_accelerate: Path | None,
    project_error: str | None = None,
    *,
    env: Mapping[str, str] | None = None,
    find: Callable[[str], Any] = importlib.util.find_spec,
) -> Facts:
    """Look at this machine. Reads files and metadata, lets each executor look; writes nothing.

    ``project_accelerate`` is the accelerate config jobs get when their framework
    names none (``project_error`` says why it is unknown).
    """
    env = dict(os.environ if env is None else env)
    requires_python, requirements = declared()
    dists = {r.name for r in requirements.values() if r.extra not in _DEV_EXTRAS}
    dists |= {*needs.TRAIN_STACK, "datasets", "nvidia-ml-py", *_OPTIONAL}
    dists |= {need.module for cls in EXECUTORS.values() for need in cls.needs}
    torch_requires = metadata.requires("torch") if envinfo.version("torch") else None
    proc_names, proc_driver = hardware.proc_gpus()
    return Facts(
        python=sys.version.split()[0],
        executable=sys.executable,
        requires_python=requires_python,
        requirements=requirements,
        packages={d: _installed(d, find) for d in sorted(dists)},
        torch_needs_nvidia=any(r.startswith("nvidia-") for r in torch_requires or []),
        nvml=envinfo.nvml_gpus(),
        proc_gpus=proc_names,
        proc_driver=proc_driver,
        visible=hardware.visible_devices(env),
        accelerate=_accelerate(env, project_accelerate, project_error),
        disk=_disk(results),
        env={k: env[k] for k in _ENV_SHOWN if k in env},
        executors={
            name: found for name, cls in EXECUTORS.items() if (found := cls.probe()) is not None
        },
        rapl=_rapl(),
    )


def _rapl() -> tuple[int, str]:
    zones, why = energy.rapl_zones()
    return len(zones), why


# ---------------------------------------------------------------------------
# Diagnosis (pure)
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    state: State
    #: what was checked: a package, "GPUs", an executor's title, ...
    name: str
    #: what was found
    detail: str = ""
    #: what to do about it
    fix: str = ""
    #: a miss or bad here stops the tiny CPU matrix (exit code 1)
    required: bool = False
    #: what the summary names as missing when this row blocks; default: the name
    lacks: tuple[str, ...] = ()
    #: how the line starts, where not with the name ("GPUs:")
    label: str | None = None

    def line(self) -> str:
        head = self.label if self.label is not None else _LABELS.get(self.name, self.name)
        text = " ".join(part for part in (head, self.detail) if part)
        return f"{self.state:<6}{text}" + (f" — {self.fix}" if self.fix else "")

    def as_dict(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "name": self.name,
            "detail": self.detail,
            "fix": self.fix,
            "required": self.required,
            "blocks": self.blocks,
        }

    @property
    def blocks(self) -> bool:
        return self.required and self.state in ("miss", "bad")


@dataclass(frozen=True)
class Diagnosis:
    rows: list[Row]
    ready: list[str]
    #: capability -> what it lacks
    missing: dict[str, list[str]]

    @property
    def exit_code(self) -> int:
        return 1 if any(row.blocks for row in self.rows) else 0


def satisfies(version: str, specifier: str) -> bool | None:
    """Whether a version meets a specifier; None where it cannot be told (no ``packaging``)."""
    if not specifier:
        return True
    try:
        from packaging.specifiers import InvalidSpecifier, SpecifierSet
        from packaging.version import InvalidVersion
    except ImportError:
        return None
    try:
        return SpecifierSet(specifier).contains(version, prereleases=True)
    except (InvalidSpecifier, InvalidVersion):
        return None


def _spec(facts: Facts, dist: str) -> str:
    req = facts.requirements.get(_normalise(dist))
    return req.specifier if req else ""


def _too_old(facts: Facts, dist: str) -> str | None:
    """The specifier an installed version fails, else None."""
    version = facts.packages[dist].version
    spec = _spec(facts, dist)
    if version is None or satisfies(version, spec) is not False:
        return None
    return spec


def _pip(facts: Facts, dist: str) -> str:
    return f"pip install '{dist}{_spec(facts, dist)}'"


def torch_build_label(version: str, needs_nvidia: bool) -> str:
    """``2.13.0+cpu`` -> ``2.13.0 (CPU build)``; ``2.6.0+cu124`` -> ``2.6.0 (CUDA 12.4 build)``."""
    build = envinfo.torch_build(version)
    base = version.split("+", 1)[0]
    if build == "cpu":
        return f"{base} (CPU build)"
    cuda = re.fullmatch(r"cu(\d+)(\d)", build or "")
    if cuda:
        return f"{base} (CUDA {cuda.group(1)}.{cuda.group(2)} build)"
    if build and build.startswith("rocm"):
        return f"{base} (ROCm {build.removeprefix('rocm')} build)"
    if build:
        return version
    return f"{version} (CUDA build)" if needs_nvidia else version


def _cpu_torch(facts: Facts) -> bool:
    version = facts.packages["torch"].version
    return version is not None and envinfo.torch_build(version) == "cpu"


def _gpus(facts: Facts) -> tuple[list[str], str | None, str | None, str]:
    """GPU names, driver, CUDA driver version, and where they were read."""
    devices = facts.nvml.get("devices")
    if devices:
        names = [str(d.get("name")) for d in devices]
        return names, facts.nvml.get("driver"), facts.nvml.get("cuda_driver"), "NVML"
    if facts.proc_gpus:
        return list(facts.proc_gpus), facts.proc_driver, None, "/proc/driver/nvidia"
    return [], None, None, ""


def gpu_count(facts: Facts) -> int:
    """GPUs a job could use: found, narrowed by CUDA_VISIBLE_DEVICES (as hardware.gpu_count)."""
    count = len(_gpus(facts)[0])
    if facts.visible is not None:
        count = min(count, len(facts.visible))
    return count


def _python_row(facts: Facts) -> Row:
    detail = f"{facts.python} ({facts.executable}; every job runs with it)"
    if facts.requires_python and satisfies(facts.python, facts.requires_python) is False:
        fix = f"tunematrix needs python {facts.requires_python}"
        return Row("bad", "python", detail, fix, required=True)
    return Row("ok", "python", detail, required=True)


def _core_row(facts: Facts) -> Row:
    core = [
        r.name for key, r in facts.requirements.items() if r.extra is None and key != "nvidia-ml-py"
    ]
    if not core:
        return Row("info", "tunematrix", f"{__version__}; its requirements were not found")
    absent = [d for d in core if not facts.packages[d].importable]
    old = [d for d in core if d not in absent and _too_old(facts, d)]
    if not absent and not old:
        return Row("ok", "tunematrix", f"{__version__} with {', '.join(core)}", required=True)
    found = [f"{d} not installed" for d in absent]
    found += [f"{d} {facts.packages[d].version} (needs {_spec(facts, d)})" for d in old]
    fix = "pip install " + " ".join(f"'{d}{_spec(facts, d)}'" for d in absent + old)
    state: State = "miss" if absent else "bad"
    detail = f"{__version__}: {'; '.join(found)}"
    return Row(state, "tunematrix", detail, fix, required=True, lacks=tuple(absent + old))


def _train_row(facts: Facts, dist: str, gpus: int) -> Row:
    got = facts.packages[dist]
    if not got.importable:
        return Row("miss", dist, "", f"for the training stack: {needs.TRAIN_INSTALL}", True)
    version = got.version or "(version unknown)"
    detail = torch_build_label(version, facts.torch_needs_nvidia) if dist == "torch" else version
    spec = _too_old(facts, dist)
    if spec is not None:
        return Row("bad", dist, f"{detail}, tunematrix needs {spec}", _pip(facts, dist), True)
    if dist == "torch" and gpus and _cpu_torch(facts):
        fix = "GPUs are here: install torch's CUDA build (pytorch.org/get-started)"
        return Row("warn", dist, detail, fix, True)
    return Row("ok", dist, detail, required=True)


def _package_row(facts: Facts, dist: str, absent: Row, old: State) -> Row:
    """A package beyond the training stack: ``absent`` where it is not installed, ``old``
    where its version fails tunematrix's requirement, else ok."""
    got = facts.packages[dist]
    if not got.importable:
        return absent
    spec = _too_old(facts, dist)
    if spec is not None:
        return Row(old, dist, f"{got.version}, tunematrix needs {spec}", _pip(facts, dist))
    return Row("ok", dist, got.version or "(version unknown)")


def _optional_row(facts: Facts, dist: str, what: str, install: str) -> Row:
    absent = Row("info", dist, f"not installed (needed for {what})", install)
    return _package_row(facts, dist, absent, "warn")


def _nvml_row(facts: Facts, gpus_found: bool) -> Row:
    got = facts.packages["nvidia-ml-py"]
    # without GPUs, NVML has nothing to do: its absence is no fault
    fault: State = "warn" if gpus_found else "info"
    if not got.importable:
        fix = f"{_pip(facts, 'nvidia-ml-py')} (GPU memory sampling reads NVML)"
        return Row(fault, "NVML", "nvidia-ml-py not installed", fix)
    package = f"nvidia-ml-py {got.version or '(version unknown)'}"
    if "nvml" in facts.nvml:
        return Row(fault, "NVML", f"{package}; {facts.nvml['nvml']}")
    spec = _too_old(facts, "nvidia-ml-py")
    if spec is not None:
        return Row(
            "warn", "NVML", f"{package}, tunematrix needs {spec}", _pip(facts, "nvidia-ml-py")
        )
    return Row("ok", "NVML", f"{package}; initialises")


def _energy_row(facts: Facts, gpus_found: bool) -> Row:
    """Where a cell's energy comes from here: the GPUs' NVML counter, or RAPL on the CPU."""
    if gpus_found:
        return Row(
            "info",
            "energy",
            "each GPU's NVML energy counter, else its power samples (a cell's energy_note "
            "says where a GPU gives neither)",
        )
    zones, why = facts.rapl
    if zones:
        return Row("ok", "energy", f"RAPL: {zones} CPU package(s) readable (CPU cells' energy)")
    return Row("info", "energy", f"CPU cells get no energy figure: {why}")


def _gpu_row(facts: Facts) -> Row:
    names, driver, cuda, source = _gpus(facts)
    if not names:
        return Row("info", "GPUs", "CPU matrices only (DEVICE=cpu)", label="no GPU:")
    if len(set(names)) == 1:
        detail = f"{len(names)} × {names[0]}"
        memory = [d.get("memory_bytes") for d in facts.nvml.get("devices") or []]
        if memory and all(isinstance(m, int) for m in memory) and len(set(memory)) == 1:
            detail += f" ({memory[0] / GIB:.0f} GiB)"
    else:
        detail = f"{len(names)}: {', '.join(names)}"
    if driver:
        detail += f", driver {driver}"
    if cuda:
        detail += f" (CUDA {cuda})"
    if source != "NVML":
        detail += f" (from {source})"
    count = gpu_count(facts)
    if facts.visible is not None and count < len(names):
        shown = ",".join(facts.visible)
        detail += f"; CUDA_VISIBLE_DEVICES={shown!r} leaves {count}"
        if count == 0:
            return Row("warn", "GPUs", detail, "unset CUDA_VISIBLE_DEVICES to use them")
    return Row("ok", "GPUs", detail)


def _accelerate_row(facts: Facts) -> Row:
    acc = facts.accelerate
    name = "accelerate default config"
    if acc.project_error is not None:
        state: State = "info" if acc.fields is None and acc.error is None else "warn"
        detail = "none" if state == "info" else f"{acc.default}"
        return Row(state, name, f"{detail}; which config jobs get is unknown: {acc.project_error}")
    where = (
        f"jobs get --config_file: their framework's, else {acc.project}"
        if acc.project is not None
        else None
    )
    if acc.fields is None and acc.error is None:
        if where:
            return Row("info", name, f"none ({where})")
        return Row(
            "info", name, "none (jobs whose framework names no config use accelerate's defaults)"
        )
    if acc.error is not None:
        state = "info" if where else "warn"
        return Row(state, name, f"{acc.default} {acc.error}", "" if where else "fix or remove it")
    shown = ", ".join(f"{k} {v}" for k, v in (acc.fields or {}).items()) or "no key fields"
    if where:
        return Row("info", name, f"{acc.default} ({shown}); not used: {where}")
    return Row(
        "warn", name, f"{acc.default} ({shown}); used by jobs whose framework names no config"
    )


def _executor_package_row(facts: Facts, need: needs.Need, present: bool) -> Row:
    """A package an executor needs: a miss only where the executor runs from this machine."""
    absent = Row("miss" if present else "info", need.module, "", f"for {need.why}: {need.install}")
    return _package_row(facts, need.module, absent, "bad")


def _executors(facts: Facts) -> tuple[list[Row], dict[str, list[str]]]:
    """Each executor's package rows and own row, and what each one lacks to be used here."""
    rows: list[Row] = []
    uses: dict[str, list[str]] = {}
    for name, cls in EXECUTORS.items():
        if name not in facts.executors:
            continue
        said = cls.readiness(facts.executors[name])
        if said is None:
            continue
        rows += [_executor_package_row(facts, need, said.present) for need in cls.needs]
        rows.append(Row(said.state, cls.title, said.detail, label=f"{cls.title}:"))
        absent = [need.module for need in cls.needs if not _ok(facts, need.module)]
        uses[cls.title] = absent + list(said.lacks)
    return rows, uses


def _disk_row(facts: Facts) -> Row:
    disk = facts.disk
    name = "results"
    lacks = ("a writable results folder",)
    if not disk.folder:
        if disk.existing == disk.results:
            return Row("bad", name, f"{disk.results} is not a folder", "", True, lacks)
        fix = f"{disk.existing} is a file"
        return Row("bad", name, f"{disk.results} cannot be made", fix, True, lacks)
    where = str(disk.results)
    if disk.existing != disk.results:
        where += f" (not there yet; {disk.existing} is)"
    if not disk.writable:
        fix = f"{disk.existing} is not writable by this user"
        return Row("bad", name, where, fix, True, lacks)
    if disk.free_bytes is None:
        return Row("warn", name, f"{where}; free space unknown")
    free = disk.free_bytes / GIB
    detail = f"{where}; {free:.1f} GiB free"
    if free < LOW_DISK_GIB:
        return Row(
            "warn", name, detail, f"under {LOW_DISK_GIB:g} GiB: logs and prepared data may not fit"
        )
    return Row("ok", name, detail)


def _env_row(facts: Facts) -> Row | None:
    if not facts.env:
        return None
    shown = ", ".join(f"{k}={v!r}" if not v else f"{k}={v}" for k, v in facts.env.items())
    offline = hub_offline(facts.env)
    return Row(
        "info", "env", shown, "hub models and datasets must be in the cache" if offline else ""
    )


def _ok(facts: Facts, dist: str) -> bool:
    return facts.packages[dist].importable


def diagnose(facts: Facts) -> Diagnosis:
    """Rows for every check, what the machine is ready for, and what each other use lacks."""
    gpus = gpu_count(facts)
    gpus_found = bool(_gpus(facts)[0])
    executor_rows, executor_uses = _executors(facts)
    rows: list[Row | None] = [
        _python_row(facts),
        _core_row(facts),
        *(_train_row(facts, d, gpus) for d in needs.TRAIN_STACK),
        _optional_row(facts, "datasets", "datasets named on the hub", _pip(facts, "datasets")),
        *(_optional_row(facts, d, what, install) for d, (what, install) in _OPTIONAL.items()),
        _nvml_row(facts, gpus_found),
        _gpu_row(facts),
        _energy_row(facts, gpus_found),
        _accelerate_row(facts),
        *executor_rows,
        _disk_row(facts),
        _env_row(facts),
    ]
    kept = [r for r in rows if r is not None]

    core = [what for r in kept if r.blocks for what in (r.lacks or (r.name,))]
    no_gpu = [] if gpus else ["no GPU"]
    if gpus and _cpu_torch(facts):
        no_gpu = ["torch's CUDA build"]
    # the count where they can run; where they cannot, what they lack says enough
    lacks_gpu = core + no_gpu
    gpu_matrices = f"GPU matrices ({gpus} GPU{'s' if gpus != 1 else ''})"
    gpu_matrices = "GPU matrices" if lacks_gpu else gpu_matrices
    uses = {
        "CPU matrices": core,
        gpu_matrices: lacks_gpu,
        **executor_uses,
        "qlora": core + no_gpu + ([] if _ok(facts, "bitsandbytes") else ["bitsandbytes"]),
        "DeepSpeed": core + no_gpu + ([] if _ok(facts, "deepspeed") else ["deepspeed"]),
        "hub datasets": [] if _ok(facts, "datasets") else ["datasets"],
    }
    ready = [use for use, lacks in uses.items() if not lacks]
    missing = {use: lacks for use, lacks in uses.items() if lacks}
    return Diagnosis(kept, ready, missing)


# ---------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------


def summary(diagnosis: Diagnosis) -> str:
    ready = ", ".join(diagnosis.ready) or "nothing"
    line = f"ready for: {ready}"
    if diagnosis.missing:
        line += "; missing: " + ", ".join(
            f"{use} ({', '.join(lacks)})" for use, lacks in diagnosis.missing.items()
        )
    return line


def format_text(diagnosis: Diagnosis) -> str:
    return "\n".join([*(row.line() for row in diagnosis.rows), summary(diagnosis)]) + "\n"


def format_json(diagnosis: Diagnosis) -> str:
    return (
        json.dumps(
            {
                "checks": [row.as_dict() for row in diagnosis.rows],
                "ready_for": diagnosis.ready,
                "missing": diagnosis.missing,
                "exit_code": diagnosis.exit_code,
            },
            indent=2,
        )
        + "\n"
    )
