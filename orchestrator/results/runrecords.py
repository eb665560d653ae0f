"""What the report reads of a results folder's runs besides their rows.

Beside a run's row, the loss check and compare read its swept values and
``max_steps`` (``spec.json``; the swept values from ``result.json`` where the
spec has none) and its loss history (``result.json``). The read of the folder
(``collect.rows_from_folder``) has parsed both files already and keeps these
here, and only these (a run's step times are most of its result, and the
report's memory), so that nothing is read twice; a run it did not keep (a
run's own rows handed to the report, an experiment id that is not its folder's
name) is read from its folder when first asked, once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

from orchestrator.contract.jsonio import read_json_object
from orchestrator.contract.layout import ResultsLayout

Record = dict[str, Any] | None


class _Kept(NamedTuple):
    swept: dict[str, Any] | None
    #: whether the spec has its arguments (then ``max_steps`` is theirs, None included)
    has_arguments: bool
    max_steps: Any
    loss_history: Any

    @classmethod
    def of(cls, spec: Record, result: Record) -> _Kept:
        swept = None
        for record in (spec, result):  # result.json's only where the spec has none
            if record is not None and isinstance(record.get("swept"), dict):
                swept = dict(record["swept"])
                break
        arguments = (spec or {}).get("arguments")
        has_arguments = isinstance(arguments, dict)
        return cls(
            swept=swept,
            has_arguments=has_arguments,
            max_steps=arguments.get("max_steps") if isinstance(arguments, dict) else None,
            loss_history=(result or {}).get("loss_history"),
        )


class RunRecords:
    """Per experiment: its swept values, its ``max_steps`` and its loss history."""

    def __init__(self, source: Path) -> None:
        self.layout = ResultsLayout(source)
        self._kept: dict[str, _Kept] = {}

    def keep(self, experiment_id: str, spec: Record, result: Record) -> None:
        """What the folder's read parsed of one run (its folder named ``experiment_id``)."""
        self._kept[experiment_id] = _Kept.of(spec, result)

    def _get(self, experiment_id: str) -> _Kept:
        kept = self._kept.get(experiment_id)
        if kept is None:
            run = self.layout.run(experiment_id)
            kept = _Kept.of(read_json_object(run.spec), read_json_object(run.result))
            self._kept[experiment_id] = kept
        return kept

    def swept(self, experiment_id: str) -> dict[str, Any] | None:
        """Its swept values as planned (``spec.json``, else ``result.json``); None if neither says."""
        return self._get(experiment_id).swept

    def max_steps(self, experiment_id: str) -> tuple[bool, Any]:
        """Whether its spec has arguments, and their ``max_steps`` (None where unset)."""
        kept = self._get(experiment_id)
        return kept.has_arguments, kept.max_steps

    def loss_history(self, experiment_id: str) -> Any:
        """Its result's ``loss_history`` as written (None without a result or one)."""
        return self._get(experiment_id).loss_history
