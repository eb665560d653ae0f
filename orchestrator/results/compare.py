"""Compare a run against a reference and flag regressions.

Rows are matched on the key columns both sides have: scenario, trainer, task,
framework, model, GPUs, per-device batch, PEFT method, sequence length,
packing, dtype and device (``KEYS``), plus the effective batch and any
scenario argument swept on either side. A key one side lacks (a
predecessor's table has no scenario, sequence length, packing or device)
drops out of the match, and the report says so. Measured outputs (``epoch``,
``train_*``, ``mem_*``, any metric) are never keys, whatever varies in them.

Per matched cell and metric: the medians, their ratio, and a regression flag
when the change goes past the threshold in the bad direction. Where both
sides have at least 3 repeats, the flag also needs a one-sided Mann–Whitney U
test at p ≤ 0.05 (in the bad direction), so a change within the run-to-run
noise is not called a regression. With 3 repeats on each side the smallest p
the test can give is exactly 0.05, reached only when every new run is worse
than every reference run. A cell that was ``ok`` and is not any more (failed,
out of memory, timed out or interrupted) is a regression too.

The metrics compare knows, and which way each is better, are the columns
declared with a direction (``Column.better`` in ``orchestrator.contract.columns``).

A matched cell whose sides ran under different conditions (GPU model, memory
source, run mode, host allocator and its settings: ``ANNOTATED``) is still
compared, and marked: the table's ``differs`` and ``mismatch`` columns, ``≠`` in
its label.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from orchestrator.contract import columns as registry
from orchestrator.contract.applicability import DEFAULT_TASK
from orchestrator.contract.layout import ResultsLayout, write_atomic
from orchestrator.contract.outcome import LOST, NOT_LAUNCHED, PRUNED
from orchestrator.contract.wording import signed_change, workers
from orchestrator.results.envtables import match_on_environment
from orchestrator.results.mdtable import md_table
from orchestrator.results.stats import mann_whitney_u
from orchestrator.results.tablecolumns import (
    argument_columns,
    is_output,
    measured,
    ran_on_cpu,
    shown_status,
)

#: what makes two rows the same experiment; each is used where both sides have it (the
#: environment only where a side holds several: ``results.envtables.match_on_environment``)
KEYS = registry.with_role("compare")
#: conditions of a run that are not part of the experiment but change its figures:
#: a matched cell whose sides differ in one of them is marked
ANNOTATED = registry.with_role("annotated")
#: a condition a run leaves empty where it had its default, and the condition whose value
#: says the run recorded it: on such rows the empty value reads as ``DEFAULT``, so that a
#: run with allocator settings is marked against one without any
RECORDED_WITH = {registry.ALLOCATOR_SETTINGS: registry.ALLOCATOR}
DEFAULT = "default"
#: what compare checks when no metric is named
DEFAULT_METRICS = registry.with_role("compared")
MIN_REPEATS_FOR_TEST = 3
ALPHA = 0.05


@dataclass
class Comparison:
    table: pd.DataFrame
    keys: list[str]
    only_new: pd.DataFrame
    only_ref: pd.DataFrame
    metrics: list[str]
    notes: list[str] = field(default_factory=list)
    #: the files ``write`` wrote (compare.csv, compare.md, plots)
    written: list[Path] = field(default_factory=list)
    #: per matched cell with a loss curve on both sides, the gap of the new one from the
    #: reference's (``results.equivalence.compare_losses``); None where not compared
    loss: pd.DataFrame | None = None
    #: the loss gap past which a cell's loss changed
    loss_tolerance: float | None = None

    @property
    def regressions(self) -> pd.DataFrame:
        if self.table.empty:
            return self.table
        return self.table[self.table["regression"]]

    @property
    def loss_changes(self) -> pd.DataFrame:
        """The matched cells whose loss departs from the reference's beyond the tolerance."""
        if self.loss is None or self.loss.empty:
            return pd.DataFrame()
        return self.loss[self.loss["loss_change"].astype(bool)]


def matched_experiments(
    new: pd.DataFrame, ref: pd.DataFrame, keys: list[str]
) -> list[tuple[dict[str, Any], list[str], list[str]]]:
    """Per cell matched on ``keys``: its keys (one spelling), and the experiment ids of
    the ok runs of each side."""
    n, r = _key_frames(new, ref, keys)
    ids = []
    for frame in (n, r):
        ok = frame[measured(frame)]  # ok or kept on resume; never a pruned row
        ids.append(ok.groupby(keys, sort=False)["experiment_id"].agg(lambda s: [str(v) for v in s]))
    both = ids[0].to_frame("new").join(ids[1].to_frame("ref"), how="inner")
    return [
        (
            dict(zip(keys, key if isinstance(key, tuple) else (key,), strict=True)),
            list(row["new"]),
            list(row["ref"]),
        )
        for key, row in both.iterrows()
    ]


def known_metrics() -> list[str]:
    """Every metric compare can check: those declared with a direction, sorted."""
    return sorted(registry.directions())


def direction(metric: str) -> str:
    """``higher`` or ``lower``: which way ``metric`` is better (its ``Column.better``)."""
    return registry.direction(metric)


_TRUE = {"true", "1", "1.0", "yes"}
_FALSE = {"false", "0", "0.0", "no"}


def _number_text(value: float) -> str:
    return str(int(value)) if value.is_integer() else repr(value)


def _canonical(value: Any) -> str:
    """One spelling per value, so both sides' labels compare equal.

    ``2.00E-05``, ``2e-05`` and ``0.00002`` are one number; ``16``, ``16.0``
    and ``"16"`` another; an empty cell is ``none``.
    """
    if value is None or value is pd.NA:
        return "none"
    if isinstance(value, (bool, np.bool_)):
        return "true" if value else "false"
    if isinstance(value, (int, float)) or hasattr(value, "dtype"):  # numpy scalars too
        try:
            number = float(value)
        except (TypeError, ValueError):
            return str(value)
        return "none" if math.isnan(number) else _number_text(number)
    text = str(value).strip()
    if text.lower() in ("", "nan", "none", "<na>", "null"):
        return "none"
    if text.lower() in ("true", "false"):
        return text.lower()
    try:
        number = float(text)
    except ValueError:
        return text
    return text if math.isnan(number) or math.isinf(number) else _number_text(number)


def _is_flag(key: str, values: set[str]) -> bool:
    """A yes/no column: only true/false (and 1/0, as a CSV reader may turn them) and none."""
    present = values - {"none"}
    declared = registry.find(key)
    named = (declared is not None and declared.flags is not None) or bool(
        present & {"true", "false"}
    )
    return named and present <= _TRUE | _FALSE


def _key_frames(
    new: pd.DataFrame, ref: pd.DataFrame, keys: list[str]
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Both sides with their key columns in one spelling (see ``_canonical``).

    Only the distinct values are spelled out, so this stays fast for large tables.
    """
    out_new, out_ref = new.copy(), ref.copy()
    for k in keys:
        spelled = [
            frame[k].map({v: _canonical(v) for v in frame[k].dropna().unique()}).fillna("none")
            for frame in (new, ref)
        ]
        if _is_flag(k, set(spelled[0].unique()) | set(spelled[1].unique())):
            # a CSV reader turns a yes/no column with blanks into 1.0/NaN on one side only
            spelled = [
                s.map(lambda v: "true" if v in _TRUE else "false" if v in _FALSE else v)
                for s in spelled
            ]
        out_new[k], out_ref[k] = spelled
    return out_new, out_ref


def _present(frame: pd.DataFrame, key: str) -> bool:
    """Whether a side has values in ``key`` (an empty label counts as none)."""
    return bool(_filled(frame, key).any())


def _varies(frame: pd.DataFrame, column: str) -> bool:
    return frame[column].map(str).nunique() > 1


def _sweep_keys(new: pd.DataFrame, ref: pd.DataFrame) -> tuple[list[str], list[str]]:
    """Argument columns that vary within a side (swept values) and that both sides have,
    and the output columns that would have been taken for such arguments.

    Cells that differ only in a swept argument (say the LoRA rank) are different
    experiments, so they join the match keys. A measured output (the
    predecessor's ``epoch``) varies too, but is never a key.
    """
    both = [c for c in argument_columns(new) if c in ref.columns and c not in KEYS]
    extra = (
        ["effective_batch_size"]
        if _present(new, "effective_batch_size") and _present(ref, "effective_batch_size")
        else []
    )
    varying = [c for c in both if _varies(new, c) or _varies(ref, c)]
    return extra + [c for c in varying if not is_output(c)], [c for c in varying if is_output(c)]


def _conditions(frame: pd.DataFrame, keys: list[str], column: str) -> pd.Series:
    """Per cell, the distinct values of ``column`` on one side (``A / B`` for a mix)."""
    values = frame[[*keys, column]].dropna(subset=[column])
    values = values[values[column].astype(str).str.strip() != ""]
    values[column] = values[column].astype(str)
    values = values.drop_duplicates().sort_values(column, kind="stable")
    # most cells have one value: joined only where a cell has more (a Python call per group)
    mixed = values.duplicated(subset=keys, keep=False)
    if not mixed.any():
        return values.set_index(keys)[column]
    joined = values[mixed].groupby(keys, sort=False)[column].agg(" / ".join)
    return pd.concat([values[~mixed].set_index(keys)[column], joined])


def _filled(frame: pd.DataFrame, key: str) -> pd.Series:
    """Whether each row has a value in ``key`` (an empty label counts as none)."""
    if key not in frame.columns:
        return pd.Series(False, index=frame.index)
    values = frame[key]
    return values.notna() & (values.astype(str) != "")


def _defaults_read(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with the empty ``RECORDED_WITH`` conditions of the rows that recorded
    them read as ``DEFAULT``."""
    for column, witness in RECORDED_WITH.items():
        default = _filled(frame, witness) & ~_filled(frame, column)
        if default.any():
            values = frame[column] if column in frame.columns else pd.Series(None, frame.index)
            frame = frame.assign(**{column: values.astype(object).where(~default, DEFAULT)})
    return frame


def _mismatches(
    n: pd.DataFrame, r: pd.DataFrame, keys: list[str], cells: pd.Index
) -> tuple[pd.DataFrame, list[str]]:
    """For each matched cell, which ``ANNOTATED`` conditions differ between the sides.

    A condition one side does not record is not compared (and noted).
    """
    differs = pd.Series([""] * len(cells), index=cells, dtype=object)
    detail = pd.Series([""] * len(cells), index=cells, dtype=object)
    notes = []
    n, r = _defaults_read(n), _defaults_read(r)
    for column in ANNOTATED:
        has_new, has_ref = _present(n, column), _present(r, column)
        if has_new != has_ref:
            side = "reference" if has_new else "new run"
            notes.append(f"{column} is not recorded in the {side}, so it is not checked")
        if not (has_new and has_ref):
            continue
        both = pd.DataFrame(
            {"new": _conditions(n, keys, column), "ref": _conditions(r, keys, column)}
        ).reindex(cells)
        different = both["new"].notna() & both["ref"].notna() & (both["new"] != both["ref"])
        if not different.any():
            continue
        text = f"{column}: " + both["ref"] + " (ref) vs " + both["new"] + " (new)"
        differs[different] = differs[different].map(lambda v: v + ", " if v else v) + column
        detail[different] = detail[different].map(lambda v: v + "; " if v else v) + text
        notes.append(
            f"{column} differs between the sides in {int(different.sum())} matched cell(s), "
            "marked ≠ (columns differs and mismatch)"
        )
    return pd.DataFrame({"differs": differs, "mismatch": detail}), notes


def _ok_values(frame: pd.DataFrame, keys: list[str], metrics: list[str]) -> pd.DataFrame:
    ok = frame[measured(frame)]
    values = ok[metrics].apply(pd.to_numeric, errors="coerce")
    for k in keys:
        values[k] = ok[k]
    return values


def _match_keys(new: pd.DataFrame, ref: pd.DataFrame) -> tuple[list[str], list[str]]:
    """The columns rows are matched on (``KEYS`` both sides have, then the swept
    arguments), and notes on what was left out."""
    notes: list[str] = []
    keys = [k for k in KEYS if _present(new, k) and _present(ref, k)]
    # a key neither side has (the trainer, before there was a choice) changes nothing
    dropped = [k for k in KEYS if k not in keys and (_present(new, k) or _present(ref, k))]
    if "environment" in keys:
        # both sides have it; where each ran one environment it is what is compared
        on_env, env_note = match_on_environment(new, ref)
        keys = keys if on_env else [k for k in keys if k != "environment"]
        notes += [env_note] if env_note else []
    if dropped:
        notes.append(f"matched without {', '.join(dropped)} (missing on one side)")
    if not keys:
        raise ValueError("the two tables share no key column to match rows on")
    swept, outputs = _sweep_keys(new, ref)
    keys += swept
    if outputs:
        notes.append(f"outputs and bookkeeping, not used to match rows: {', '.join(outputs)}")
    return keys, notes


def _usable_metrics(
    new: pd.DataFrame, ref: pd.DataFrame, metrics: list[str] | None
) -> tuple[list[str], list[str]]:
    """The metrics to compare that both sides have, and a note on those they lack.

    A metric without a direction is an error before any work."""
    wanted = list(metrics) if metrics else list(DEFAULT_METRICS)
    for m in wanted:
        direction(m)
    usable = [m for m in wanted if m in new.columns and m in ref.columns]
    skipped = [m for m in wanted if m not in usable]
    notes = (
        [f"not on both sides, so not compared: {', '.join(skipped)}"] if skipped and metrics else []
    )
    return usable, notes


@dataclass
class _Cells:
    """Both sides with their keys in one spelling, and how their cells match."""

    new: pd.DataFrame
    ref: pd.DataFrame
    #: per matched cell, the rows of each side (``rows_new``, ``rows_ref``)
    matched: pd.DataFrame
    only_new: pd.DataFrame
    only_ref: pd.DataFrame


def _match_cells(new: pd.DataFrame, ref: pd.DataFrame, keys: list[str]) -> _Cells:
    n, r = _key_frames(new, ref, keys)
    cells_new = n.groupby(keys, sort=False).size().rename("rows_new")
    cells_ref = r.groupby(keys, sort=False).size().rename("rows_ref")
    return _Cells(
        new=n,
        ref=r,
        matched=cells_new.to_frame().join(cells_ref, how="inner"),
        only_new=cells_new.index.difference(cells_ref.index, sort=False).to_frame(index=False),
        only_ref=cells_ref.index.difference(cells_new.index, sort=False).to_frame(index=False),
    )


def _status_regressions(cells: _Cells, keys: list[str]) -> pd.DataFrame | None:
    """Matched cells that were ok in the reference, have no ok run now and at least
    one lost (``LOST``) or pruned (an OOM of a smaller cell): one ``status`` row each."""
    n, r, matched = cells.new, cells.ref, cells.matched
    ok_new = n[measured(n)].groupby(keys, sort=False).size()
    ok_ref = r[measured(r)].groupby(keys, sort=False).size()
    lost = n.assign(status=shown_status(n))
    bad_new = (
        lost[lost["status"].isin((*LOST, PRUNED, NOT_LAUNCHED))]
        .groupby(keys, sort=False)
        .agg(status=("status", "first"), error=("error", "first"))
    )
    broken = (
        matched.index.intersection(bad_new.index)
        .intersection(ok_ref.index)
        .difference(ok_new.index)
    )
    records: list[dict[str, Any]] = []
    for key in broken:
        status, error = bad_new.loc[key, "status"], bad_new.loc[key, "error"]
        records.append(
            {
                **dict(zip(keys, key if isinstance(key, tuple) else (key,), strict=True)),
                "metric": "status",
                "ref": "ok",
                "new": status,
                "ratio": None,
                "change": None,
                "n_ref": int(matched.loc[key, "rows_ref"]),
                "n_new": int(matched.loc[key, "rows_new"]),
                "p_value": None,
                "regression": True,
                "why": f"was ok, now {status}"
                + (f": {error}" if isinstance(error, str) and error else ""),
            }
        )
    return pd.DataFrame(records) if records else None


@dataclass
class _Side:
    """One side's ok rows grouped by cell, with every metric's median and count per
    cell (one pass over the groups for all the metrics)."""

    grouped: Any
    medians: pd.DataFrame
    counts: pd.DataFrame

    @classmethod
    def of(cls, values: pd.DataFrame, keys: list[str], metrics: list[str]) -> _Side:
        grouped = values.groupby(keys, sort=False)
        return cls(grouped, grouped[metrics].median(), grouped[metrics].count())


def _metric_changes(
    side_new: _Side, side_ref: _Side, metric: str, threshold: float
) -> pd.DataFrame | None:
    """Per matched cell with ok runs on both sides: the medians of ``metric``, their
    ratio and change, and the verdict (threshold, then the rank test where both
    sides have ``MIN_REPEATS_FOR_TEST`` repeats)."""
    grouped_new, grouped_ref = side_new.grouped, side_ref.grouped
    side = pd.DataFrame({"new": side_new.medians[metric], "n_new": side_new.counts[metric]}).join(
        pd.DataFrame({"ref": side_ref.medians[metric], "n_ref": side_ref.counts[metric]}),
        how="inner",
    )
    side = side[(side["n_new"] > 0) & (side["n_ref"] > 0)]
    if side.empty:
        return None
    side["ratio"] = side["new"] / side["ref"].where(side["ref"] != 0)
    side["change"] = side["ratio"] - 1
    higher = direction(metric) == "higher"
    worse = side["change"] < -threshold if higher else side["change"] > threshold
    side["regression"] = worse
    side["p_value"] = math.nan
    side["why"] = ""
    tested = (
        worse & (side["n_new"] >= MIN_REPEATS_FOR_TEST) & (side["n_ref"] >= MIN_REPEATS_FOR_TEST)
    )
    for key in side.index[tested]:
        x = grouped_new.get_group(key)[metric].dropna().tolist()
        y = grouped_ref.get_group(key)[metric].dropna().tolist()
        _, p = mann_whitney_u(x, y, "less" if higher else "greater")
        side.loc[key, "p_value"] = p
        side.loc[key, "regression"] = p <= ALPHA
        side.loc[key, "why"] = f"p = {p:.3g}" + (
            "" if p <= ALPHA else f" > {ALPHA}: within the noise"
        )
    alone = worse & ~tested
    side.loc[alone, "why"] = (
        side.loc[alone, "n_ref"].astype(str)
        + " vs "
        + side.loc[alone, "n_new"].astype(str)
        + " repeats: threshold alone"
    )
    side["metric"] = metric
    return side.reset_index()


#: the columns of a comparison's table after the keys
TABLE_COLUMNS = (
    "metric",
    "ref",
    "new",
    "ratio",
    "change",
    "n_ref",
    "n_new",
    "p_value",
    "regression",
    "why",
    "differs",
    "mismatch",
)


def _table(
    frames: list[pd.DataFrame], keys: list[str], conditions: pd.DataFrame, matched: pd.DataFrame
) -> pd.DataFrame:
    """One table of the rows of every step, each cell's conditions beside them, cells
    in the order of the new run and each cell's metrics together."""
    columns = [*keys, *TABLE_COLUMNS]
    if not frames:
        return pd.DataFrame(columns=columns)
    table = pd.concat(frames, ignore_index=True)[columns[:-2]]
    if len(table):
        table["regression"] = table["regression"].astype(bool)
        table = table.merge(conditions.reset_index(names=keys), on=keys, how="left")
        order = matched.reset_index()[keys].assign(_order=range(len(matched)))
        table = table.merge(order, on=keys, how="left").sort_values("_order", kind="stable")
        table = table.drop(columns="_order").reset_index(drop=True)
    return table


def compare(
    new: pd.DataFrame,
    ref: pd.DataFrame,
    *,
    metrics: list[str] | None = None,
    threshold: float = 0.1,
) -> Comparison:
    """Match ``new`` rows to ``ref`` rows and compare each metric (see the module docstring).

    Medians and counts come from one groupby per side; the rank test runs only
    for the few cells whose change passes the threshold.
    """
    keys, notes = _match_keys(new, ref)
    usable, metric_notes = _usable_metrics(new, ref, metrics)
    notes += metric_notes
    cells = _match_cells(new, ref, keys)
    conditions, condition_notes = _mismatches(cells.new, cells.ref, keys, cells.matched.index)
    notes += condition_notes

    status = _status_regressions(cells, keys)
    frames = [status] if status is not None else []
    side_new = _Side.of(_ok_values(cells.new, keys, usable), keys, usable)
    side_ref = _Side.of(_ok_values(cells.ref, keys, usable), keys, usable)
    for metric in usable:
        changes = _metric_changes(side_new, side_ref, metric, threshold)
        if changes is not None:
            frames.append(changes)
    return Comparison(
        table=_table(frames, keys, conditions, cells.matched),
        keys=keys,
        only_new=cells.only_new,
        only_ref=cells.only_ref,
        metrics=usable,
        notes=notes,
    )


def cell_label(row: Any, keys: list[str]) -> str:
    """A short name for a matched cell: ``s · fsdp · org/model · 2 GPU · bs 4/dev · seq 1024``.

    A cell whose sides ran under different conditions ends in ``(≠ gpu_device_name)``.
    """
    parts = []
    for k in keys:
        value = str(row[k])
        if value in ("none", "", "nan", "<NA>") and k in ("peft_method", "scenario"):
            continue
        if k == "task" and value == DEFAULT_TASK:  # the usual one goes without saying
            continue
        declared = registry.find(k)
        unit = workers(ran_on_cpu(row), short=True)
        short = registry.short_label(k, value, unit=unit, per="dev")
        if short is not None:
            parts.append(short)
        elif declared is not None and declared.flags and value in ("true", "false"):
            parts.append(declared.flags[0 if value == "true" else 1])
        elif k in KEYS:
            parts.append(value)
        else:
            parts.append(f"{k}={value}")
    label = " · ".join(parts)
    differs = row.get("differs") if hasattr(row, "get") else None
    if isinstance(differs, str) and differs:
        label += f" (≠ {differs})"
    return label


def short_number(value: Any) -> str:
    """A figure as a compare table shows it: thousands grouped, else 4 significant digits."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, str):
        return value
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.4g}"


FULL_TABLE_ROWS = 300  # beyond this, compare.md summarises and compare.csv has every row


def _rows_md(table: pd.DataFrame, keys: list[str]) -> list[str]:
    headers = ["cell", "metric", "reference", "new", "change", "repeats", "verdict"]
    body = []
    for row in table.to_dict("records"):
        change = row["change"]
        verdict = "**regression**" if row["regression"] else "ok"
        if row["why"]:
            verdict += f" ({row['why']})"
        if isinstance(row.get("mismatch"), str) and row["mismatch"]:
            verdict += f"; ≠ {row['mismatch']}"
        body.append(
            [
                cell_label(row, keys),
                str(row["metric"]),
                short_number(row["ref"]),
                short_number(row["new"]),
                "–"
                if change is None or (isinstance(change, float) and math.isnan(change))
                else signed_change(change),
                f"{row['n_ref']} → {row['n_new']}",
                verdict,
            ]
        )
    return md_table(headers, body)


def markdown(result: Comparison, new_label: str, ref_label: str, threshold: float) -> str:
    t = result.table
    regressions = result.regressions
    matched = t[list(result.keys)].drop_duplicates().shape[0] if len(t) else 0
    lines = [
        "# Comparison",
        "",
        f"New: `{new_label}`; reference: `{ref_label}`. Matched on {', '.join(result.keys)}; "
        f"a regression is a change past {100 * threshold:g}% in the bad direction (with ≥ "
        f"{MIN_REPEATS_FOR_TEST} repeats on both sides, also a one-sided Mann–Whitney U p ≤ {ALPHA}).",
        "",
        f"**{len(regressions)} regression(s)** in {matched} matched cell(s).",
    ]
    if result.notes:
        lines += ["", *[f"- {n}" for n in result.notes]]
    if len(regressions):
        lines += ["", "## Regressions", "", *_rows_md(regressions, result.keys)]
    if len(t):
        numeric = t[t["metric"] != "status"]
        summary = []
        for metric, group in numeric.groupby("metric", sort=False):
            change = pd.to_numeric(group["change"], errors="coerce")
            summary.append(
                [
                    str(metric),
                    str(len(group)),
                    signed_change(change.median()),
                    signed_change(change.min()),
                    signed_change(change.max()),
                    str(int(group["regression"].sum())),
                ]
            )
        lines += [
            "",
            "## By metric",
            "",
            *md_table(["metric", "cells", "median change", "min", "max", "regressions"], summary),
        ]
        if len(t) <= FULL_TABLE_ROWS:
            lines += ["", "## Every cell", "", *_rows_md(t, result.keys)]
        else:
            lines += ["", f"Every cell and metric ({len(t):,} rows) is in compare.csv."]
    lines += _loss_md(result)
    for label, frame in (
        ("Only in the new run", result.only_new),
        ("Only in the reference", result.only_ref),
    ):
        if len(frame):
            shown = frame.head(FULL_TABLE_ROWS)
            lines += [
                "",
                f"## {label} ({len(frame)})",
                "",
                *md_table(
                    ["cell"], [[cell_label(r, result.keys)] for r in shown.to_dict("records")]
                ),
            ]
            if len(frame) > len(shown):
                lines.append(f"... and {len(frame) - len(shown)} more")
    return "\n".join(lines) + "\n"


def _loss_md(result: Comparison) -> list[str]:
    """The loss curves of the matched cells against the reference's
    (``results.equivalence``): the loss changes, then every cell compared."""
    if result.loss is None:
        return []
    tolerance = result.loss_tolerance or 0.0
    lines = [
        "",
        "## Loss against the reference",
        "",
        f"**{len(result.loss_changes)} loss change(s)** in {len(result.loss)} matched cell(s) "
        "with a loss curve on both sides: the mean absolute gap between the median loss "
        "curves over the steps both logged, over the reference's mean loss there, above "
        f"{100 * tolerance:g}% (`--loss-tolerance`).",
    ]
    if result.loss.empty:
        return lines
    body = []
    for row in result.loss.sort_values("loss_change", ascending=False, kind="stable").to_dict(
        "records"
    ):
        body.append(
            [
                cell_label(row, result.keys),
                str(row["steps_compared"]),
                f"{row['loss_gap_pct']:.2f}%",
                "**loss change**" if row["loss_change"] else "same",
            ]
        )
    return [*lines, "", *md_table(["cell", "steps compared", "gap", "verdict"], body)]


def plots(result: Comparison, folder: Path, threshold: float) -> list[Path]:
    """One scatter per metric: reference (x) against new (y), the threshold band around y = x."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    t = result.table
    for metric in result.metrics:
        sub = t[t["metric"] == metric]
        if sub.empty:
            continue
        x = sub["ref"].astype(float)
        y = sub["new"].astype(float)
        fig, ax = plt.subplots(figsize=(6.5, 6), dpi=110)
        hi = float(max(x.max(), y.max())) * 1.08
        lo = 0.0
        line = [lo, hi]
        ax.plot(line, line, color="grey", linewidth=1, label="no change")
        ax.fill_between(
            line,
            [v * (1 - threshold) for v in line],
            [v * (1 + threshold) for v in line],
            color="grey",
            alpha=0.12,
            label=f"±{100 * threshold:g}%",
        )
        colors = ["firebrick" if r else "tab:blue" for r in sub["regression"]]
        ax.scatter(x, y, c=colors, s=28, zorder=3)
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        ax.set_xlabel(f"reference: {metric}")
        ax.set_ylabel(f"new: {metric}")
        better = "higher is better" if direction(metric) == "higher" else "lower is better"
        ax.set_title(f"{metric} ({better}); red: regression", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="upper left")
        fig.tight_layout()
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"compare-{metric}.png"
        fig.savefig(path)
        plt.close(fig)
        written.append(path)
    return written


def write(
    result: Comparison,
    output: Path,
    new_label: str,
    ref_label: str,
    threshold: float,
    *,
    with_plots: bool = True,
) -> list[Path]:
    output.mkdir(parents=True, exist_ok=True)
    layout = ResultsLayout(output)
    write_atomic(layout.compare_csv, result.table.to_csv(index=False))
    write_atomic(layout.compare_md, markdown(result, new_label, ref_label, threshold))
    written = [layout.compare_csv, layout.compare_md]
    if with_plots:
        written += plots(result, layout.plots, threshold)
    return written
