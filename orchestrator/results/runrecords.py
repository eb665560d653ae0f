"""The records of a results folder's runs that the report reads besides their rows.

Beside a run's row, the loss check and compare read its ``spec.json`` (the
swept values, ``max_steps``) and its ``result.json`` (the loss history). The
read of the folder (``collect.rows_from_folder``) has parsed both already, and
keeps them here, so that nothing is read twice; a run it did not keep (a run's
own rows, handed to the report) is read from its folder when asked, once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orchestrator.contract.jsonio import read_json_object
from orchestrator.contract.layout import ResultsLayout

Record = dict[str, Any] | None


class RunRecords:
    """Each run's ``spec.json`` and ``result.json`` as parsed (None where it has none)."""

    def __init__(self, source: Path) -> None:
        self.layout = ResultsLayout(source)
        self._specs: dict[str, Record] = {}
        self._results: dict[str, Record] = {}

    def keep(self, experiment_id: str, spec: Record, result: Record) -> None:
        """What the folder's read parsed of one run."""
        self._specs[experiment_id] = spec
        self._results[experiment_id] = result

    def spec(self, experiment_id: str) -> Record:
        if experiment_id not in self._specs:
            self._specs[experiment_id] = read_json_object(self.layout.run(experiment_id).spec)
        return self._specs[experiment_id]

    def result(self, experiment_id: str) -> Record:
        if experiment_id not in self._results:
            self._results[experiment_id] = read_json_object(self.layout.run(experiment_id).result)
        return self._results[experiment_id]
