"""Checks that need no training stack, run before importing it.

Importing torch and transformers takes seconds; a misspelt dataset path, a
QLoRA run on a CPU, an unknown trainer backend or a model that cannot be found
offline should fail in a fraction of that, with the same one-line error.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from orchestrator.contract.modelnames import hub_offline
from orchestrator.contract.spec import RunSpec
from orchestrator.contract.trainers import task_backends, trainer
from trainer_entry.data.sources import LOCAL_SUFFIXES
from trainer_entry.models.custom import check_findable
from trainer_entry.models.kinds import model_kind
from trainer_entry.models.resolve import resolve
from trainer_entry.run.parse import parse_arguments
from trainer_entry.settings.installed import MissingPackage, Owner
from trainer_entry.settings.parsed import ParsedArguments
from trainer_entry.spec_errors import SpecError

#: trainer arguments that need a package besides the training stack: key -> (what takes
#: the argument, the module it imports, that module's name on PyPI). transformers imports
#: ``liger_kernel`` only when training starts (under trainer hf and sft alike), so without
#: this a run would load its model and data first and then fail
ARGUMENT_PACKAGES = {
    "use_liger_kernel": (Owner("transformers", "TrainingArguments"), "liger_kernel", "liger-kernel")
}


def preflight(spec: RunSpec, *, models: bool = True) -> ParsedArguments:
    """The checks; ``models=False`` leaves the model to the caller (the check before
    launch resolves each model once, ``trainer_entry.models.resolve``)."""
    parsed = parse_arguments(spec, check_names=False)
    _check_backend_needs(parsed)
    _check_argument_packages(parsed)
    if parsed.peft.method == "qlora" and spec.device == "cpu":
        raise SpecError(
            "peft_method qlora needs a CUDA GPU (4-bit bitsandbytes); this run is on the CPU"
        )
    dataset = parsed.data.dataset
    if dataset is not None:
        path = Path(dataset).expanduser()
        looks_local = path.suffix.lower() in LOCAL_SUFFIXES or dataset.startswith(("/", ".", "~"))
        if looks_local and not path.is_file():
            raise SpecError(f"dataset file not found: {path}")
    if models and hub_offline():
        # offline, the name is resolved without the hub: a name that leads nowhere
        # fails here rather than after the imports
        resolve(parsed.model.name, revision=parsed.model.revision, python_path=spec.python_path)
    _check_python_model(spec, parsed)
    return parsed


def _check_python_model(spec: RunSpec, parsed: ParsedArguments) -> None:
    """A ``python:`` name's form and its top package; ``model_kwargs`` only for such a name.

    Finding the package runs none of the user's code; the function is imported
    and called when the model is loaded.
    """
    name = parsed.model.name
    if model_kind(name) == "python":
        check_findable(name, spec.python_path)
    elif parsed.model.kwargs:
        raise SpecError(
            f"model_kwargs are the keyword arguments of a python:<module>:<function> model; "
            f"model '{name}' takes none"
        )


def _check_argument_packages(parsed: ParsedArguments) -> None:
    """The package each trainer argument that is on needs (``ARGUMENT_PACKAGES``), found
    without importing it."""
    for key, (owner, module, package) in ARGUMENT_PACKAGES.items():
        if parsed.training.get(key) and importlib.util.find_spec(module) is None:
            raise MissingPackage(key, owner, package)


def _check_backend_needs(parsed: ParsedArguments) -> None:
    """The package the run's trainer backend needs besides the stack, found without
    importing it; the error names a backend of the task that needs none."""
    declared = trainer(parsed.backend)
    if declared is None or declared.needs is None:
        return
    if importlib.util.find_spec(declared.needs) is not None:
        return
    others = [
        name
        for name in task_backends(parsed.task)
        if name != declared.name and (other := trainer(name)) is not None and other.needs is None
    ]
    instead = f", or set trainer: {others[0]}" if others else ""
    raise SpecError(
        f"trainer {declared.name} needs {declared.needs}: pip install {declared.needs}{instead}"
    )
