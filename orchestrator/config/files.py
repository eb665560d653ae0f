"""Where the config files are when the command line (or the code) names none.

The scenarios file is ``./scenarios.yaml``, else the one shipped with
tunematrix; ``defaults.yaml`` and ``accelerate.yaml`` are taken from beside the
scenarios file, else the shipped ones. ``plan``, ``run``, ``doctor`` and the
Python API all find them here, so they always agree.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from orchestrator.config.scenarios import BenchConfig, load_config
from orchestrator.config.yamlio import YamlDoc
from orchestrator.contract.errors import UserError
from orchestrator.contract.layout import shipped

SCENARIOS_FILE = "scenarios.yaml"
DEFAULTS_FILE = "defaults.yaml"
ACCELERATE_FILE = "accelerate.yaml"


@dataclass(frozen=True)
class ConfigFiles:
    """The files a config is loaded from."""

    scenarios: Path
    #: trainer arguments shared by every scenario; None where there is no such file
    defaults: Path | None
    #: the accelerate config of frameworks that name none, where neither the command
    #: line nor the scenarios file's ``accelerate_config:`` names one
    accelerate_fallback: Path | None


def beside_or_shipped(scenarios: Path, name: str) -> Path | None:
    """``name`` beside the scenarios file, else the shipped one; None where neither is."""
    for candidate in (scenarios.parent / name, shipped(name)):
        if candidate.is_file():
            return candidate
    return None


def find_config_files(
    scenarios: Path | None = None, *, defaults: Path | None = None, cwd: Path | None = None
) -> ConfigFiles:
    """The files to load: those given, the rest found as the module docstring says.

    ``cwd`` is the folder whose ``scenarios.yaml`` is the default (default: the
    current folder). A given file is returned as given, found or not: loading
    it names what is missing.
    """
    if scenarios is None:
        local = (cwd or Path()) / SCENARIOS_FILE
        scenarios = local if local.is_file() else shipped(SCENARIOS_FILE)
    return ConfigFiles(
        scenarios=scenarios,
        defaults=defaults if defaults is not None else beside_or_shipped(scenarios, DEFAULTS_FILE),
        accelerate_fallback=beside_or_shipped(scenarios, ACCELERATE_FILE),
    )


def load_found(
    scenarios: Path | None = None,
    *,
    defaults: Path | None = None,
    frameworks: Sequence[Path] = (),
    accelerate_config: Path | None = None,
    document: YamlDoc | None = None,
) -> BenchConfig:
    """Find the files (:func:`find_config_files`) and load them.

    ``document``: the scenarios file's content, already parsed; ``scenarios``
    then only names it, and the files beside it are looked for beside that name.
    """
    files = find_config_files(scenarios, defaults=defaults)
    return load_config(
        files.scenarios,
        defaults_file=files.defaults,
        frameworks_files=list(frameworks),
        accelerate_config=accelerate_config,
        accelerate_fallback=files.accelerate_fallback,
        document=document,
    )


def default_accelerate() -> tuple[Path | None, str | None]:
    """The accelerate config a job gets when its framework names none, found as
    ``plan`` finds it; or None and why it cannot be told (the config does not load)."""
    try:
        found = load_found().default_accelerate
    except UserError as exc:
        return None, str(exc)
    return (found.path if found is not None else None), None
