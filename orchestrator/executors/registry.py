"""The executors, by name: the one place an executor is registered.

To add an executor, write its module (a subclass of
``orchestrator.executors.base.Executor``) and add one ``register`` line
below. ``tunematrix run --executor NAME``, its flags, the scenarios file's
``NAME:`` section, ``tunematrix doctor`` and the collection of finished
jobs all come from here.
"""

from __future__ import annotations

from orchestrator.config.schema import executor_sections_from
from orchestrator.contract.errors import UserError
from orchestrator.contract.layout import ResultsLayout
from orchestrator.executors.base import Executor, ExecutorSection, Settled
from orchestrator.executors.local import LocalExecutor
from orchestrator.executors.packed import PackedExecutor
from orchestrator.executors.raycluster import RayExecutor
from orchestrator.executors.slurm import SlurmExecutor

#: name -> executor class, in the order ``--executor`` lists them
EXECUTORS: dict[str, type[Executor]] = {}
#: what runs when no executor is named
DEFAULT = "local"


def register(cls: type[Executor]) -> type[Executor]:
    """Add an executor (usable as a class decorator); its name must be new."""
    if cls.name in EXECUTORS and EXECUTORS[cls.name] is not cls:
        raise ValueError(f"an executor named {cls.name!r} is already registered")
    EXECUTORS[cls.name] = cls
    return cls


register(LocalExecutor)
register(PackedExecutor)
register(SlurmExecutor)
register(RayExecutor)


def get(name: str) -> type[Executor]:
    """The executor class called ``name``."""
    try:
        return EXECUTORS[name]
    except KeyError:
        raise UserError(f"unknown executor {name!r}; executors: {', '.join(EXECUTORS)}") from None


def sections() -> dict[str, type[ExecutorSection]]:
    """Each executor's section of the scenarios file, under its name."""
    return {name: cls.section for name, cls in EXECUTORS.items() if cls.section is not None}


# the scenarios file's model reads the sections from here (config never imports executors)
executor_sections_from(sections)


def log_folders(layout: ResultsLayout) -> list[str]:
    """The names of the folders where executors keep their own logs in ``layout``."""
    return [layout.executor_logs(name).name for name, cls in EXECUTORS.items() if cls.keeps_logs]


def settle_all(layout: ResultsLayout) -> list[Settled]:
    """Let every executor collect its jobs of an earlier run that have ended since."""
    found = []
    for cls in EXECUTORS.values():
        settled = cls.settle(layout)
        if settled is not None:
            found.append(settled)
    return found


def env_prefixes() -> tuple[str, ...]:
    """The environment variable prefixes every registered executor sets in its jobs."""
    return tuple(prefix for cls in EXECUTORS.values() for prefix in cls.env_prefixes)
