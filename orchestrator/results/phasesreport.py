"""summary.md's section on where the wall time went: each cell's phases (``orchestrator.job.phases``),
which add up to its wall time, and how much of the matrix's wall was training."""

from __future__ import annotations

import pandas as pd

from orchestrator.contract.columns import PHASE_COLUMNS, WALL_S
from orchestrator.results.mdtable import md_table
from orchestrator.results.tablecolumns import measured, numeric

#: the phases as summary.md names them
_HEADERS = {
    "launch": "launch",
    "imports": "imports",
    "model": "model",
    "data": "data",
    "first_step": "first step",
    "training": "training",
    "after_training": "after training",
}


def phases_markdown(rows: pd.DataFrame) -> list[str]:
    """The section, where the runs recorded their phases; nothing otherwise (older folders)."""
    columns = list(PHASE_COLUMNS.values())
    if not set(columns) <= set(rows.columns) or "cell_id" not in rows.columns:
        return []
    ok = rows[measured(rows)]
    values = pd.DataFrame({c: numeric(ok, c) for c in [WALL_S, *columns]}, index=ok.index)
    values = values[values[columns].notna().all(axis=1) & values[WALL_S].notna()]
    if values.empty:
        return []
    values["cell_id"] = ok.loc[values.index, "cell_id"].astype(str)
    # means, which add up as the phases of each run do (medians need not)
    cells = values.groupby("cell_id", sort=False).mean()
    training = PHASE_COLUMNS["training"]
    # formatted a column at a time (a row at a time took 0.7 s for 5,000 cells)
    shown = [cells[c].map("{:.1f}".format) for c in [WALL_S, *columns]]
    share = (cells[training] / cells[WALL_S].where(cells[WALL_S] > 0)).map(
        lambda v: f"{v:.0%}" if pd.notna(v) else "–"
    )
    body = [[f"`{cell}`", *texts] for cell, *texts in zip(cells.index, *shown, share, strict=True)]
    wall, trained = values[WALL_S].sum(), values[training].sum()
    lines = [
        "",
        "## Where the wall time went",
        "",
        "Each cell's wall time in seconds, split into phases that add up to it (means over "
        "its ok runs; `phase_*_s` in raw_summary.csv): **launch**, from the start to the "
        "training process's (the launcher and its imports; in a shared launch, from the run "
        "before's result); **imports**, the child's interpreter and the training stack (in a "
        "shared launch, freeing the run before's objects); "
        "**model**, its settings and load; **data**, prepared or read from the cache; "
        "**first step**, building the trainer and its first (warm-up) step; **training**, "
        "the first step's end to the last's; **after training**, the results, eval where "
        "asked, and the processes' exit.",
        "",
        *md_table(["cell", "wall", *(_HEADERS[p] for p in PHASE_COLUMNS), "training share"], body),
        "",
        f"Over the {len(values)} ok run(s): {wall:,.1f} s of wall time, of which "
        f"{trained:,.1f} s training ({trained / wall:.0%}); the rest is paid per launch "
        "(`--launch family` pays the launch and the imports once per family).",
    ]
    return lines
