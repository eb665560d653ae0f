"""Shared fixtures: config files written into a temporary folder, and plans built from them."""

from __future__ import annotations

import os
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

# the executors register their scenarios-file sections (slurm:, ray:) as the registry loads
import orchestrator.executors.registry  # noqa: F401
from orchestrator.config.scenarios import BenchConfig, load_config
from orchestrator.matrix.expand import Plan, Selection, build_plan

REPO = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"

ACCELERATE_FSDP = """\
compute_environment: LOCAL_MACHINE
distributed_type: FSDP
fsdp_config:
  fsdp_version: 2
num_processes: 1
"""
ACCELERATE_DDP = """\
compute_environment: LOCAL_MACHINE
distributed_type: MULTI_GPU
num_processes: 1
"""


@pytest.fixture(scope="session", autouse=True)
def _hermetic_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One tiny-model cache for the whole session, outside the user's home; no hub."""
    cache = tmp_path_factory.mktemp("tunematrix-cache")
    saved = {k: os.environ.get(k) for k in ("TUNEMATRIX_CACHE", "HF_HUB_OFFLINE")}
    os.environ["TUNEMATRIX_CACHE"] = str(cache)
    os.environ["HF_HUB_OFFLINE"] = "1"
    yield cache
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(scope="session")
def tiny_path(_hermetic_cache: Path) -> Path:
    """The tiny model, built once per session."""
    from trainer_entry.models.tiny import ensure_tiny

    return ensure_tiny()


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_path: Path) -> object:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_path)


def dedent(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


@pytest.fixture
def write(tmp_path: Path) -> Callable[[str, str], Path]:
    """Write a (dedented) text file under the test's temporary folder."""

    def _write(name: str, text: str) -> Path:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(dedent(text), encoding="utf-8")
        return path

    return _write


@pytest.fixture
def config_dir(tmp_path: Path, write: Callable[[str, str], Path]) -> Path:
    """A folder with accelerate configs (fsdp and ddp) and an empty defaults.yaml."""
    write("accelerate.yaml", ACCELERATE_FSDP)
    write("accelerate-ddp.yaml", ACCELERATE_DDP)
    write("defaults.yaml", "")
    return tmp_path


@pytest.fixture
def load(config_dir: Path, write: Callable[[str, str], Path]) -> Callable[..., BenchConfig]:
    """Load a scenarios text (and optional defaults text) as the CLI would."""

    def _load(scenarios: str, defaults: str | None = None, **kwargs: object) -> BenchConfig:
        path = write("scenarios.yaml", scenarios)
        if defaults is not None:
            write("defaults.yaml", defaults)
        return load_config(
            path,
            defaults_file=config_dir / "defaults.yaml",
            accelerate_fallback=config_dir / "accelerate.yaml",
            **kwargs,  # type: ignore[arg-type]
        )

    return _load


@pytest.fixture
def plan(load: Callable[..., BenchConfig]) -> Callable[..., Plan]:
    """Build a plan from a scenarios text; keyword arguments go to ``Selection``.

    The device is ``gpu`` unless the test asks for another (``device="auto"``).
    """

    def _plan(
        scenarios: str, defaults: str | None = None, gpu_count: int = 0, **selection: object
    ) -> Plan:
        selection.setdefault("device", "gpu")
        config = load(scenarios, defaults)
        return build_plan(config, Selection(**selection), gpu_count)  # type: ignore[arg-type]

    return _plan


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A real one-node SLURM cluster for the session; the environment that reaches it.

    Skips (with the reason, shown by ``-ra``) where SLURM cannot be installed
    or started. The daemons are stopped by their pids at the end.
    """
    import slurmcluster

    started = slurmcluster.start(tmp_path_factory.mktemp("slurm"))
    if isinstance(started, str):
        pytest.skip(f"no SLURM cluster: {started}")
    try:
        yield started.env
    finally:
        started.stop()
