"""``python -m trainer_entry.check``: a plan's cells checked against the installed stack.

Run once per interpreter by the orchestrator before anything launches
(``orchestrator.running.stackcheck``), in the interpreter the jobs run with.
It reads a request on stdin and prints one JSON answer on stdout, on the line
that starts with ``orchestrator.contract.checking.ANSWER`` (which has the
format). The answer: the versions of the stack; each distinct model name resolved once
(``trainer_entry.models.resolve``: shipped, architecture, function, local
folder, hub cache or hub, with one short request to the hub); and every
problem the jobs would meet before their first step, each with its cell and,
where one setting is to blame, the key and the library that refused it; and,
for the cells the request lists under ``memory``, each one's predicted GPU
memory (``trainer_entry.run.memoryplan``: its training step on fake tensors),
or why it has none.

A cell is checked by the child's own steps, in the order a job takes them: its
preflight, the fms-acceleration plugins its job environment names
(``trainer_entry.models.acceleration``: run, or the cell refused), its arguments
sorted and named as the installed classes name them
(``TrainerBackend.arguments``), its LoRA configuration, its model built on the
meta device with its attention kernel, LoRA and positions
(``trainer_entry.run.modelcheck``), and its trainer configuration built
(``TrainerBackend.configure``). The last is left out for GPU
cells on a machine without a GPU (a setting such as ``tf32`` is refused there,
rightly, and not where the jobs run): the answer counts them. Nothing is
trained, no weights are loaded and nothing is written.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from orchestrator.contract.checking import ANSWER
from trainer_entry.spec_errors import SpecError, first_line

#: the packages whose versions the answer gives
STACK = ("torch", "transformers", "trl", "peft", "accelerate", "datasets", "huggingface_hub")
#: variables that would make the check's own process join a distributed group
_DISTRIBUTED = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in STACK:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


def _problem(cell: str, exc: BaseException) -> dict[str, Any]:
    """One problem: the cell, the message, and the key and library where one is to blame."""
    from trainer_entry.settings.installed import SettingError

    if isinstance(exc, SettingError):
        return {
            "cell": cell,
            "key": exc.key,
            "library": exc.owner.package,
            "version": exc.owner.version,
            "message": exc.detail,
        }
    message = first_line(exc)
    if not isinstance(exc, SpecError):
        message = f"{type(exc).__name__}: {message}"
    return {"cell": cell, "key": getattr(exc, "key", None), "message": message}


def resolve_models(specs: Iterable[tuple[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each distinct model of ``specs`` (cell id, RunSpec) resolved once, by name."""
    from trainer_entry.models.resolve import HubProbe, resolve
    from trainer_entry.run.parse import parse_arguments

    hub = HubProbe()
    out: dict[str, dict[str, Any]] = {}
    for cell, spec in specs:
        try:
            model = parse_arguments(spec, check_names=False).model
        except SpecError:
            continue  # the cell's own check says why
        if model.name in out:
            continue
        started = time.monotonic()
        try:
            found = resolve(
                model.name, revision=model.revision, python_path=spec.python_path, hub=hub
            )
            out[model.name] = {
                "cell": cell,
                "where": found.describe(),
                # where it was found, as data (``where`` says it, with its details)
                "kind": found.where,
                "offline": found.offline,
            }
        except SpecError as exc:
            out[model.name] = {"cell": cell, "error": str(exc)}
        out[model.name]["seconds"] = round(time.monotonic() - started, 2)
    return out


def check_cell(spec: Any, *, gpu_here: bool, builds: dict[str, Any] | None = None) -> bool:
    """Check one cell as a job would before its first step; False when its trainer
    configuration was not built here (a GPU cell on a machine without one). ``builds``:
    the models built for the cells before it (``trainer_entry.run.modelcheck``)."""
    from trainer_entry.backends import get_backend
    from trainer_entry.models.acceleration import load_acceleration, requested
    from trainer_entry.run.modelcheck import build_once
    from trainer_entry.run.parse import parse_arguments
    from trainer_entry.run.preflight import preflight
    from trainer_entry.tasks import get_task

    preflight(spec, models=False)
    parsed = parse_arguments(spec, check_names=False)
    backend = get_backend(parsed.backend)
    parsed = parse_arguments(spec, backend.argument_fields())
    on_gpu = spec.device == "gpu"
    plugins = requested(spec.env)
    if plugins is not None:
        load_acceleration(plugins, on_gpu=on_gpu)
    backend.arguments(spec, parsed, on_gpu=on_gpu)
    task = get_task(parsed.task)
    if parsed.peft.method is not None:
        from trainer_entry.models.load import lora_config

        lora_config(parsed.peft, task)
    build_once(spec, parsed, task, gpu_here=gpu_here, seen={} if builds is None else builds)
    if on_gpu and not gpu_here:
        return False
    try:
        backend.configure(spec, parsed, on_gpu=on_gpu)
    except SpecError as exc:
        raise _blamed(exc, spec, parsed, backend, on_gpu) from None
    return True


def _blamed(exc: SpecError, spec: Any, parsed: Any, backend: Any, on_gpu: bool) -> SpecError:
    """``exc`` with the setting to blame, where the library refused the trainer
    configuration: the first of the run's settings that it refuses on its own."""
    from trainer_entry.settings.installed import Refused, SettingError

    if not isinstance(exc, Refused):
        return exc
    for key, value in parsed.training.items():
        alone = dataclasses.replace(parsed, training={key: value}, notes=[])
        try:
            backend.configure(spec, alone, on_gpu=on_gpu)
        except Refused as one:
            if one.detail == exc.detail:  # this setting alone fails as the whole did
                return SettingError(key, one.owner, f"{one.owner} refuses {value!r}: {one.detail}")
        except SpecError:
            continue
    return exc


#: spec fields and arguments that change nothing a training step holds: cells that differ
#: only in them share one memory prediction
_NOT_MEMORY = ("experiment_id", "cell_id", "repeat", "position", "scenario", "swept")
_NOT_MEMORY_ARGUMENTS = (
    "max_steps",
    "num_train_epochs",
    "learning_rate",
    "seed",
    "data_seed",
    "logging_steps",
    "effective_batch_size",
)
#: what makes a cell's size: cells that differ only in it share one build of the model
_SIZE = (
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "effective_batch_size",
    "max_seq_len",
    "packing",
)
#: how long the predictions of one check may take together: the cells not reached by
#: then are left without one (the check itself has CHECK_TIMEOUT_S, 300 s, in all)
MEMORY_BUDGET_S = 150.0


def _memory_key(spec: Any, leave_out: tuple[str, ...] = ()) -> str:
    """The spec less what changes nothing a step holds (and ``leave_out``), as text."""
    data = spec.model_dump(mode="json")
    for name in (*_NOT_MEMORY, "result_path", "progress_path", "output_dir", "data_dir"):
        data.pop(name, None)
    data["arguments"] = {
        k: v
        for k, v in (data.get("arguments") or {}).items()
        if k not in _NOT_MEMORY_ARGUMENTS and k not in leave_out
    }
    for name in ("effective_batch_size", *leave_out):
        data.pop(name, None)
    return json.dumps(data, sort_keys=True, default=str)


def predict_memory(
    specs: Iterable[tuple[str, Any]], budget_s: float = MEMORY_BUDGET_S
) -> dict[str, dict[str, Any]]:
    """Each cell's predicted GPU memory (``trainer_entry.run.memoryplan``), or why there is
    none; cells that differ in nothing a step holds are predicted once, the cells of one
    build group one after another (they share one build of the model). Past ``budget_s``, the
    cells left get no prediction (and say why) rather than the check running out of time."""
    from trainer_entry.run.memoryplan import Predictor, predict

    out: dict[str, dict[str, Any]] = {}
    done: dict[str, dict[str, Any]] = {}
    predictor = Predictor()
    started = time.monotonic()
    ordered = sorted(specs, key=lambda cs: (_memory_key(cs[1], _SIZE), _memory_key(cs[1])))
    for cell, spec in ordered:
        key = _memory_key(spec)
        if key not in done:
            if time.monotonic() - started > budget_s:
                done[key] = {
                    "error": f"not reached in the check's {budget_s:.0f} s for predictions",
                    # asked again next time, not kept with the verdict
                    "retry": True,
                }
            else:
                try:
                    done[key] = predict(spec, predictor).as_dict()
                except SpecError as exc:
                    done[key] = {"error": first_line(exc)}
                except Exception as exc:  # a prediction never stops the check
                    done[key] = {"error": f"{type(exc).__name__}: {first_line(exc)}"}
        out[cell] = done[key]
    return out


def check(request: Mapping[str, Any]) -> dict[str, Any]:
    """The answer to a request (see the module's docstring)."""
    from orchestrator.contract.spec import RunSpec

    started = time.monotonic()
    problems: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="tunematrix-check-") as scratch:
        specs = []
        for cell in request.get("cells", []):
            try:
                specs.append((str(cell["id"]), RunSpec(**cell["spec"]).resolve(Path(scratch))))
            except ValueError as exc:  # pydantic's ValidationError among them
                problems.append(_problem(str(cell.get("id")), exc))
        models = resolve_models(specs)
        failed_models = {name for name, found in models.items() if "error" in found}
        unbuilt: list[str] = []
        gpu_here: bool | None = None
        builds: dict[str, Any] = {}
        for cell, spec in specs:
            try:
                if spec.device == "gpu" and gpu_here is None:
                    import torch

                    gpu_here = torch.cuda.is_available()
                name = spec.arguments.get("model_name_or_path") or spec.model_name_or_path
                if name in failed_models:
                    continue  # said once, with the model
                if not check_cell(spec, gpu_here=bool(gpu_here), builds=builds):
                    unbuilt.append(cell)
            except Exception as exc:
                problems.append(_problem(cell, exc))
        wanted = set(request.get("memory") or ())
        failed = {p["cell"] for p in problems}
        memory = predict_memory(
            (cell, spec) for cell, spec in specs if cell in wanted and cell not in failed
        )
    return {
        "memory": memory,
        "versions": versions(),
        "models": models,
        "problems": problems,
        "unbuilt": len(unbuilt),
        "unbuilt_cells": unbuilt,
        "seconds": round(time.monotonic() - started, 2),
    }


def main(argv: list[str] | None = None) -> int:
    import argparse

    argparse.ArgumentParser(
        prog="python -m trainer_entry.check",
        description="Check a plan's cells against the installed training stack, as a job "
        "would before its first step; nothing is trained or written. Reads a request on "
        "stdin and prints the answer, as JSON, on the line starting with "
        f"{ANSWER.strip()!r}.",
        epilog='Example:\n  echo \'{"cells": [{"id": "a", "spec": {"arguments": '
        '{"model_name_or_path": "tiny-llama"}}}]}\' | python -m trainer_entry.check',
        formatter_class=argparse.RawDescriptionHelpFormatter,
    ).parse_args(argv)
    for name in _DISTRIBUTED:
        os.environ.pop(name, None)
    # the libraries' warnings and loading bars go to stderr; stdout's last line is the answer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    request = json.load(sys.stdin)
    print(ANSWER + json.dumps(check(request)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
