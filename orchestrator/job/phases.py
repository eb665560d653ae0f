"""Where a run's wall time went: consecutive phases that add up to it.

The parent knows when a run's wall time starts and ends; the child records the
instants in between (``RunTimings``' ``*_unix`` fields, on the same clock: the
host's Unix time). Each phase runs from one instant to the next, so together
they are the wall time:

- ``launch``: the wall's start to the run's start: the sidecar, ``accelerate
  launch``'s own interpreter and imports, torchrun's spawn, until the child's
  process starts. In a shared launch (``--launch family``) a later run's is the
  hand-over: from the run before's result written to this run's start;
- ``imports``: the child's interpreter, its checks and the training stack's
  imports (a later run of a shared launch imports nothing: it frees what the run
  before left, and checks its spec);
- ``model``: the run's settings built and the model loaded;
- ``data``: the data prepared, or read from the prepared-data cache;
- ``first_step``: the trainer built (and wrapped by FSDP or DeepSpeed) and its
  first optimizer step, a warm-up step;
- ``training``: the first step's end to the last one's;
- ``after_training``: the last step to the wall's end: the trainer's wrap-up,
  the memory peaks, eval where asked, the ranks' records gathered and the
  result written, the processes' exit and the launcher's, and the stop of the
  job's process group and sidecar (in a shared launch, a run's ends with its
  result written, but the last run's, which holds the launch's exit).

A phase whose ends were not both recorded (a run that failed before its first
step has no ``training``) is None.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from orchestrator.contract.columns import PHASE_COLUMNS

#: the phases, in order (their columns are declared with them)
PHASES = tuple(PHASE_COLUMNS)
#: the child's instants that end each phase but the last (``RunTimings``)
_ENDS = (
    "run_start_unix",
    "imports_end_unix",
    "model_end_unix",
    "data_end_unix",
    "first_step_unix",
    "train_end_unix",
)
#: how far two clocks of one host may disagree (a phase this much below 0 is 0)
_SLACK_S = 0.05


def phase_seconds(
    start_unix: float | None, end_unix: float | None, timings: Mapping[str, Any] | None
) -> dict[str, float | None]:
    """``{"<phase>_s": seconds}`` of a run whose wall ran from ``start_unix`` to
    ``end_unix``, from its result's ``timings`` (None where not recorded)."""
    timings = timings or {}
    points: list[float | None] = [start_unix]
    for key in _ENDS:
        value = timings.get(key)
        points.append(float(value) if isinstance(value, (int, float)) else None)
    points.append(end_unix)
    out: dict[str, float | None] = {}
    for name, begin, end in zip(PHASES, points, points[1:], strict=False):
        seconds = None
        if begin is not None and end is not None and end - begin > -_SLACK_S:
            seconds = max(0.0, end - begin)
        out[f"{name}_s"] = seconds
    return out
