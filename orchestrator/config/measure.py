"""A scenario's ``measure:`` read into its settings, and the command line's override.

``measure: {until: steps}`` (or no ``measure:``) keeps the fixed ``max_steps``;
``measure: {until: steady, ...}`` resolves to ``SteadyMeasure`` with every
setting filled in (``orchestrator.contract.steady``). The checks that involve
the warm-up and a profile are the planner's (``orchestrator.matrix.measuring``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from orchestrator.config.schema import MeasureModel
from orchestrator.config.yamlio import Loc, YamlDoc
from orchestrator.contract.errors import UserError
from orchestrator.contract.steady import SteadyMeasure

_STEADY_ONLY = ("precision", "min_steps", "max_steps")


def resolve_measure(doc: YamlDoc, model: MeasureModel | None, loc: Loc) -> SteadyMeasure | None:
    """A scenario's steady-state settings; None for the fixed ``max_steps``."""
    if model is None:
        return None
    if model.until == "steps":
        for key in _STEADY_ONLY:
            if getattr(model, key) is not None:
                raise doc.error(
                    f"'{key}' applies to until: steady only; with until: steps a cell runs "
                    "its max_steps argument",
                    (*loc, key),
                )
        return None
    given = {k: getattr(model, k) for k in _STEADY_ONLY if getattr(model, k) is not None}
    settings = SteadyMeasure(**given)
    if settings.min_steps > settings.max_steps:
        raise doc.error(
            f"min_steps {settings.min_steps} is above max_steps {settings.max_steps}",
            (*loc, "min_steps" if "min_steps" in given else "max_steps"),
        )
    return settings


def measure_lines(doc: YamlDoc, model: MeasureModel | None, loc: Loc) -> dict[str, int | None]:
    """The lines of ``measure:`` and of each of its keys (``measure``, ``measure.<key>``),
    for the planner's errors."""
    if model is None:
        return {}
    keys = ("until", *_STEADY_ONLY)
    return {
        "measure": doc.line_of(loc),
        **{f"measure.{k}": doc.line_of((*loc, k)) for k in keys if k in model.model_fields_set},
    }


@dataclass(frozen=True)
class MeasureOverride:
    """The command line's ``--until``, ``--precision``, ``--min-steps``, ``--max-steps``
    (or run_benchmarks.sh's ``MEASURE_*``): they win over every scenario's ``measure:``."""

    until: str | None = None
    precision: float | None = None
    min_steps: int | None = None
    max_steps: int | None = None

    def __post_init__(self) -> None:
        if self.until not in (None, "steps", "steady"):
            raise UserError(f"until must be steps or steady, got {self.until!r}")
        if self.precision is not None and not 0 < self.precision < 1:
            raise UserError(
                f"precision must be above 0 and below 1 (0.02 is ±2%), got {self.precision}"
            )
        for name in ("min_steps", "max_steps"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or value <= 0):
                raise UserError(f"{name} must be a positive integer, got {value!r}")
        if self.until != "steady" and self._fields():
            flags = ", ".join(f"--{k.replace('_', '-')}" for k in self._fields())
            raise UserError(f"{flags} set steady-state measuring: add --until steady")

    def _fields(self) -> dict[str, float | int]:
        return {k: v for k in ("precision", "min_steps", "max_steps") if (v := getattr(self, k))}

    @property
    def empty(self) -> bool:
        return self.until is None

    def apply(self, scenario: SteadyMeasure | None) -> SteadyMeasure | None:
        """The settings of a scenario whose file says ``scenario``: the command line's
        mode, its values over the file's (then the defaults)."""
        if self.until is None:
            return scenario
        if self.until == "steps":
            return None
        base = scenario.model_dump() if scenario is not None else {}
        settings = SteadyMeasure(**{**base, **self._fields()})
        if settings.min_steps > settings.max_steps:
            raise UserError(
                f"min_steps {settings.min_steps} is above max_steps {settings.max_steps}"
                + (" (the scenario's measure: and the command line together)" if base else "")
            )
        return settings


def measure_override(measure: Mapping[str, Any] | MeasureOverride | None) -> MeasureOverride:
    """The API's ``measure=`` (a mapping shaped like the file's ``measure:``) as an override."""
    if measure is None:
        return MeasureOverride()
    if isinstance(measure, MeasureOverride):
        return measure
    fields = {f.name for f in dataclasses.fields(MeasureOverride)}
    unknown = sorted(set(measure) - fields)
    if unknown:
        raise UserError(
            f"measure: unknown key {unknown[0]!r}; allowed: until, precision, min_steps, max_steps"
        )
    return MeasureOverride(**measure)
