"""The tasks a run can train and the trainer backends that train them, each declared once.

The planner checks a scenario's ``task`` and ``trainer`` against these
declarations before any job starts; the child's registries
(``trainer_entry.tasks``, ``trainer_entry.backends``) import a task's or a
backend's module from its line here, and the child's check before the training
stack loads (``trainer_entry.run.preflight``) reads what a backend needs.
Pure: nothing imported beyond the standard library.

To add a task: write its module, a class implementing
``trainer_entry.tasks.task_protocol.Task``, and add one line to
``TASK_IMPLEMENTATIONS`` (the settings that mean something for it alone go in
``orchestrator.contract.applicability``' applicability table). To add a trainer
backend: write its module, a class implementing
``trainer_entry.backends.trainer_protocol.TrainerBackend``, and add one
``Trainer`` line to ``TRAINERS``. Order matters once in each: the first task is
the default, and a task's default backend is the first line that trains it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

#: names what the run trains: its model class, data, collator, FLOPs and throughput unit
TASK_KEY = "task"
#: every task, the default first -> ``module:Class`` of its ``Task`` (only the child imports it)
TASK_IMPLEMENTATIONS: dict[str, str] = {
    "causal-lm": "trainer_entry.tasks.causal_lm:CausalLMTask",
    "seq-classification": "trainer_entry.tasks.seq_classification:SeqClassificationTask",
    "image-classification": "trainer_entry.tasks.image_classification:ImageClassificationTask",
}
TASKS = tuple(TASK_IMPLEMENTATIONS)
DEFAULT_TASK = TASKS[0]
#: names the child's trainer backend (one of ``TRAINERS``)
BACKEND_KEY = "trainer"

_ASSETS = Path(__file__).resolve().parent / "assets"


@dataclass(frozen=True)
class Trainer:
    """A trainer backend as the planner and the child's registry know it."""

    name: str
    """The ``trainer`` argument's value that chooses it."""
    tasks: tuple[str, ...]
    """The tasks it trains (of ``TASKS``)."""
    implementation: str
    """``module:Class`` of its ``TrainerBackend``; only the child imports it."""
    library: str
    """What it runs, as messages name it (``TRL``)."""
    needs: str | None = None
    """The package it needs besides the training stack, checked before the stack loads."""
    config_class: str = "TrainingArguments"
    """The class its trainer arguments fill, as messages name it."""
    own_fields_file: Path | None = None
    """The saved names of its configuration's fields that ``TrainingArguments`` lacks
    (``{"<needs>": version, "fields": [...]}``; ``python -m trainer_entry.backends``
    rewrites it): arguments only this backend takes."""


TRAINERS: tuple[Trainer, ...] = (
    Trainer(
        "sft",
        ("causal-lm",),
        "trainer_entry.backends.sft:SFTTrainerBackend",
        library="TRL",
        needs="trl",
        config_class="SFTConfig",
        own_fields_file=_ASSETS / "sft_arguments.json",
    ),
    Trainer("hf", TASKS, "trainer_entry.backends.hf:HFTrainerBackend", library="transformers"),
)


def trainer_names() -> tuple[str, ...]:
    """Every backend's name, in declaration order."""
    return tuple(t.name for t in TRAINERS)


def trainer(name: str) -> Trainer | None:
    """The declaration of backend ``name``, or None for a name none has."""
    return next((t for t in TRAINERS if t.name == name), None)


def task_backends(task: str) -> tuple[str, ...]:
    """The backends that train ``task``, its default first (none for an unknown task)."""
    return tuple(t.name for t in TRAINERS if task in t.tasks)


def default_backend(task: str) -> str:
    """The trainer backend a run of ``task`` uses when its scenario names none."""
    return (task_backends(task) or task_backends(DEFAULT_TASK))[0]


def own_fields(name: str) -> frozenset[str]:
    """Backend ``name``'s own configuration fields, as saved (none where nothing is saved)."""
    declared = trainer(name)
    if declared is None or declared.own_fields_file is None:
        return frozenset()
    try:
        return frozenset(json.loads(declared.own_fields_file.read_text())["fields"])
    except OSError:
        return frozenset()


def own_fields_version(name: str) -> str:
    """The version of the package whose fields backend ``name``'s saved list holds."""
    declared = trainer(name)
    if declared is None or declared.own_fields_file is None or declared.needs is None:
        return "?"
    return str(json.loads(declared.own_fields_file.read_text()).get(declared.needs, "?"))
