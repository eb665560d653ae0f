"""Loss equivalence: whether a variant trains like its baseline, beside how fast it runs.

A framework overlay or another trainer backend can be fast because it computes
something else. Each such cell is compared with its scenario's baseline: the
cell of the same scenario with ``framework_config: null`` (framework ``none``)
and the scenario's default trainer (the task's default backend where the
scenario has cells of it, else the first trainer its baseline cells name),
with every other key equal (model, task, GPU count, effective batch, sequence
length, packing, PEFT method, dtype, device, environment) and the same swept
values (read from the runs' ``spec.json``). A scenario with no ``null``
framework still compares its trainer backends: a cell of another trainer is
compared with the cell of the same framework and the task's default trainer. The loss curves are the runs'
``loss_history`` (``[step, loss]`` per logged step, ``result.json``); with
repeats, each cell's curve is the median per step over its ok repeats (the
repeats of a cell share its seed and data, so they are the same experiment).

Over the steps both curves logged, the **gap** is the mean absolute
difference divided by the baseline's mean loss over those steps. A gap above
the tolerance (``DEFAULT_TOLERANCE``, ``tunematrix report --loss-tolerance``)
makes the variant ``different``, and ``fast but different`` where its
tokens/s is also above the baseline's. The largest per-step relative gap is
shown beside it, for reading only.

compare uses the same gap between a cell and the same cell of the reference
folder (``compare_losses``): above the tolerance, a loss change.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from orchestrator.contract import columns as registry
from orchestrator.contract.applicability import BACKEND_KEY, default_backend
from orchestrator.contract.columns import TOKENS_PER_SECOND
from orchestrator.results.mdtable import md_table
from orchestrator.results.numbers import number
from orchestrator.results.records import records
from orchestrator.results.runrecords import RunRecords
from orchestrator.results.tablecolumns import LOSS_COLUMNS, measured

#: a variant whose mean loss gap passes this fraction of the baseline's mean loss is different
DEFAULT_TOLERANCE = 0.05
#: the framework of a baseline cell (``framework_config: null``)
BASELINE_FRAMEWORK = "none"
#: what must be equal between a variant and its baseline (those the cells have)
MATCH_KEYS = registry.with_role("baseline")
#: what a variant may differ in (swept values of these are no match keys)
VARIANT_KEYS = ("framework_config", BACKEND_KEY)

SAME = "same"
DIFFERENT = "different"
FAST_BUT_DIFFERENT = "fast but different"
NO_BASELINE = "no baseline"
NO_CURVE = "no loss curve"
IS_BASELINE = "baseline"
#: verdicts of a variant whose loss departs from its baseline's
FLAGGED = (DIFFERENT, FAST_BUT_DIFFERENT)


Curve = dict[int, float]


@dataclass(frozen=True)
class Gap:
    """How far one loss curve is from another over the steps both logged."""

    #: steps both curves logged
    steps: int
    #: mean |curve − reference| over those steps, over the reference's mean |loss|
    mean: float
    #: the largest per-step |curve − reference| / |reference|
    largest: float


def loss_gap(curve: Curve, reference: Curve) -> Gap | None:
    """The gap of ``curve`` from ``reference``; None without a finite step in common."""
    common = [
        s
        for s in sorted(set(curve) & set(reference))
        if math.isfinite(curve[s]) and math.isfinite(reference[s])
    ]
    if not common:
        return None
    diffs = [abs(curve[s] - reference[s]) for s in common]
    scale = sum(abs(reference[s]) for s in common) / len(common)
    if scale == 0:
        return None
    per_step = [d / abs(reference[s]) for d, s in zip(diffs, common, strict=True) if reference[s]]
    return Gap(
        steps=len(common),
        mean=sum(diffs) / len(diffs) / scale,
        largest=max(per_step, default=math.nan),
    )


def median_curve(curves: Iterable[Sequence[Sequence[float]]]) -> Curve:
    """Per step, the median loss over ``curves`` (each ``[[step, loss], ...]``)."""
    by_step: dict[int, list[float]] = {}
    for curve in curves:
        for point in curve:
            if len(point) < 2:
                continue
            try:
                step, loss = int(point[0]), float(point[1])
            except (TypeError, ValueError):
                continue
            by_step.setdefault(step, []).append(loss)
    out: Curve = {}
    for step, losses in by_step.items():
        ordered = sorted(losses)
        mid = len(ordered) // 2
        out[step] = ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
    return out


def _ok_ids(rows: pd.DataFrame) -> dict[str, list[str]]:
    """Per cell, the experiment ids of its ok repeats (a kept ``skipped`` one counts,
    a pruned one never: it has no result)."""
    if rows.empty or "experiment_id" not in rows.columns:
        return {}
    ok = rows[measured(rows)]
    out: dict[str, list[str]] = {}
    for cell, eid in zip(ok["cell_id"].astype(str), ok["experiment_id"].astype(str), strict=True):
        out.setdefault(cell, []).append(eid)
    return out


class CellCurves(Mapping[str, Curve]):
    """Per cell with an ok repeat that logged a loss: its median loss curve, worked out
    when first asked for (only the cells compared with a baseline ever are)."""

    def __init__(self, rows: pd.DataFrame, runs: RunRecords) -> None:
        self._ids = _ok_ids(rows)
        self._runs = runs
        self._made: dict[str, Curve] = {}

    def __getitem__(self, cell: str) -> Curve:
        if cell not in self._made:
            self._made[cell] = median_curve(_histories(self._runs, self._ids[cell]))
        if not self._made[cell]:
            raise KeyError(cell)  # no ok repeat logged a loss
        return self._made[cell]

    def __iter__(self) -> Iterator[str]:
        return (cell for cell in self._ids if cell in self)

    def __len__(self) -> int:
        return sum(1 for _ in self)


def _swept(rows: pd.DataFrame, runs: RunRecords) -> dict[str, dict[str, Any]]:
    """Per cell, its swept values as planned (``spec.json``; else ``result.json``)."""
    out: dict[str, dict[str, Any]] = {}
    for cell, eid in zip(
        rows["cell_id"].astype(str), rows["experiment_id"].astype(str), strict=True
    ):
        if cell in out:
            continue
        swept = runs.swept(eid)  # spec.json's, else result.json's
        if swept is not None:
            out[cell] = swept
    return out


def _text(value: Any) -> str:
    """One spelling per value, so cells of one table compare equal."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "none"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _signature(cell: Mapping[Any, Any], swept: Mapping[Any, Any]) -> tuple[str, ...]:
    keys = [f"{k}={_text(cell.get(k))}" for k in MATCH_KEYS]
    sweeps = [f"{k}={_text(v)}" for k, v in sorted(swept.items()) if k not in VARIANT_KEYS]
    return (*keys, *sweeps)


def _baseline_trainer(cells: pd.DataFrame) -> dict[str, str]:
    """Per scenario, the trainer of its baseline: the task's default backend where its
    ``none`` cells have it, else the first one they name."""
    out: dict[str, str] = {}
    base = cells[cells["framework_config"].astype(str) == BASELINE_FRAMEWORK]
    for scenario, group in base.groupby(base["scenario"].astype(str), sort=False):
        trainers = [str(t) for t in group.get(BACKEND_KEY, pd.Series(dtype=object)) if t]
        if not trainers:
            continue
        tasks = [str(t) for t in group.get("task", pd.Series(dtype=object)) if t]
        preferred = default_backend(tasks[0]) if tasks else None
        out[str(scenario)] = preferred if preferred in trainers else trainers[0]
    return out


def _is_baseline(cell: Mapping[Any, Any], trainers: Mapping[str, str]) -> bool:
    if str(cell.get("framework_config")) != BASELINE_FRAMEWORK:
        return False
    wanted = trainers.get(str(cell.get("scenario")))
    return wanted is None or str(cell.get(BACKEND_KEY)) == wanted


def _framework(cell: Mapping[Any, Any]) -> str:
    return f"framework_config={_text(cell.get('framework_config'))}"


def _default_trainer(cell: Mapping[Any, Any]) -> bool:
    """Whether the cell trains with its task's default backend."""
    trainer, task = cell.get(BACKEND_KEY), cell.get("task")
    return bool(trainer) and bool(task) and str(trainer) == default_backend(str(task))


def add_equivalence(
    cells: pd.DataFrame,
    rows: pd.DataFrame,
    source: Path,
    tolerance: float = DEFAULT_TOLERANCE,
    runs: RunRecords | None = None,
) -> pd.DataFrame:
    """``cells`` with the ``LOSS_COLUMNS`` filled in, where ``source`` is a results folder
    with run folders; unchanged otherwise (a summary CSV has no loss curves).
    ``runs``: the records the folder's read kept (else they are read here)."""
    if cells.empty or not (source.is_dir() and (source / "runs").is_dir()):
        return cells
    if "framework_config" not in cells.columns or "experiment_id" not in rows.columns:
        return cells
    runs = runs if runs is not None else RunRecords(source)
    curves = CellCurves(rows, runs)
    swept = _swept(rows, runs)
    trainers = _baseline_trainer(cells)
    cell_records = records(cells)
    baselines: dict[tuple[str, ...], Mapping[Any, Any]] = {}
    for cell in cell_records:
        signature = _signature(cell, swept.get(str(cell["cell_id"]), {}))
        if _is_baseline(cell, trainers):
            baselines.setdefault(signature, cell)
        elif str(cell.get("scenario")) not in trainers and _default_trainer(cell):
            # no null framework in the scenario: its default trainer is the trainers' baseline
            baselines.setdefault((*signature, _framework(cell)), cell)
    out: pd.DataFrame = cells.copy()
    values: dict[str, list[Any]] = {name: [] for name in LOSS_COLUMNS}
    found = [
        _compare_cell(cell, baselines, curves, swept, trainers, tolerance) for cell in cell_records
    ]
    used = {f["loss_baseline"] for f in found if f.get("loss_baseline")}
    for cell, columns in zip(cell_records, found, strict=True):
        if columns.get("loss_vs_baseline") == NO_BASELINE and str(cell["cell_id"]) in used:
            columns = {"loss_vs_baseline": IS_BASELINE}
        for name in LOSS_COLUMNS:
            values[name].append(columns.get(name))
    for name in LOSS_COLUMNS:
        out[name] = pd.Series(values[name], index=out.index, dtype=object)
    return out


def _compare_cell(
    cell: Mapping[Any, Any],
    baselines: Mapping[tuple[str, ...], Mapping[Any, Any]],
    curves: Mapping[str, Curve],
    swept: Mapping[str, Mapping[Any, Any]],
    trainers: Mapping[str, str],
    tolerance: float,
) -> dict[str, Any]:
    """One cell's columns: empty for a cell that did not finish ok."""
    cell_id = str(cell.get("cell_id"))
    if cell.get("status") != "ok":
        return {}
    if _is_baseline(cell, trainers):
        return {"loss_vs_baseline": IS_BASELINE}
    signature = _signature(cell, swept.get(cell_id, {}))
    base = baselines.get(signature)
    if base is None and str(cell.get("scenario")) not in trainers:
        if _default_trainer(cell):  # a baseline if another trainer is compared with it
            return {"loss_vs_baseline": NO_BASELINE}
        base = baselines.get((*signature, _framework(cell)))
    if base is None or base.get("status") != "ok":
        return {
            "loss_baseline": None if base is None else str(base.get("cell_id")),
            "loss_vs_baseline": NO_BASELINE,
        }
    base_id = str(base.get("cell_id"))
    mine, theirs = curves.get(cell_id), curves.get(base_id)
    gap = loss_gap(mine, theirs) if mine and theirs else None
    if gap is None:
        return {"loss_baseline": base_id, "loss_vs_baseline": NO_CURVE}
    verdict = SAME
    if gap.mean > tolerance:
        fast, slow = number(cell.get(TOKENS_PER_SECOND)), number(base.get(TOKENS_PER_SECOND))
        verdict = (
            FAST_BUT_DIFFERENT
            if fast is not None and slow is not None and fast > slow
            else DIFFERENT
        )
    return {
        "loss_baseline": base_id,
        "loss_steps_compared": gap.steps,
        "loss_gap_pct": 100 * gap.mean,
        "loss_max_gap_pct": None if math.isnan(gap.largest) else 100 * gap.largest,
        "loss_vs_baseline": verdict,
    }


def flagged(cell: Mapping[Any, Any]) -> bool:
    """Whether the cell's loss departs from its baseline's beyond the tolerance."""
    return cell.get("loss_vs_baseline") in FLAGGED


def _variants(cells: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The variants compared with a baseline, and those with none to compare with."""
    if "loss_vs_baseline" not in cells.columns:
        return cells.iloc[0:0], cells.iloc[0:0]
    variants = cells[cells["loss_vs_baseline"].notna() & (cells["loss_vs_baseline"] != IS_BASELINE)]
    alone = variants[variants["loss_vs_baseline"] == NO_BASELINE]
    return variants[variants["loss_vs_baseline"] != NO_BASELINE], alone


def has_variants(cells: pd.DataFrame) -> bool:
    """Whether summary.md has a section 'Loss against the baseline'."""
    return not _variants(cells)[0].empty


def markdown(cells: pd.DataFrame, tolerance: float) -> list[str]:
    """summary.md's section 'Loss against the baseline' (nothing without variants)."""
    # cells with nothing to compare with are counted, not listed
    variants, alone = _variants(cells)
    if variants.empty:
        return []
    body = []
    for c in records(variants):
        gap = number(c.get("loss_gap_pct"))
        largest = number(c.get("loss_max_gap_pct"))
        verdict = str(c["loss_vs_baseline"])
        body.append(
            [
                str(c.get("scenario")),
                str(c.get("cell_id")),
                str(c.get("framework_config")),
                str(c.get(BACKEND_KEY) or "–"),
                str(c.get("loss_baseline") or "–"),
                "–" if c.get("loss_steps_compared") is None else str(c["loss_steps_compared"]),
                "–" if gap is None else f"{gap:.2f}%",
                "–" if largest is None else f"{largest:.2f}%",
                f"**{verdict}**" if verdict in FLAGGED else verdict,
            ]
        )
    n_flagged = int(variants["loss_vs_baseline"].isin(FLAGGED).sum())
    return [
        "",
        "## Loss against the baseline",
        "",
        "Each framework overlay or trainer backend against its scenario's baseline (the cell "
        "with `framework_config: null` and the scenario's default trainer, every other key "
        "and swept value equal; in a scenario without a `null` framework, a trainer against "
        "the default trainer of the same framework). Per cell, the loss curve is the median per logged step over "
        "its ok repeats; the **gap** is the mean absolute difference over the steps both "
        "logged, over the baseline's mean loss there. Above "
        f"{100 * tolerance:g}% (`--loss-tolerance`) a variant is **different**, and "
        "**fast but different** where its tokens/s are above the baseline's. The largest "
        f"per-step gap is shown for reading. {n_flagged} of {len(variants)} variant(s) "
        "flagged."
        + (
            f" {len(alone)} other cell(s) have no baseline to compare with (no ok cell of "
            "the same setup with `framework_config: null`, or with the default trainer)."
            if len(alone)
            else ""
        ),
        "",
        *md_table(
            [
                "scenario",
                "cell",
                "framework",
                "trainer",
                "baseline",
                "steps compared",
                "gap",
                "largest step gap",
                "verdict",
            ],
            body,
        ),
    ]


# ---------------------------------------------------------------------------
# compare: the same cell in two folders
# ---------------------------------------------------------------------------

#: the columns of ``compare_losses``'s table after the match keys
LOSS_CHANGE_COLUMNS = ("steps_compared", "loss_gap_pct", "loss_max_gap_pct", "loss_change")


def compare_losses(
    matched: Sequence[tuple[Mapping[Any, Any], Sequence[str], Sequence[str]]],
    new_source: Path,
    ref_source: Path,
    tolerance: float = DEFAULT_TOLERANCE,
) -> pd.DataFrame:
    """Per matched cell (its keys, the new side's ok experiment ids, the reference's):
    the gap of the new median loss curve from the reference's, and whether it is a
    loss change (above ``tolerance``). Cells without a curve on both sides are left out,
    and so are cells whose sides ran to another ``max_steps`` (a steady-state run's cap
    against a fixed run's steps): their learning-rate schedules differ, so their curves
    would differ with nothing changed."""
    new_runs, ref_runs = RunRecords(new_source), RunRecords(ref_source)
    changes = []
    for keys, ids_new, ids_ref in matched:
        if _max_steps(new_runs, ids_new) != _max_steps(ref_runs, ids_ref):
            continue
        new_curve = median_curve(_histories(new_runs, ids_new))
        ref_curve = median_curve(_histories(ref_runs, ids_ref))
        gap = loss_gap(new_curve, ref_curve) if new_curve and ref_curve else None
        if gap is None:
            continue
        changes.append(
            {
                **keys,
                "steps_compared": gap.steps,
                "loss_gap_pct": 100 * gap.mean,
                "loss_max_gap_pct": None if math.isnan(gap.largest) else 100 * gap.largest,
                "loss_change": gap.mean > tolerance,
            }
        )
    table: pd.DataFrame = pd.DataFrame(changes)
    return table


def _max_steps(runs: RunRecords, ids: Sequence[str]) -> Any:
    """The ``max_steps`` the first of ``ids`` trained with (its spec), None if unknown."""
    for eid in ids:
        has_arguments, max_steps = runs.max_steps(eid)
        if has_arguments:
            return max_steps
    return None


def _histories(runs: RunRecords, ids: Iterable[str]) -> list[list[Any]]:
    out = []
    for eid in ids:
        history = runs.loss_history(eid)
        if isinstance(history, list) and history:
            out.append(history)
    return out
