"""``spec.json``: everything the training child needs, written by the parent.

The contract between ``orchestrator`` (which writes it) and ``trainer_entry``
(which reads it). The child trains from ``arguments`` (every trainer argument,
already merged and with the batch sizes resolved); the other fields describe
the cell and are copied into the result. Relative paths are relative to the
folder of the spec file, so a spec can be written by hand:

.. code-block:: json

    {"arguments": {"model_name_or_path": "tiny-llama", "max_steps": 5}}
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_validator

from orchestrator.contract.allocators import Allocator
from orchestrator.contract.errors import UserError
from orchestrator.contract.jsonio import read_json_object_reason
from orchestrator.contract.layout import write_atomic
from orchestrator.contract.steady import SteadyMeasure

SPEC_SCHEMA_VERSION = 1

#: what fills the GPU memory stage columns (``None``: nothing)
MemoryStages = Literal["torch", "hf-tracker"]

#: ``RunSpec.memory_stages`` -> the ``mem_stage_source`` a result reports for it
MEMORY_STAGE_SOURCES = {"torch": "torch.cuda counters", "hf-tracker": "hf TrainerMemoryTracker"}


class RunSpec(BaseModel):
    """One run of one experiment."""

    model_config = ConfigDict(extra="forbid")

    schema_version: int = SPEC_SCHEMA_VERSION
    experiment_id: str = "manual"
    cell_id: str | None = None
    scenario: str | None = None
    framework_config: str | None = None
    model_name_or_path: str | None = None
    #: ``gpu`` or ``cpu``; None: a GPU when one is visible
    device: Literal["gpu", "cpu"] | None = None
    num_gpus: int | None = None
    #: training processes: num_gpus, or 1 where one process drives all the GPUs (dp)
    processes: int | None = None
    effective_batch_size: int | None = None
    per_device_train_batch_size: int | None = None
    gradient_accumulation_steps: int | None = None
    max_seq_len: int | None = None
    packing: bool | None = None
    repeat: int = 0
    #: its 1-based place in the plan's run order (None: not run from a plan)
    position: int | None = None
    #: every trainer argument (what the child trains with)
    arguments: dict[str, Any] = {}
    swept: dict[str, Any] = {}
    accelerate_config: str | None = None
    env: dict[str, str] = {}
    #: the scenarios file's data stanza (arguments override it)
    data_processing: dict[str, Any] | None = None
    #: the ``environments:`` entry it runs under, its interpreter, and the versions the
    #: plan found there (the child checks nothing of them; the report does)
    environment: str | None = None
    environment_python: str | None = None
    environment_versions: dict[str, str | None] = {}

    #: where rank 0 writes the result
    result_path: str = "result.json"
    #: where rank 0 keeps its step counter up to date while it trains (None: nowhere)
    progress_path: str | None = "progress.json"
    #: the trainer's own output folder
    output_dir: str = "trainer_output"
    #: cache of prepared (tokenized) datasets, shared by the runs of a results folder
    data_dir: str = "data"
    #: folders put first on ``sys.path`` before a ``python:`` model's module is imported
    #: (the parent gives the scenarios file's folder); relative ones are against the spec's
    python_path: list[str] = []
    #: what measures the GPU memory stages (before init, init, train; the predecessor's
    #: ``mem_*_torch_mem_alloc_in_bytes``): ``torch``, torch.cuda's counters read at
    #: stage boundaries (no thread); ``hf-tracker``, HF's TrainerMemoryTracker
    #: (``skip_memory_metrics=False``: a thread polls memory for all of training);
    #: None, neither. Old specs' ``hf_memory_metrics: true/false`` read as ``torch``/None.
    memory_stages: MemoryStages | None = "torch"
    #: train on the dataset file as it is: no formatting, no cache
    no_data_processing: bool = False
    #: steps recorded with torch.profiler after the warm-up and left out of the measured
    #: window (0: no profile, and no profiler imported)
    profile_steps: int = Field(default=0, ge=0)
    #: where each rank writes its trace (``rank<k>.json``) when profiled
    profile_dir: str | None = "profile"
    #: steady-state measuring: stop once the mean step time is known to a precision
    #: (``orchestrator.contract.steady``); None: train the fixed ``max_steps``
    measure: SteadyMeasure | None = None
    #: the host memory allocator the scenario states (``orchestrator.contract.allocators``):
    #: the job's environment sets it; the child records what is in force, whatever this says
    allocator: Allocator | None = None
    #: names this attempt of the run (a new one each time the parent writes the spec):
    #: the child writes into the run folder only while the spec file there still holds
    #: it (``is_current``), so an attempt that outlived its turn overwrites nothing of
    #: the next one's; None (a spec written by hand): always current
    attempt_token: str | None = None
    #: the file it was read from (``read_spec``)
    _source: Path | None = PrivateAttr(default=None)

    def is_current(self) -> bool:
        """Whether this attempt still owns its run folder: the spec file it was read from
        is there and holds its ``attempt_token`` (a later attempt moved it away, or
        wrote its own)."""
        if self.attempt_token is None or self._source is None:
            return True
        on_disk, unreadable = read_json_object_reason(self._source)
        if on_disk is None:
            # gone: a later attempt moved it away; there but unreadable (a spec is
            # written whole, so not another attempt's): this one's result is kept
            return unreadable is not None
        return on_disk.get("attempt_token") == self.attempt_token

    @model_validator(mode="before")
    @classmethod
    def _old_memory_flag(cls, data: Any) -> Any:
        # spec.json files written before memory_stages had a boolean hf_memory_metrics;
        # what it asked for (the stage figures) now comes from the thread-free counters
        if isinstance(data, dict) and "hf_memory_metrics" in data:
            data = dict(data)
            old = data.pop("hf_memory_metrics")
            if not isinstance(old, bool):
                raise ValueError(f"hf_memory_metrics must be true or false, got {old!r}")
            data.setdefault("memory_stages", "torch" if old else None)
        return data

    def resolve(self, base: Path) -> RunSpec:
        """The same spec with its paths made absolute against ``base``."""
        names = ("result_path", "output_dir", "data_dir", "progress_path", "profile_dir")
        update: dict[str, Any] = {
            name: str((base / getattr(self, name)).resolve())
            for name in names
            if getattr(self, name) is not None
        }
        update["python_path"] = [str((base / folder).resolve()) for folder in self.python_path]
        return self.model_copy(update=update)


def write_spec(spec: RunSpec, path: Path) -> None:
    write_atomic(path, json.dumps(spec.model_dump(mode="json"), indent=2, sort_keys=True) + "\n")


def read_spec(path: Path) -> RunSpec:
    """Read a spec file; paths in it are resolved against its folder."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"{path}: spec file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: cannot read the spec file ({exc})") from None
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}:{exc.lineno}: not valid JSON: {exc.msg}") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: a spec must be a JSON object")
    try:
        spec = RunSpec.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise UserError(
            f"{path}: {where + ': ' if where else ''}{first['msg']}"
            + (f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else "")
        ) from None
    if spec.schema_version != SPEC_SCHEMA_VERSION:
        raise UserError(
            f"{path}: spec schema_version {spec.schema_version} is not supported "
            f"(this tunematrix reads {SPEC_SCHEMA_VERSION})"
        )
    resolved = spec.resolve(path.parent)
    resolved._source = path.resolve()
    return resolved
