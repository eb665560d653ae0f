"""summary.md's "Communication" section: the profiled cells' communication time per step.

Only where some cell was profiled (``profile: true`` or ``--profile``); the
figures are the child's, from each rank's trace (``trainer_entry.measure.profile``).
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from orchestrator.contract import columns as registry
from orchestrator.contract.wording import workers
from orchestrator.results.mdtable import md_table
from orchestrator.results.records import records
from orchestrator.results.tablecolumns import ran_on_cpu

#: the section's figures, in order
COMMUNICATION_FIGURES = (
    "comm_time_per_step_ms",
    "comm_time_pct",
    "comm_exposed_time_pct",
    "compute_time_pct",
    "profiled_step_time_ms",
    "top_ops",
)

COMMUNICATION_NOTE = (
    "From torch.profiler traces of a few steps after the warm-up (`runs/<id>/profile/`, "
    "one per rank; open them in Perfetto or chrome://tracing), steps left out of the "
    "measured throughput. Communication is the collectives' time (GPU: NCCL kernels; CPU: "
    "gloo's collectives on its own threads), compute the other kernels (CPU: the other "
    "operators), each the union of its intervals over the profiled steps' time, the mean "
    "over the ranks. Communication hidden behind compute counts in both, so the two may "
    "sum above 100%; exposed communication is the part during which no compute ran. The "
    "profiler's own overhead is in the profiled steps' time. Top operators: the largest "
    "shares of self time (GPU: kernel time per operator), all ranks summed."
)


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _text(value: Any, digits: int = 1) -> str:
    if _missing(value):
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def communication_markdown(cells: pd.DataFrame) -> list[str]:
    """The section's lines, or none when no cell has a profile figure."""
    if "comm_time_pct" not in cells.columns or not cells["comm_time_pct"].notna().any():
        return []
    profiled = cells[cells["comm_time_pct"].notna()]
    headers = [
        "scenario",
        "model",
        "framework",
        workers(ran_on_cpu(profiled)),
        *[registry.get(name).header for name in COMMUNICATION_FIGURES],
    ]
    body = []
    for c in records(profiled):
        body.append(
            [
                str(c.get("scenario")),
                str(c.get("model_name_or_path")),
                str(c.get("framework_config")),
                _text(c.get("num_gpus"), 0),
                *[
                    _text(c.get(name), 2 if name.endswith("_ms") else 1)
                    for name in COMMUNICATION_FIGURES
                ],
            ]
        )
    return ["", "## Communication", "", COMMUNICATION_NOTE, "", *md_table(headers, body)]
