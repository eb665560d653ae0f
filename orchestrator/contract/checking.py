"""The check before launch: what the parent sends the child's check and how the answer
comes back (``orchestrator.running.stackcheck`` asks, ``trainer_entry.check`` answers).

The request, on the check's stdin: ``{"cells": [{"id": <cell id>, "spec": <spec.json
without its paths>}, …]}``. The answer, on the stdout line that starts with
``ANSWER``: ``{"versions": {package: version}, "models": {name: {"cell", "where",
"offline"} or {"cell", "error"}}, "problems": [{"cell", "key", "library", "version",
"message"}], "unbuilt": <GPU cells whose trainer configuration was not built>,
"unbuilt_cells": [<their cell ids>], "seconds": …}``. A problem's ``key`` is None where no one setting is to blame.
"""

from __future__ import annotations

#: what starts the answer's line on stdout (a library may print other lines there)
ANSWER = "tunematrix-check: "
