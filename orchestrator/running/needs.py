"""What a matrix needs installed, checked once before anything launches.

Without this, a missing training stack shows up one experiment at a time, each
launched and failed with "No module named 'accelerate'". The children run with
this same interpreter (``orchestrator.job.command.accelerate_command``), so what
this interpreter can import is what they can; those of an ``environments:``
entry run its interpreter, probed at plan time (``orchestrator.config.environments``),
so what a cell of one needs is looked up in the versions the probe found. Nothing is
imported here: a package is looked up, not loaded.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterable
from typing import Any

from orchestrator.contract.applicability import TRAIN_STACK
from orchestrator.contract.errors import UserError
from orchestrator.executors.base import Need
from orchestrator.matrix.experiment import Experiment
from orchestrator.matrix.frameworks import distributed_type

__all__ = [
    "DEEPSPEED_INSTALL",
    "QLORA_INSTALL",
    "TRAIN_INSTALL",
    "TRAIN_STACK",
    "Need",
    "missing",
    "needs",
    "require",
]

TRAIN_INSTALL = "pip install 'tunematrix[train]' (with your CUDA build of torch first)"
QLORA_INSTALL = "pip install bitsandbytes"
DEEPSPEED_INSTALL = "pip install 'tunematrix[deepspeed]'"


def needs(experiments: Iterable[Experiment], executor: str = "local") -> list[Need]:
    """Every package the experiments (and the executor named ``executor``) need, each once,
    in a stable order."""
    from orchestrator.executors.registry import get

    experiments = list(experiments)
    # keyed by (environment name, module); None: this interpreter
    found: dict[tuple[str | None, str], Need] = {}
    # an experiment under an environments: entry runs another interpreter, whose
    # training stack the plan probed; only the others need it in this one
    if any(e.environment is None for e in experiments):
        for module in TRAIN_STACK:
            found[None, module] = Need(module, "the training stack", TRAIN_INSTALL)
    for need in get(executor).needs:
        found.setdefault((None, need.module), need)
    for e in experiments:
        env = e.environment
        where = f" in environment '{env.name}'" if env is not None else ""
        versions = env.versions if env is not None else None
        name = env.name if env is not None else None
        if e.peft_method == "qlora" and (name, "bitsandbytes") not in found:
            found[name, "bitsandbytes"] = Need(
                "bitsandbytes",
                f"scenario '{e.scenario}' (peft_method: qlora){where}",
                QLORA_INSTALL,
                versions,
            )
        uses_deepspeed = distributed_type(e.accelerate) == "DEEPSPEED"
        if uses_deepspeed and (name, "deepspeed") not in found:
            found[name, "deepspeed"] = Need(
                "deepspeed",
                f"framework '{e.framework}' (distributed_type: DEEPSPEED){where}",
                DEEPSPEED_INSTALL,
                versions,
            )
    return list(found.values())


def missing(
    wanted: Iterable[Need], find: Callable[[str], Any] = importlib.util.find_spec
) -> list[Need]:
    """The needs not met: looked up with ``find`` in this interpreter, or in the probed
    versions of the environment a need names."""
    out = []
    for need in wanted:
        if need.versions is not None:
            if not need.versions.get(need.module):
                out.append(need)
            continue
        try:
            spec = find(need.module)
        except (ImportError, ValueError):
            spec = None
        if spec is None:
            out.append(need)
    return out


def require(
    experiments: Iterable[Experiment],
    executor: str = "local",
    find: Callable[[str], Any] = importlib.util.find_spec,
) -> None:
    """Raise one line naming every missing package and how to install it."""
    absent = missing(needs(experiments, executor), find)
    if not absent:
        return
    groups: dict[tuple[str, str], list[str]] = {}
    for need in absent:
        groups.setdefault((need.why, need.install), []).append(need.module)
    parts = [
        f"{', '.join(modules)} (for {why}: {install})" for (why, install), modules in groups.items()
    ]
    raise UserError("not installed: " + "; ".join(parts) + "; nothing was started")
