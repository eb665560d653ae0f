"""Tasks: what a run trains (see ``trainer_entry.tasks.task_protocol``).

A scenario picks one with the ``task`` argument (default ``causal-lm``). Each
task is one module implementing ``trainer_entry.tasks.task_protocol.Task``,
declared by one ``TaskLine`` in ``orchestrator.contract.trainers.TASK_LINES``,
which names the module rather than importing it; the planner and the report read
the same line, and which trainer backends run each task.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from orchestrator.contract.trainers import DEFAULT_TASK, TASK_IMPLEMENTATIONS, TASK_KEY
from trainer_entry.spec_errors import SpecError

if TYPE_CHECKING:
    from trainer_entry.tasks.task_protocol import Task


def task_name(arguments: Mapping[str, Any]) -> str:
    """The task the spec's arguments name (``DEFAULT_TASK`` when they do not say)."""
    name = arguments.get(TASK_KEY)
    if name is None:
        return DEFAULT_TASK
    if not isinstance(name, str) or name not in TASK_IMPLEMENTATIONS:
        raise SpecError(
            f"{TASK_KEY} must be one of {', '.join(TASK_IMPLEMENTATIONS)}, got {name!r}"
        )
    return name


def get_task(name: str) -> Task:
    """An instance of task ``name``; imports its module (and the training stack)."""
    module, _, cls = TASK_IMPLEMENTATIONS[name].partition(":")
    task: Task = getattr(importlib.import_module(module), cls)()
    return task
