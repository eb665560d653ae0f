"""summary.md's lines on steady-state measuring: how sure the step times are, and which
runs stopped early or never settled (``orchestrator.contract.steady``)."""

from __future__ import annotations

import pandas as pd

from orchestrator.contract.steady import STOPPED_STEADY
from orchestrator.results.tablecolumns import measured, numeric


def steady_markdown(rows: pd.DataFrame) -> list[str]:
    """A short paragraph where some run measured until steady state; nothing otherwise."""
    if "measure_until" not in rows.columns or "status" not in rows.columns:
        return []
    ok = rows[measured(rows)]  # ok, or kept from an earlier ok run on resume
    steady = ok[ok["measure_until"].astype(str) == "steady"]
    if steady.empty:
        return []
    stopped = steady.get("measure_stopped", pd.Series(index=steady.index, dtype=object))
    settled = steady[stopped.astype(str) == STOPPED_STEADY]
    unsettled = steady[stopped.astype(str) != STOPPED_STEADY]
    steps = numeric(settled, "steps").dropna()
    text = (
        f"{len(steady)} run(s) measured until steady state (step time ±%: the half-width "
        "of the batch-means 95% interval of the mean step time, in % of it): "
        f"{len(settled)} stopped within their precision"
        + (f" after a median of {steps.median():g} steps" if len(steps) else "")
    )
    if len(unsettled):
        ci = numeric(unsettled, "step_time_ci_pct")
        listed = ", ".join(
            f"`{eid}`" + (f" (±{value:.1f}%)" if pd.notna(value) else "")
            for eid, value in zip(unsettled["experiment_id"].astype(str), ci, strict=True)
        )
        text += f"; {len(unsettled)} did not settle (see their notes in result.json): {listed}"
    return ["", text + "."]
