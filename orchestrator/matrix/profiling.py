"""Which cells are profiled (``profile: true`` in a scenario, or ``--profile``), and
the refusal of a profiled cell too short to leave a measured step. Pure."""

from __future__ import annotations

import dataclasses

from orchestrator.config.scenarios import BenchConfig, Scenario
from orchestrator.contract.errors import ConfigError
from orchestrator.contract.window import DEFAULT_PROFILE_STEPS, profile_problem
from orchestrator.matrix.experiment import Experiment


def profile_steps(scenario: Scenario, asked: bool, steps: int | None) -> int:
    """Steps to profile in ``scenario``'s cells (0: none). ``asked``/``steps``: the command
    line's ``--profile``/``--profile-steps``, which profile every cell."""
    if not (asked or steps or scenario.profile):
        return 0
    return steps or scenario.profile_steps or DEFAULT_PROFILE_STEPS


_MAX_STEPS_KEYS = ("sweep.max_steps", "arguments.max_steps")


def profiled(config: BenchConfig, scenario: Scenario, cell: Experiment, steps: int) -> Experiment:
    """``cell`` with ``steps`` profiled steps; a ``max_steps`` that would leave no measured
    step after the warm-up and the profile is refused, at the line that set it."""
    if steps <= 0:
        return cell
    max_steps = cell.int_argument("max_steps")
    if max_steps is not None:
        problem = profile_problem(max_steps, cell.int_argument("warmup_steps_excluded"), steps)
        if problem:
            # the line that set max_steps where the scenario did, else the scenario's
            key = next((k for k in _MAX_STEPS_KEYS if k in scenario.lines), None)
            raise ConfigError(
                f"scenario '{scenario.name}' is profiled, but {problem}",
                **config.where(scenario, key),
            )
    return dataclasses.replace(cell, profile_steps=steps)


def profile_note(scenario: Scenario, steps: int) -> str:
    return (
        f"scenario '{scenario.name}': {steps} steps after the warm-up are recorded with "
        "torch.profiler (runs/<id>/profile/) and left out of the measured window"
    )
