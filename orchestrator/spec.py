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

from pydantic import BaseModel, ConfigDict, ValidationError

from orchestrator.errors import UserError
from orchestrator.experiment import Experiment
from orchestrator.paths import RunPaths, write_atomic

SPEC_SCHEMA_VERSION = 1


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
    effective_batch_size: int | None = None
    per_device_train_batch_size: int | None = None
    gradient_accumulation_steps: int | None = None
    max_seq_len: int | None = None
    packing: bool | None = None
    repeat: int = 0
    #: every trainer argument (what the child trains with)
    arguments: dict[str, Any] = {}
    swept: dict[str, Any] = {}
    accelerate_config: str | None = None
    env: dict[str, str] = {}
    #: the scenarios file's data stanza (arguments override it)
    data_processing: dict[str, Any] | None = None

    #: where rank 0 writes the result
    result_path: str = "result.json"
    #: the trainer's own output folder
    output_dir: str = "trainer_output"
    #: cache of prepared (tokenized) datasets, shared by the runs of a results folder
    data_dir: str = "data"
    #: collect the HF Trainer's memory metrics (``skip_memory_metrics=False``)
    hf_memory_metrics: bool = False
    #: train on the dataset file as it is: no formatting, no cache
    no_data_processing: bool = False

    def resolve(self, base: Path) -> RunSpec:
        """The same spec with its paths made absolute against ``base``."""
        return self.model_copy(
            update={
                name: str((base / getattr(self, name)).resolve())
                for name in ("result_path", "output_dir", "data_dir")
            }
        )


def spec_for(
    experiment: Experiment,
    run: RunPaths,
    data_dir: Path,
    *,
    hf_memory_metrics: bool,
    no_data_processing: bool,
) -> RunSpec:
    """The spec of one experiment's run, with absolute paths."""
    return RunSpec(
        **experiment.spec(),
        result_path=str(run.result.resolve()),
        output_dir=str(run.output_dir.resolve()),
        data_dir=str(data_dir.resolve()),
        hf_memory_metrics=hf_memory_metrics,
        no_data_processing=no_data_processing,
    )


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
            f"{path}: {where}: {first['msg']}"
            + (f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else "")
        ) from None
    if spec.schema_version != SPEC_SCHEMA_VERSION:
        raise UserError(
            f"{path}: spec schema_version {spec.schema_version} is not supported "
            f"(this tunematrix reads {SPEC_SCHEMA_VERSION})"
        )
    return spec.resolve(path.parent)
