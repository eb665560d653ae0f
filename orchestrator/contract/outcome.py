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

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

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

#: how tables show a pruned experiment's status (``skipped``: a cell of its ladder ran out
#: of memory, or it was predicted to need more than its device has)
PRUNED = "pruned"
#: how tables show a spared one's (one word: a cell of repeats shows ``failed×2 spared×1``)
NOT_LAUNCHED = "spared"

#: why an experiment was recorded ``skipped`` without being launched
SkipCause = Literal["out_of_memory", "predicted_over", "same_error", "disk_full"]
#: the words its error starts with, by the kind of skip
_PREFIX = {PRUNED: "pruned: ", NOT_LAUNCHED: "not launched: "}
_RAN_OUT = re.compile(r"^(\S+) ran out of memory$")
_FULL_WHEN = re.compile(r"^(?:the disk of (.+)|the disk) was full when (\S+) ran \(see its row\)$")
_SAME_ERROR_AS = "same error as "


class Skip(BaseModel):
    """Why an experiment was not launched: the data its error's words are made from.

    ``cause``: a cell of its ladder ran out of memory (``out_of_memory``), its predicted
    memory is over its device's (``predicted_over``), cells like it failed with the same
    error (``same_error``), or the disk was full (``disk_full``). ``follows``: the
    experiment it follows from (the one that ran out of memory, failed first, or found
    the disk full); ``detail``: the prediction's words, or the full disk's folder.
    """

    model_config = ConfigDict(frozen=True)

    cause: SkipCause
    follows: str | None = None
    detail: str | None = None

    @property
    def kind(self) -> str:
        """``pruned`` (memory) or ``spared`` (a repeated failure, a full disk)."""
        return PRUNED if self.cause in ("out_of_memory", "predicted_over") else NOT_LAUNCHED

    @property
    def because(self) -> str:
        """Why, in words (the error without its first words)."""
        if self.cause == "out_of_memory":
            return f"{self.follows} ran out of memory"
        if self.cause == "predicted_over":
            return self.detail or "predicted to need more memory than the device has"
        if self.cause == "disk_full":
            disk = f"the disk of {self.detail}" if self.detail else "the disk"
            return f"{disk} was full when {self.follows} ran (see its row)"
        return f"{_SAME_ERROR_AS}{self.follows}"

    @property
    def error(self) -> str:
        """The outcome's error: ``pruned: <why>`` or ``not launched: <why>``."""
        return _PREFIX[self.kind] + self.because


#: why a run failed, where what follows depends on it: the disk was full (every later
#: run writing there fails alike), or the error says too little to stand for another
#: cell's (a SIGKILL of unknown cause, an exit without a word)
FailureCause = Literal["disk_full", "unexplained"]


class Failure(BaseModel):
    """What a failed run's error was made from, for the readers that decide on it."""

    cause: FailureCause
    #: ``disk_full``: the folder whose disk was full, where known
    folder: str | None = None


def skip_from_error(error: Any) -> Skip | None:
    """The skip an error's words were made from, for the records that hold only the words:
    a summary table (raw_summary.csv), an ``outcome.json`` written before ``skip``. The one
    place the words are read back; everything else reads the ``Skip``."""
    if not isinstance(error, str):
        return None
    if error.startswith(_PREFIX[PRUNED]):
        rest = error[len(_PREFIX[PRUNED]) :]
        ran_out = _RAN_OUT.match(rest)
        if ran_out:
            return Skip(cause="out_of_memory", follows=ran_out.group(1))
        return Skip(cause="predicted_over", detail=rest)
    if error.startswith(_PREFIX[NOT_LAUNCHED]):
        rest = error[len(_PREFIX[NOT_LAUNCHED]) :]
        full = _FULL_WHEN.match(rest)
        if full:
            return Skip(cause="disk_full", follows=full.group(2), detail=full.group(1))
        return Skip(cause="same_error", follows=rest.removeprefix(_SAME_ERROR_AS))
    return None


def skip_of(status: Any, error: Any) -> Skip | None:
    """A row's (or outcome's) skip: ``skipped`` without running, pruned or spared; None for
    any other row (a ``skipped`` row otherwise kept an earlier ok run's figures)."""
    return skip_from_error(error) if status == "skipped" else None


def is_pruned(status: Any, error: Any) -> bool:
    """Whether a row (or outcome) is a pruned experiment: no measurement."""
    skip = skip_of(status, error)
    return skip is not None and skip.kind == PRUNED


def is_not_launched(status: Any, error: Any) -> bool:
    """Whether a row (or outcome) was spared after its model's repeated failure (or a
    full disk)."""
    skip = skip_of(status, error)
    return skip is not None and skip.kind == NOT_LAUNCHED


def never_launched(status: Any, error: Any) -> bool:
    """``skipped`` without running (pruned, or spared): no measurement, and decided afresh
    by a resumed run."""
    return skip_of(status, error) is not None


def shown(status: Any, error: Any) -> str:
    """A status as tables show it: ``pruned`` and ``spared`` for the experiments skipped
    without running, else the status itself."""
    skip = skip_of(status, error)
    return skip.kind if skip is not None else str(status)


def tally(outcomes: Iterable[Outcome]) -> dict[str, int]:
    """How many outcomes of each status, as tables show it (``shown``)."""
    out: dict[str, int] = {}
    for outcome in outcomes:
        out[outcome.shown_status] = out.get(outcome.shown_status, 0) + 1
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
    #: why a ``skipped`` experiment was not launched (its ``error`` is made from it)
    skip: Skip | None = None
    #: why a ``failed`` one failed, where that decides what follows (its ``error`` says it)
    failure: Failure | None = None
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

    @model_validator(mode="before")
    @classmethod
    def _skip_from_words(cls, data: Any) -> Any:
        """A ``skipped`` record with only its error's words (written before ``skip``, or
        made from a table's row) gets the skip they were made from."""
        if isinstance(data, dict) and data.get("status") == "skipped" and not data.get("skip"):
            found = skip_from_error(data.get("error"))
            if found is not None:
                data = {**data, "skip": found}
        return data

    @property
    def shown_status(self) -> str:
        """The status as tables show it: ``pruned`` and ``spared`` for a skip."""
        return self.skip.kind if self.skip is not None else self.status

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


def skipped(skip: Skip, attempt: int = 1) -> Outcome:
    """The outcome of an experiment not launched, for ``skip``'s reason."""
    return Outcome(status="skipped", error=skip.error, skip=skip, attempt=attempt)


def read_outcome(run: RunPaths | Path) -> Outcome | None:
    """The outcome of a run folder (or an ``outcome.json`` path); None where there is none."""
    path = run.outcome if isinstance(run, RunPaths) else run
    data = read_json_object(path)
    return outcome_from_record(data) if data is not None else None


def write_outcome(run: RunPaths, outcome: Outcome) -> None:
    """Write a run's ``outcome.json`` atomically."""
    write_atomic(run.outcome, json.dumps(outcome.as_dict(), indent=2, sort_keys=True) + "\n")
