"""Trainer backends: what builds and runs the training loop of a run.

A scenario picks one with the ``trainer`` argument (default: the first declared
for its task in ``orchestrator.contract.trainers.TRAINERS``: ``sft``, TRL's
``SFTTrainer``, for causal LMs; ``hf``, the Hugging Face ``Trainer``, for the
others). Each backend is one module implementing
``trainer_entry.backends.trainer_protocol.TrainerBackend``, declared by one line there.
The declaration names the module rather than importing it, so choosing and
checking a backend costs nothing before the training stack is imported.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from orchestrator.contract.trainers import (
    BACKEND_KEY,
    DEFAULT_TASK,
    default_backend,
    task_backends,
    trainer,
    trainer_names,
)
from trainer_entry.settings.parsed import DEFAULT_BACKEND as DEFAULT_BACKEND  # one definition
from trainer_entry.spec_errors import SpecError

if TYPE_CHECKING:
    from trainer_entry.backends.trainer_protocol import TrainerBackend


def backend_name(arguments: Mapping[str, Any], task: str = DEFAULT_TASK) -> str:
    """The backend the spec's arguments ask for (the task's default when they do not say)."""
    name = arguments.get(BACKEND_KEY)
    if name is None:
        return default_backend(task)
    if not isinstance(name, str) or trainer(name) is None:
        raise _unknown(name)
    runs = task_backends(task)
    if runs and name not in runs:
        raise SpecError(
            f"{BACKEND_KEY} {name} does not train task {task}; it runs with {' or '.join(runs)}"
        )
    return name


def get_backend(name: str) -> TrainerBackend:
    """An instance of backend ``name``; imports its module (and its training stack)."""
    declared = trainer(name)
    if declared is None:
        raise _unknown(name)
    module, _, cls = declared.implementation.partition(":")
    backend: TrainerBackend = getattr(importlib.import_module(module), cls)()
    return backend


def _unknown(name: object) -> SpecError:
    """The refusal of a ``trainer`` value no declared backend has."""
    return SpecError(f"{BACKEND_KEY} must be one of {', '.join(trainer_names())}, got {name!r}")
