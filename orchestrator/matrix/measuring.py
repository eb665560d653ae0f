"""Which cells measure until steady state (``measure: {until: steady}`` in a scenario, or
``--until steady``), their ids and step cap, and the refusal of settings that could
never stop on their precision. Pure."""

from __future__ import annotations

import dataclasses

from orchestrator.config.measure import MeasureOverride
from orchestrator.config.scenarios import BenchConfig, Scenario
from orchestrator.contract.errors import ConfigError
from orchestrator.contract.steady import SteadyMeasure, measure_problem
from orchestrator.matrix.experiment import Experiment
from orchestrator.matrix.ids import spec_hash


def measure_of(scenario: Scenario, override: MeasureOverride) -> SteadyMeasure | None:
    """The steady-state settings of ``scenario``'s cells (None: the fixed max_steps); the
    command line's win over the file's."""
    return override.apply(scenario.measure)


def _key(scenario: Scenario) -> str | None:
    for key in ("measure.max_steps", "measure.min_steps", "measure"):
        if key in scenario.lines:
            return key
    return None


def steady_id(experiment_id: str, settings: SteadyMeasure) -> str:
    """``experiment_id`` with the settings hashed into its ``-<hash8>``: a steady cell is
    another experiment than the same cell run for a fixed number of steps."""
    readable, _, digest = experiment_id.rpartition("-")
    return f"{readable}-{spec_hash({'cell': digest, 'measure': settings.identity()})}"


def measured(
    config: BenchConfig,
    scenario: Scenario,
    cell: Experiment,
    settings: SteadyMeasure | None,
    profile_steps: int = 0,
) -> Experiment:
    """``cell`` measured until steady state: its ids carry the settings and its trainer's
    ``max_steps`` is the settings' cap. Settings that leave fewer measured steps than a
    stop needs, after the warm-up and ``profile_steps`` profiled steps, are refused at
    the line that set them (the scenario's, where the command line did)."""
    if settings is None:
        return cell
    problem = measure_problem(settings, cell.int_argument("warmup_steps_excluded"), profile_steps)
    if problem is None and cell.arguments.get("instrumentation") is False:
        problem = "instrumentation is off, so no step is timed"
    if problem:
        # the scenario's measure: set it, or the command line did (--until steady)
        by = "" if scenario.measure == settings else " (as the command line asks)"
        raise ConfigError(
            f"scenario '{scenario.name}' measures until steady state{by}, but {problem}",
            **config.where(scenario, _key(scenario)),
        )
    return dataclasses.replace(
        cell,
        experiment_id=steady_id(cell.experiment_id, settings),
        cell_id=steady_id(cell.cell_id, settings),
        arguments={**cell.arguments, "max_steps": settings.max_steps},
        measure=settings,
    )


def measure_note(scenario: Scenario, settings: SteadyMeasure) -> str:
    return f"scenario '{scenario.name}': each cell runs {settings.describe()}"
