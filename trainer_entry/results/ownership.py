"""Whether this run may still write into its run folder.

The parent writes a new ``attempt_token`` into ``spec.json`` each time it launches a
run; a resume first moves an earlier attempt's files (its spec among them) into
``attempts/<n>/``. A child that outlived its attempt (its orchestrator killed, its
job not yet stopped) finds the spec file gone or holding another token, and writes
nothing more there: not its result, not its progress (``RunSpec.is_current``).
"""

from __future__ import annotations

import sys

from orchestrator.contract.spec import RunSpec

_said: set[str] = set()


def may_write(spec: RunSpec, what: str) -> bool:
    """Whether this attempt still owns its folder; says once on stderr when not."""
    if spec.is_current():
        return True
    if spec.experiment_id not in _said:
        _said.add(spec.experiment_id)
        print(
            f"trainer_entry: a later attempt of {spec.experiment_id} owns its run folder "
            f"(spec.json moved or rewritten); this attempt writes nothing there ({what} "
            "not written)",
            file=sys.stderr,
            flush=True,
        )
    return False
