"""Which experiments may share one launch (``--launch family``). Pure.

A family is the experiments of one launch command: the same model, task,
trainer, framework (accelerate config and environment overlay), device and
GPU count, dtype, interpreter and host allocator (a preload is the process's),
and the same repeat, so that every repeat of a cell stays in a launch of its
own. Its members keep the plan's order (smaller cells first), and families run
in the order of their first member.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from orchestrator.matrix.experiment import Experiment


def family_key(experiment: Experiment) -> tuple[Any, ...]:
    """What experiments must share to run in one launch."""
    e = experiment
    return (
        e.model_name_or_path,
        e.task,
        e.trainer,
        e.framework,
        str(e.accelerate.path) if e.accelerate is not None else "",
        tuple(sorted(e.env.items())),
        e.device,
        e.num_gpus,
        e.processes,
        e.torch_dtype or "",
        e.environment.name if e.environment is not None else "",
        e.python or "",
        e.python_path,
        e.hub_offline,
        # a preloaded allocator and its settings are the process's, set at its start
        e.allocator,
        e.repeat,
    )


def families(experiments: Sequence[Experiment]) -> list[list[Experiment]]:
    """The experiments grouped into launches, in plan order (see the module's docstring)."""
    grouped: dict[tuple[Any, ...], list[Experiment]] = {}
    for experiment in experiments:
        grouped.setdefault(family_key(experiment), []).append(experiment)
    return list(grouped.values())
