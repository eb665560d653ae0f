"""How a shared launch (``--launch family``) tells its runs apart in its one output.

The child writes ``marker`` on stdout and stderr as each run of a launch of
several begins; the parent cuts the launch's logs at those lines
(``split_log``) into each run's own ``stdout.log`` and ``stderr.log``. A
launch of one run writes no marker, so its logs are as they always were.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

_PREFIX = "==> tunematrix shared launch: run "
_MARKER = re.compile(re.escape(_PREFIX) + r"(\d+) of (\d+): (\S+)$")


def marker(position: int, size: int, experiment_id: str) -> str:
    """The line that opens run ``position`` (1-based) of ``size`` in a launch's logs."""
    return f"{_PREFIX}{position} of {size}: {experiment_id}"


def split_log(text: str, experiment_ids: Sequence[str]) -> dict[str, str]:
    """Each run's part of a launch's log: from the first marker of its run to the first
    marker of a later one (every rank writes a marker; the first opens the part).

    What comes before the first marker (the launcher's own lines) goes to the first
    run; a run without a marker gets nothing.
    """
    position = {eid: i for i, eid in enumerate(experiment_ids)}
    parts: dict[str, list[str]] = {}
    current = 0 if experiment_ids else None
    for line in text.splitlines(keepends=True):
        found = _MARKER.match(line.rstrip("\r\n"))
        if found is not None and found.group(3) in position:
            index = position[found.group(3)]
            if current is None or index > current:
                current = index
        if current is not None:
            parts.setdefault(experiment_ids[current], []).append(line)
    return {eid: "".join(lines) for eid, lines in parts.items()}
