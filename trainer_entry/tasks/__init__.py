"""Tasks: what a run trains (see ``trainer_entry.tasks.base``).

A scenario picks one with the ``task`` argument (default ``causal-lm``). Each
task is one module implementing ``trainer_entry.tasks.base.Task``, registered
here by one line; the registry names modules rather than importing them.
The names, and which trainer backends each task runs, are part of the
contract (``orchestrator.contract.argnames``), so the planner knows them too.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from orchestrator.contract.applicability import DEFAULT_TASK, TASK_KEY, TASKS
from trainer_entry.errors import SpecError

if TYPE_CHECKING:
    from trainer_entry.tasks.base import Task

#: task name -> "module:class" of its implementation
TASK_MODULES: dict[str, str] = {
    "causal-lm": "trainer_entry.tasks.causal_lm:CausalLMTask",
    "seq-classification": "trainer_entry.tasks.seq_classification:SeqClassificationTask",
    "image-classification": "trainer_entry.tasks.image_classification:ImageClassificationTask",
}
assert tuple(TASK_MODULES) == TASKS


def task_name(arguments: Mapping[str, Any]) -> str:
    """The task the spec's arguments name (``DEFAULT_TASK`` when they do not say)."""
    name = arguments.get(TASK_KEY)
    if name is None:
        return DEFAULT_TASK
    if not isinstance(name, str) or name not in TASK_MODULES:
        raise SpecError(f"{TASK_KEY} must be one of {', '.join(TASK_MODULES)}, got {name!r}")
    return name


def get_task(name: str) -> Task:
    """An instance of task ``name``; imports its module (and the training stack)."""
    module, _, cls = TASK_MODULES[name].partition(":")
    task: Task = getattr(importlib.import_module(module), cls)()
    return task
