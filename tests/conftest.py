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


#: the marks of the tests that use the machine's own daemons, cgroups, mounts and
#: namespaces (root): under ``--dist loadgroup`` they run one at a time, on a worker of
#: their own, beside the other workers
SYSTEM_MARKS = ("cluster", "faults")


def _is_system(item: pytest.Item) -> bool:
    return any(item.get_closest_marker(mark) for mark in SYSTEM_MARKS)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under ``--dist loadgroup`` (tox -e tests): the system tests are one group, first in
    the queue, so they run in order on one worker from the start; every other test is in
    the group of its file, so a module's fixtures are built once (as ``--dist loadfile``)."""
    # on a worker, xdist has set ``dist`` to "no" and ``loadgroup`` to whether it was
    if config.getoption("dist", "no") != "loadgroup" and not config.getoption("loadgroup", False):
        return
    system: list[pytest.Item] = []
    rest: list[pytest.Item] = []
    for item in items:
        if _is_system(item):
            item.add_marker(pytest.mark.xdist_group("system"))
            system.append(item)
        else:
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::", 1)[0]))
            rest.append(item)
    items[:] = system + rest


def _selects_system(config: pytest.Config) -> bool:
    """Whether this session's ``-m`` keeps the system tests, and they can run (root)."""
    if os.geteuid() != 0:
        return False
    try:
        from _pytest.mark.expression import Expression
    except ImportError:
        return False
    if not config.option.markexpr:
        return True
    expression = Expression.compile(config.option.markexpr)

    def marked(mark: str) -> bool:
        return expression.evaluate(lambda name, /, **_: name in {"e2e", mark})

    return any(marked(mark) for mark in SYSTEM_MARKS)


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """``-n auto`` with the system tests selected: xdist's own count (a worker a core, or
    PYTEST_XDIST_AUTO_NUM_WORKERS), and one more for them, which spend most of their time
    waiting on daemons, time limits and kills."""
    if not _selects_system(config):
        return None
    from xdist.plugin import pytest_xdist_auto_num_workers as xdist_count

    return xdist_count(config) + 1


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
