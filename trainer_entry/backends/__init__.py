"""Trainer backends: what builds and runs the training loop of a run.

A scenario picks one with the ``trainer`` argument (default: the task's
first, ``orchestrator.contract.argnames.TASK_BACKENDS``: ``sft``, TRL's
``SFTTrainer``, for causal LMs; ``hf``, the Hugging Face ``Trainer``, for the
others). Each backend is one module implementing
``trainer_entry.backends.base.TrainerBackend``, registered here by one line.
The registry names modules rather than importing them, so choosing and
checking a backend costs nothing before the training stack is imported.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from orchestrator.contract.applicability import (
    BACKEND_KEY,
    DEFAULT_TASK,
    TASK_BACKENDS,
    default_backend,
)
from trainer_entry.errors import SpecError
from trainer_entry.settings import DEFAULT_BACKEND as DEFAULT_BACKEND  # one definition

if TYPE_CHECKING:
    from trainer_entry.backends.base import TrainerBackend

#: backend name -> "module:class" of its implementation
BACKENDS: dict[str, str] = {
    "sft": "trainer_entry.backends.sft:SFTTrainerBackend",
    "hf": "trainer_entry.backends.hf:HFTrainerBackend",
}
# DEFAULT_BACKEND, the backend of the default task, is trainer_entry.settings'


def backend_name(arguments: Mapping[str, Any], task: str = DEFAULT_TASK) -> str:
    """The backend the spec's arguments ask for (the task's default when they do not say)."""
    name = arguments.get(BACKEND_KEY)
    if name is None:
        return default_backend(task)
    if not isinstance(name, str) or name not in BACKENDS:
        raise SpecError(f"{BACKEND_KEY} must be one of {', '.join(BACKENDS)}, got {name!r}")
    runs = TASK_BACKENDS.get(task, ())
    if runs and name not in runs:
        raise SpecError(
            f"{BACKEND_KEY} {name} does not train task {task}; it runs with {' or '.join(runs)}"
        )
    return name


def get_backend(name: str) -> TrainerBackend:
    """An instance of backend ``name``; imports its module (and its training stack)."""
    module, _, cls = BACKENDS[name].partition(":")
    backend: TrainerBackend = getattr(importlib.import_module(module), cls)()
    return backend
