"""What a matrix needs installed, checked once before anything launches.

Without this, a missing training stack shows up one experiment at a time, each
launched and failed with "No module named 'accelerate'". The children run with
this same interpreter (``orchestrator.job.command.accelerate_command``), so what
this interpreter can import is what they can; those of an ``environments:``
entry run its interpreter, probed at plan time (``orchestrator.config.environments``). Nothing is imported here: a
package is looked up, not loaded.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from orchestrator.contract.errors import UserError
from orchestrator.matrix.experiment import Experiment
from orchestrator.matrix.frameworks import distributed_type

TRAIN_STACK = ("torch", "transformers", "peft", "accelerate")
TRAIN_INSTALL = "pip install 'tunematrix[train]' (with your CUDA build of torch first)"
QLORA_INSTALL = "pip install bitsandbytes"
DEEPSPEED_INSTALL = "pip install 'tunematrix[deepspeed]'"


@dataclass(frozen=True)
class Need:
    #: the module to import
    module: str
    #: who needs it, for the message
    why: str
    #: how to install it
    install: str


def needs(experiments: Iterable[Experiment], executor: str = "local") -> list[Need]:
    """Every package the experiments (and the executor named ``executor``) need, each once,
    in a stable order."""
    from orchestrator.executors.registry import get

    found: dict[str, Need] = {}
    # an experiment under an environments: entry runs another interpreter, whose
    # training stack the plan probed; only the others run with this one
    experiments = [e for e in experiments if e.environment is None]
    if experiments:
        for module in TRAIN_STACK:
            found[module] = Need(module, "the training stack", TRAIN_INSTALL)
    for need in get(executor).needs:
        found.setdefault(need.module, need)
    for e in experiments:
        if e.peft_method == "qlora" and "bitsandbytes" not in found:
            found["bitsandbytes"] = Need(
                "bitsandbytes",
                f"scenario '{e.scenario}' (peft_method: qlora)",
                QLORA_INSTALL,
            )
        uses_deepspeed = distributed_type(e.accelerate) == "DEEPSPEED"
        if uses_deepspeed and "deepspeed" not in found:
            found["deepspeed"] = Need(
                "deepspeed",
                f"framework '{e.framework}' (distributed_type: DEEPSPEED)",
                DEEPSPEED_INSTALL,
            )
    return list(found.values())


def missing(
    wanted: Iterable[Need], find: Callable[[str], Any] = importlib.util.find_spec
) -> list[Need]:
    out = []
    for need in wanted:
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
