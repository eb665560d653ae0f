"""The result of a run that did not finish: status, one-line error, which rank."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from orchestrator.contract.outcome import Status
from orchestrator.contract.result import (
    LAUNCH_ID_ENV,
    ChildResult,
    ResultError,
    RunTimings,
    load_result,
    one_line,
    timestamp,
    write_result,
)
from orchestrator.contract.spec import RunSpec
from trainer_entry.measure.hostallocator import in_force
from trainer_entry.results.ownership import may_write
from trainer_entry.spec_errors import SpecError


def describe(exc: BaseException) -> str:
    """One line: the message alone for bad input, the exception class and message otherwise."""
    if isinstance(exc, SpecError):
        return one_line(str(exc))
    text = str(exc).strip()
    return one_line(f"{type(exc).__name__}: {text}" if text else type(exc).__name__)


def launch_id() -> str:
    """Shared by the ranks of one launch, on every node of it.

    The parent names each launch (``TUNEMATRIX_LAUNCH_ID``, the same on every
    node of a multi-node job); a run started by hand falls back to the ranks'
    common parent (this node's launcher) and its start time.
    """
    given = os.environ.get(LAUNCH_ID_ENV)
    if given:
        return given
    ppid = os.getppid()
    try:
        import psutil

        return f"{ppid}-{psutil.Process(ppid).create_time():.3f}"
    except Exception:
        return str(ppid)


def _earlier_failure(path: Path) -> ChildResult | None:
    try:
        return load_result(path)
    except ResultError:
        return None  # not a report a peer of this launch wrote: replace it


def write_failure(
    spec: RunSpec, status: Status, exc: BaseException, timings: dict[str, float]
) -> str:
    """Record the failure in ``result.json`` unless a peer rank of this launch already did.

    When one rank fails, the launcher stops the others with SIGTERM; their
    "interrupted" must not replace the first rank's report of what went wrong.
    A failure recorded by an earlier launch is replaced.
    """
    message = describe(exc)
    path = Path(spec.result_path)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    this_launch = launch_id()
    existing = _earlier_failure(path) if world > 1 else None
    if existing is not None and existing.status != "ok" and existing.launch_id == this_launch:
        return message
    model = spec.arguments.get("model_name_or_path", spec.model_name_or_path)
    try:  # the conditions it failed under, on every row; never at the cost of the record
        allocator, allocator_settings = in_force()
    except Exception:
        allocator, allocator_settings = None, None
    result = ChildResult(
        experiment_id=spec.experiment_id,
        cell_id=spec.cell_id,
        scenario=spec.scenario,
        framework_config=spec.framework_config,
        # a name that is not a string is what failed; it is reported as written
        model_name_or_path=model if model is None or isinstance(model, str) else str(model),
        repeat=spec.repeat,
        swept=spec.swept,
        status=status,
        error=message,
        error_type=type(exc).__name__,
        error_rank=int(os.environ.get("RANK", "0")),
        world_size=world,
        launch_id=this_launch,
        allocator=allocator,
        allocator_settings=allocator_settings,
        timings=RunTimings.model_validate(timings),
        finished_at=timestamp(),
    )
    if not may_write(spec, "the failure's result.json"):
        return message
    try:
        write_result(path, result)
    except OSError as write_error:
        print(f"trainer_entry: could not write {path}: {write_error}", file=sys.stderr)
    return message
