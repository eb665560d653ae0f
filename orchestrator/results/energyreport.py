"""summary.md's section on energy: each cell's energy per token beside its tokens/s, the
conditions it ran under, which cells ran throttled, and why a cell has no figure.

The figures are the sidecar's (``orchestrator.job.energy``) and the report's derived
ones (``orchestrator.results.aggregate.add_energy``). A cell whose measured steps ran
throttled past ``THROTTLED_SHARE`` of its samples says so in its row
(``gpu_conditions``) and in a line here; cells of one scenario that ran under
different conditions (power limit, throttling) are named, since their figures
compare the conditions as much as the setups.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from orchestrator.contract import columns as registry
from orchestrator.contract.columns import (
    CO2_PER_1M_TOKENS,
    ENERGY_COST_PER_1M_TOKENS,
    ENERGY_J,
    ENERGY_NOTE,
    ENERGY_PER_TOKEN,
    ENERGY_SOURCE,
    GPU_CONDITIONS,
    GPU_THROTTLED,
    KWH_PER_1M_TOKENS,
    POWER_MEAN,
    THROTTLED_SHARE,
    TOKENS_PER_SECOND,
)
from orchestrator.contract.wording import workers
from orchestrator.results.aggregate import CostSettings
from orchestrator.results.mdtable import md_table
from orchestrator.results.numbers import number, whole
from orchestrator.results.tablecolumns import ran_on_cpu

#: how the sidecar's notes of a missing figure start (``orchestrator.job.energy``)
NO_FIGURE = "no energy figure: "
#: the text of a cell's conditions that marks it throttled (``energy._pooled``)
THROTTLED = "throttled"
CLOCK_REASONS = "gpu_clock_reasons"
#: the columns of a cell the section reads
READ = (
    "cell_id",
    "status",
    "device",
    "num_gpus",
    "model_name_or_path",
    "framework_config",
    TOKENS_PER_SECOND,
    ENERGY_PER_TOKEN,
    POWER_MEAN,
    KWH_PER_1M_TOKENS,
    ENERGY_COST_PER_1M_TOKENS,
    CO2_PER_1M_TOKENS,
    ENERGY_SOURCE,
    ENERGY_NOTE,
    GPU_CONDITIONS,
    GPU_THROTTLED,
    CLOCK_REASONS,
)


def _text(value: Any) -> str:
    return "" if value is None or (isinstance(value, float) and value != value) else str(value)


def _figure(value: Any, digits: str = ".4g") -> str:
    found = number(value)
    return "–" if found is None else format(found, digits)


def _label(cell: Mapping[Any, Any]) -> str:
    on = workers(str(cell.get("device")) == "cpu", whole(cell.get("num_gpus")))
    return f"`{cell.get('cell_id')}` ({cell.get('model_name_or_path')}, {cell.get('framework_config')}, {on})"


def shows_energy(cells: pd.DataFrame) -> bool:
    """Whether the cells recorded anything about energy (an older folder did not)."""
    return any(
        c in cells.columns and cells[c].notna().any()
        for c in (ENERGY_J, ENERGY_NOTE, GPU_CONDITIONS)
    )


def conditions_differ(a: Mapping[Any, Any], b: Mapping[Any, Any]) -> str:
    """How two cells' conditions differ (``"700 W limit" vs "500 W limit"``), or ``""``."""
    first, second = _text(a.get(GPU_CONDITIONS)), _text(b.get(GPU_CONDITIONS))
    if not first or not second or first == second:
        return ""
    return f"{first} vs {second}"


def markdown(cells: pd.DataFrame, cost: CostSettings) -> list[str]:
    """The section; nothing for cells that recorded no energy at all."""
    if cells.empty or not shows_energy(cells):
        return []
    cpu = ran_on_cpu(cells)
    header = {
        name: registry.get(name).header
        for name in (TOKENS_PER_SECOND, ENERGY_PER_TOKEN, KWH_PER_1M_TOKENS)
    }
    power = "W per package" if cpu else registry.get(POWER_MEAN).header
    priced = cost.usd_per_kwh is not None
    emitted = cost.grams_co2_per_kwh is not None
    headers = [
        "cell",
        header[TOKENS_PER_SECOND],
        header[ENERGY_PER_TOKEN],
        power,
        header[KWH_PER_1M_TOKENS],
        *([registry.get(ENERGY_COST_PER_1M_TOKENS).header] if priced else []),
        *([registry.get(CO2_PER_1M_TOKENS).header] if emitted else []),
        "source",
        "conditions",
    ]
    # the records of only the columns read here (a cell has over a hundred)
    records = cells[[c for c in READ if c in cells.columns]].to_dict("records")
    body: list[list[str]] = []
    throttled: list[str] = []
    missing: dict[str, list[str]] = {}
    for c in records:
        conditions = _text(c.get(GPU_CONDITIONS))
        per_token = number(c.get(ENERGY_PER_TOKEN))
        if per_token is None:
            if c.get("status") == "ok":
                why = _text(c.get(ENERGY_NOTE)).removeprefix(NO_FIGURE) or "no energy recorded"
                missing.setdefault(why, []).append(f"`{c.get('cell_id')}`")
            if not conditions:
                continue
        body.append(_row(c, per_token, conditions, priced=priced, emitted=emitted))
        if THROTTLED in conditions:
            throttled.append(_slowed(c))
    lines = ["", "## Energy", "", _intro(cpu, cost)]
    if body:
        lines += ["", *md_table(headers, body)]
    if throttled:
        lines += [
            "",
            "Throttled (a power cap at the board's default limit is usual under full load; a "
            "lower limit, a thermal or a hardware slowdown is not):",
            "",
            *throttled,
        ]
    lines += _differing(cells)
    if missing:
        lines += ["", "No energy figure:", ""]
        for why, ids in missing.items():
            shown = ", ".join(ids[:5]) + (f" and {len(ids) - 5} more" if len(ids) > 5 else "")
            lines.append(f"- {why}: {shown}")
    return lines


def _row(
    c: Mapping[str, Any], per_token: float | None, conditions: str, *, priced: bool, emitted: bool
) -> list[str]:
    """A cell's row of the table."""
    return [
        f"`{c.get('cell_id')}`",
        _figure(c.get(TOKENS_PER_SECOND), ",.0f"),
        _figure(per_token),
        # the power of a row without energy per token is of another window
        _figure(c.get(POWER_MEAN), ".0f") if per_token is not None else "–",
        _figure(c.get(KWH_PER_1M_TOKENS)),
        *([_figure(c.get(ENERGY_COST_PER_1M_TOKENS), ".3g")] if priced else []),
        *([_figure(c.get(CO2_PER_1M_TOKENS), ".3g")] if emitted else []),
        _text(c.get(ENERGY_SOURCE)) or "–",
        conditions or "–",
    ]


def _slowed(c: Mapping[str, Any]) -> str:
    """The line of a cell that ran throttled."""
    share = number(c.get(GPU_THROTTLED))
    reasons = _text(c.get(CLOCK_REASONS))
    return (
        f"- {_label(c)} ran slowed"
        + (f" in {share:.0f}% of its measured samples" if share is not None else "")
        + (f" ({reasons})" if reasons else "")
        + ": its tokens/s and energy hold under these conditions only."
    )


def _intro(cpu: bool, cost: CostSettings) -> str:
    """What the section's figures cover, and the prices given."""
    prices = [
        *([f"${cost.usd_per_kwh:g} per kWh"] if cost.usd_per_kwh is not None else []),
        *(
            [f"{cost.grams_co2_per_kwh:g} g CO2 per kWh"]
            if cost.grams_co2_per_kwh is not None
            else []
        ),
    ]
    return (
        "Energy over the measured steps (the window tokens/s covers), all of a cell's "
        + ("CPU packages" if cpu else "GPUs")
        + " together, per real token: "
        + (
            "RAPL's package counter, which counts every process on the package, not only the job's."
            if cpu
            else "NVML's energy counter, else its power samples integrated (the source "
            "column says which). The GPUs alone: not the host's CPUs, memory or fans."
        )
        + (f" At {' and '.join(prices)} (your numbers)." if prices else "")
        + (
            ""
            if cpu
            else " Conditions: the lowest enforced power limit of the cell's GPUs, and "
            "`throttled` where one of them ran slowed (power cap, thermal, sync boost…) in "
            f"more than {100 * THROTTLED_SHARE:.0f}% of the measured samples."
        )
    )


def _differing(cells: pd.DataFrame) -> list[str]:
    """A line per scenario whose cells ran under different conditions."""
    if GPU_CONDITIONS not in cells.columns or "scenario" not in cells.columns:
        return []
    lines = []
    known = cells[cells[GPU_CONDITIONS].notna()]
    for scenario, group in known.groupby(known["scenario"].astype(str), sort=False):
        seen = list(dict.fromkeys(group[GPU_CONDITIONS].astype(str)))
        if len(seen) > 1:
            lines.append(
                f"- scenario {scenario}: its cells ran under different conditions ("
                + "; ".join(seen)
                + "): their figures compare the conditions as well as the setups."
            )
    return ["", "Different conditions:", "", *lines] if lines else []
