"""What became of an experiment: the statuses, the outcome record, and the out-of-memory evidence.

``Status`` is the one list of statuses a row can have; ``ACCEPTABLE`` says which
of them leave a run's exit code at 0. ``Outcome`` is the parent's record of one
run (``outcome.json``), written by ``write_outcome`` and read by
``read_outcome``, nowhere else. ``OOM_PATTERNS`` is the one list of
out-of-memory messages: the child uses it to classify its own exceptions, the
parent to read a stderr without a result.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from orchestrator.contract.jsonio import read_json_object
from orchestrator.contract.layout import RunPaths, write_atomic

Status = Literal["ok", "oom", "timeout", "failed", "interrupted", "skipped", "planned"]
#: every ``Status``, in the order tables list them
STATUSES: tuple[Status, ...] = get_args(Status)
#: statuses that do not fail a run (``oom`` is a finding; ``planned``: submitted, not run yet)
ACCEPTABLE: tuple[Status, ...] = ("ok", "oom", "skipped", "planned")
#: statuses whose measurements count (a ``skipped`` row kept an earlier run's figures)
MEASURED: tuple[Status, ...] = ("ok", "skipped")
#: statuses of a run that was tried and lost
LOST: tuple[Status, ...] = ("oom", "failed", "timeout", "interrupted")

#: the error of a pruned experiment (status ``skipped``, never launched) begins with
#: this: ``pruned: <id> ran out of memory`` (``orchestrator.matrix.prune``)
PRUNED_PREFIX = "pruned: "
#: how tables show a pruned experiment's status
PRUNED = "pruned"


def pruned_error(out_of_memory_id: str) -> str:
    """The error of an experiment pruned because ``out_of_memory_id`` ran out of memory."""
    return f"{PRUNED_PREFIX}{out_of_memory_id} ran out of memory"


def is_pruned(status: Any, error: Any) -> bool:
    """Whether a row (or outcome) is a pruned experiment: ``skipped`` without running, so
    no measurement (a ``skipped`` row otherwise kept an earlier ok run's figures)."""
    return status == "skipped" and isinstance(error, str) and error.startswith(PRUNED_PREFIX)


#: the error of an experiment not launched because two of its model's experiments had
#: failed with the same error (status ``skipped``): ``not launched: same error as <id>``
NOT_LAUNCHED_PREFIX = "not launched: "
#: how tables show such an experiment's status (one word: a cell of repeats shows
#: ``failed×2 spared×1``)
NOT_LAUNCHED = "spared"


_SAME_ERROR_AS = "same error as "


def not_launched_error(first_id: str) -> str:
    """The error of an experiment spared because cells like it fail as ``first_id`` did."""
    return f"{NOT_LAUNCHED_PREFIX}{_SAME_ERROR_AS}{first_id}"


#: the end of a spared experiment's error after a full disk (``not_launched_disk_full``)
_FULL_WHEN = re.compile(r" was full when (\S+) ran \(see its row\)$")


def not_launched_disk_full(first_id: str, folder: str | None) -> str:
    """The error of an experiment spared because the disk was full when ``first_id`` ran
    (every later run would fail alike, whatever its model)."""
    disk = f"the disk of {folder}" if folder else "the disk"
    return f"{NOT_LAUNCHED_PREFIX}{disk} was full when {first_id} ran (see its row)"


def _full_when(error: str) -> re.Match[str] | None:
    return _FULL_WHEN.search(error) if error.startswith(NOT_LAUNCHED_PREFIX) else None


def spared_by_full_disk(error: str) -> bool:
    """Whether a spared experiment's error is ``not_launched_disk_full``'s."""
    return _full_when(error) is not None


def not_launched_by(error: str) -> str:
    """The id of the failure a spared experiment's error names (``not_launched_error``,
    ``not_launched_disk_full``)."""
    full = _full_when(error)
    if full is not None:
        return full.group(1)
    return error.removeprefix(NOT_LAUNCHED_PREFIX).removeprefix(_SAME_ERROR_AS)


def is_not_launched(status: Any, error: Any) -> bool:
    """Whether a row (or outcome) was spared after its model's repeated failure."""
    return status == "skipped" and isinstance(error, str) and error.startswith(NOT_LAUNCHED_PREFIX)


def never_launched(status: Any, error: Any) -> bool:
    """``skipped`` without running (pruned, or spared): no measurement, and decided afresh
    by a resumed run."""
    return is_pruned(status, error) or is_not_launched(status, error)


def shown(status: Any, error: Any) -> str:
    """A status as tables show it: ``pruned`` and ``spared`` for the experiments skipped
    without running, else the status itself."""
    if is_pruned(status, error):
        return PRUNED
    if is_not_launched(status, error):
        return NOT_LAUNCHED
    return str(status)


def tally(outcomes: Iterable[Outcome]) -> dict[str, int]:
    """How many outcomes of each status, as tables show it (``shown``)."""
    out: dict[str, int] = {}
    for outcome in outcomes:
        status = shown(outcome.status, outcome.error)
        out[status] = out.get(status, 0) + 1
    return out


OOM_PATTERNS = (
    re.compile(r"CUDA out of memory", re.IGNORECASE),
    re.compile(r"HIP out of memory", re.IGNORECASE),
    re.compile(r"MPS backend out of memory", re.IGNORECASE),
    re.compile(r"(?:CUDA|HIP|XPU) error: out of memory", re.IGNORECASE),
    re.compile(r"torch\.(cuda\.)?OutOfMemoryError"),
    re.compile(r"\bOutOfMemoryError\b"),
    re.compile(r"CUBLAS_STATUS_ALLOC_FAILED"),
    re.compile(r"\bMemoryError\b"),
)


def looks_like_oom(text: str) -> bool:
    """Whether ``text`` (an exception message or a stderr tail) reports out-of-memory."""
    return any(p.search(text) for p in OOM_PATTERNS)


class Outcome(BaseModel):
    """The parent's record of one run of an experiment (``runs/<id>/outcome.json``)."""

    # unknown keys of an older or newer record are ignored; assignments are checked
    model_config = ConfigDict(extra="ignore", validate_assignment=True)

    status: Status
    error: str | None = None
    #: the log that explains the run, relative to the results folder
    log: str | None = None
    returncode: int | None = None
    #: from the experiment's start to the end of its cleanup (sidecar, job, stop); in a
    #: shared launch, from the end of the run before it (or the launch) to its own end
    wall_s: float | None = None
    #: from launching the job to its exit: the child's own lifetime
    job_s: float | None = None
    started_at: str | None = None
    finished_at: str | None = None
    #: the sidecar's summary (``orchestrator.job.sidecar.summarize``), with its utilisation
    #: figures (``orchestrator.job.utilisation.summarize``: ``gpu_util_mean_pct``,
    #: ``gpu_util_p10_pct``, ``gpu_mem_bw_util_mean_pct``, ``cpu_util_mean_pct``,
    #: ``cpu_allowed``, ``util_window``); the ``sidecar`` columns of the registry read it
    memory: dict[str, Any] = Field(default_factory=dict)
    memory_backend: str | None = None
    gpu_device_name: str | None = None
    devices: list[str] = Field(default_factory=list)
    attempt: int = 1
    #: ``alone``, ``packed`` (with ``packed_with``: the jobs that ran beside it) or
    #: ``shared`` (one launch after other experiments, or before them: ``launch_id``)
    run_mode: str = "alone"
    packed_with: list[str] = Field(default_factory=list)
    #: the name of the executor that ran it (``local``, ``packed``, ...)
    executor: str = "local"
    #: the executor's own id of the job, where it has one
    job_id: str | None = None
    #: the launch it ran in (``accelerate launch``; ``shared``: with other experiments,
    #: ``--launch family``), its 1-based place there and how many experiments it held
    launch_id: str | None = None
    launch_position: int | None = None
    launch_size: int | None = None
    #: what the launch cost before training, paid once however many experiments it held:
    #: from the launch to the end of its first run's first step, less that run's model
    #: load and first step (the launcher, the interpreter, the imports, the data, the
    #: trainer's construction)
    launch_overhead_s: float | None = None
    #: where the wall time went, phases that add up to ``wall_s`` (``orchestrator.job.phases``:
    #: ``launch_s``, ``imports_s``, ``model_s``, ``data_s``, ``first_step_s``, ``training_s``,
    #: ``after_training_s``); a phase the run did not reach is None
    phases: dict[str, float | None] = Field(default_factory=dict)
    #: the wait before launch for the GPUs to cool (``--cool-down``;
    #: ``orchestrator.job.cooldown``): ``wait_s``, ``start_c`` (at launch, the GPU furthest above its mark),
    #: ``target_c``, and ``note`` where the wait ran out or could not be made
    cooldown: dict[str, Any] = Field(default_factory=dict)

    def as_dict(self, *, recorded_only: bool = False) -> dict[str, Any]:
        """Every field, as JSON values (what ``outcome.json`` holds).

        ``recorded_only``: only the fields the record it was read from had (an
        older or hand-written record leaves the others out, rather than defaulted).
        """
        return self.model_dump(mode="json", exclude_unset=recorded_only)


#: an older record named its job id ``<executor>_job_id``
_OLD_JOB_ID = re.compile(r"^([a-z][a-z0-9]*)_job_id$")


def outcome_from_record(record: dict[str, Any]) -> Outcome | None:
    """An ``Outcome`` from the mapping an ``outcome.json`` holds; None if it is not one.

    Records written before the executor field was generic carry the job id as
    ``<executor>_job_id``: that maps to ``executor`` and ``job_id``.
    """
    record = dict(record)
    for key in [k for k in record if _OLD_JOB_ID.match(k)]:
        value = record.pop(key)
        match = _OLD_JOB_ID.match(key)
        if value is not None and match is not None and record.get("job_id") is None:
            record["executor"], record["job_id"] = match.group(1), str(value)
    try:
        return Outcome.model_validate(record)
    except ValidationError:
        return None


def read_outcome(run: RunPaths | Path) -> Outcome | None:
    """The outcome of a run folder (or an ``outcome.json`` path); None where there is none."""
    path = run.outcome if isinstance(run, RunPaths) else run
    data = read_json_object(path)
    return outcome_from_record(data) if data is not None else None


def write_outcome(run: RunPaths, outcome: Outcome) -> None:
    """Write a run's ``outcome.json`` atomically."""
    write_atomic(run.outcome, json.dumps(outcome.as_dict(), indent=2, sort_keys=True) + "\n")
