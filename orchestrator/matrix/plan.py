"""A plan: the experiments of a matrix, in run order, with where each axis came from.

Built by :func:`orchestrator.matrix.expand.build_plan`; shown by
:mod:`orchestrator.matrix.table`; run by :mod:`orchestrator.running.runner`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from orchestrator.config.environments import Environment
from orchestrator.matrix.experiment import Experiment


@dataclass(frozen=True)
class Axis:
    """The values of one axis of the matrix."""

    values: tuple[Any, ...]
    #: where the values came from (``command line``, ``scenarios file``, ``default``…),
    #: for the plan header
    source: str


@dataclass(frozen=True)
class Plan:
    """The experiments to run and how they were chosen."""

    #: every experiment, in run order (``orchestrator.matrix.order``), each with its position
    experiments: tuple[Experiment, ...]
    #: ``gpu`` or ``cpu``
    device: str
    #: why that device (``requested``, ``2 GPU(s) detected``…)
    device_source: str
    #: num_gpus, effective_batch_size, max_seq_len and packing, in that order
    axes: Mapping[str, Axis]
    repeats: Axis
    #: the selected scenarios, in file order
    scenarios: tuple[str, ...]
    #: argument names swept by at least one selected scenario, in first-seen order
    swept_keys: tuple[str, ...]
    #: lines for the plan header: scenarios left out, GPU scenarios planned on the CPU…
    notes: tuple[str, ...] = field(default=())
    #: the interpreters every cell runs under, probed (``environments:``); empty: this one
    environments: tuple[Environment, ...] = field(default=())
    #: scenario -> axis -> the setting that pinned the axis for it ("the scenario's
    #: arguments", "defaults.yaml", ...): its rows use their own value, not the axis
    pinned_axes: Mapping[str, Mapping[str, str]] = field(default_factory=dict)

    def cells(self) -> list[Experiment]:
        """One experiment per cell (its first in run order): the repeats are the same cell."""
        seen: dict[str, Experiment] = {}
        for e in self.experiments:
            seen.setdefault(e.cell_id, e)
        return list(seen.values())
