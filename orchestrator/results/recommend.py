"""summary.md's opening: what to run, per scenario, then across scenarios, and how sure we are.

A scenario asks one question (which batch size, which trainer, LoRA or full),
so the recommendation answers it first: per scenario and GPU count, among its
cells that finished ok (every repeat ok, a measured tokens/s; never an ``oom``,
pruned, failed, timed-out or mixed cell), the fastest (highest median
tokens/s, global). Then, only where two or more scenarios share a model,
task, device and GPU count, the fastest across them. Per model, task and
device across GPU counts: the cheapest per 1M tokens (device-hours per 1M
tokens = GPUs ÷ tokens/s; in USD where a price per GPU-hour is set). At one
GPU count the two are the same cell, since one price makes cost per token
proportional to GPUs ÷ tokens/s.

How sure: the fastest cell's ok repeats and the coefficient of variation of
its tokens/s, and whether the runner-up is separable. With at least 2 repeats
on both, it is when every repeat of the fastest beat every repeat of the
runner-up (their min/max ranges do not overlap; with 3 against 3 that is a
one-sided Mann–Whitney U test at p = 0.05). With 1 repeat there is no spread
to judge by: a runner-up with fewer tokens/s by less than ``SINGLE_RUN_NOISE``
is called not separable.

A cell whose loss departs from its baseline's (``orchestrator.results.equivalence``)
is not recommended as the fastest: the fastest cell that trains like its
baseline is, with a warning naming the faster one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import pandas as pd

from orchestrator.contract.columns import COST_PER_1M_TOKENS, TOKENS_PER_SECOND
from orchestrator.contract.outcome import PRUNED_PREFIX
from orchestrator.contract.wording import fewer, times, workers
from orchestrator.results import equivalence
from orchestrator.results.mdtable import md_table
from orchestrator.results.numbers import number, whole
from orchestrator.results.tablecolumns import ran_on_cpu

#: with 1 repeat, a runner-up with fewer tokens/s by less than this share of the
#: fastest's is not separable (a usual run-to-run spread of throughput on one
#: machine is a few percent)
SINGLE_RUN_NOISE = 0.05
TPS = TOKENS_PER_SECOND


def candidates(cells: pd.DataFrame) -> pd.DataFrame:
    """The cells that may be recommended: every repeat ok, a measured tokens/s, not pruned."""
    if cells.empty or TPS not in cells.columns:
        none: pd.DataFrame = cells.iloc[0:0]
        return none
    tps = pd.to_numeric(cells[TPS], errors="coerce")
    error = cells["error"] if "error" in cells.columns else pd.Series("", index=cells.index)
    pruned = error.astype(str).str.startswith(PRUNED_PREFIX)
    usable: pd.DataFrame = cells[(cells["status"] == "ok") & tps.notna() & (tps > 0) & ~pruned]
    return usable


def device_hours_per_1m(cell: Mapping[Any, Any]) -> float | None:
    """Device-hours (GPU-hours; on the CPU, process-hours) per 1M tokens."""
    tps, gpus = number(cell.get(TPS)), number(cell.get("num_gpus"))
    if tps is None or gpus is None or tps <= 0:
        return None
    return gpus * 1e6 / tps / 3600


def label(cell: Mapping[Any, Any]) -> str:
    """What tells a cell apart: scenario, framework, batch (and trainer, PEFT, seq)."""
    parts = [
        str(cell.get("scenario")),
        str(cell.get("framework_config")),
        f"bs {_int(cell.get('per_device_train_batch_size'))}×"
        f"{_int(cell.get('gradient_accumulation_steps'))}",
    ]
    for key in ("trainer", "peft_method", "max_seq_len"):
        value = cell.get(key)
        if value in (None, "", "none") or (isinstance(value, float) and math.isnan(value)):
            continue
        parts.append(f"seq {_int(value)}" if key == "max_seq_len" else str(value))
    return " · ".join(parts)


def _int(value: Any) -> str:
    found = number(value)
    return "–" if found is None else f"{found:g}"


def _repeats(cell: Mapping[Any, Any]) -> int:
    found = number(cell.get("repeats_ok"))
    return int(found) if found is not None else 1


def how_sure(best: Mapping[Any, Any], runner_up: Mapping[Any, Any] | None) -> tuple[str, str]:
    """The fastest cell's repeats and CV, and what can be said of the runner-up."""
    n = _repeats(best)
    cv = number(best.get(f"{TPS}_cv"))
    sure = f"{n} repeat{'s' if n != 1 else ''}" + (
        f", CV {100 * cv:.1f}%" if cv is not None else ""
    )
    if runner_up is None:
        return sure, "no other cell finished ok"
    fast, slow = number(best.get(TPS)), number(runner_up.get(TPS))
    assert fast is not None and slow is not None
    short = 1 - slow / fast
    name = f"`{runner_up.get('cell_id')}` ({label(runner_up)})"
    behind = (
        f"the next, {name}, has {fewer(fast, slow)} (the fastest is {times(fast, slow)} as fast)"
    )
    m = _repeats(runner_up)
    if n >= 2 and m >= 2:
        lo, hi = number(best.get(f"{TPS}_min")), number(runner_up.get(f"{TPS}_max"))
        if lo is not None and hi is not None and lo > hi:
            return sure, (
                f"{behind}: separable (every one of {n} repeats faster than each of its {m})"
            )
        return sure, f"{behind}: within the noise (their repeats overlap, {n} vs {m})"
    if short < SINGLE_RUN_NOISE:
        return sure, f"{behind}: not separable with 1 repeat"
    return sure, f"{behind}; 1 repeat: no spread measured, --repeats 3 would confirm it"


def _unit(cells: pd.DataFrame) -> str:
    devices = set(cells["device"].astype(str)) if "device" in cells.columns else {"gpu"}
    if devices == {"cpu"}:
        return "process-h"
    return "GPU-h" if devices <= {"gpu", "None", "nan"} else "device-h"


def markdown(cells: pd.DataFrame) -> list[str]:
    """The recommendation section, first in summary.md after the reading guide."""
    if cells.empty:
        return []
    usable = candidates(cells)
    excluded = len(cells) - len(usable)
    lines = ["## Recommendation", ""]
    if usable.empty:
        ok = int((cells["status"] == "ok").sum()) if "status" in cells.columns else 0
        why = (
            f"No cell finished ok ({len(cells)} cell(s))"
            if ok == 0
            else f"No cell has a measured tokens/s ({ok} of {len(cells)} cell(s) finished ok; "
            "HF's estimate is not a measurement)"
        )
        return [*lines, f"{why}: nothing to recommend.", ""]
    cpu = ran_on_cpu(usable)
    count = workers(cpu)
    unit = _unit(usable)
    priced = COST_PER_1M_TOKENS in usable.columns and bool(
        pd.to_numeric(usable[COST_PER_1M_TOKENS], errors="coerce").notna().any()
    )
    figures = ["fastest cell", "tokens/s", f"{unit} per 1M tokens"]
    figures += ["$ per 1M tokens"] if priced else []
    figures += ["how sure", "runner-up"]
    warnings: list[str] = []

    def answer(group: pd.DataFrame, where: str) -> tuple[Mapping[Any, Any], list[str]]:
        """The fastest trusted cell of ``group`` and its row's figures."""
        ranked = group.assign(_tps=pd.to_numeric(group[TPS], errors="coerce")).sort_values(
            "_tps", ascending=False, kind="stable"
        )
        records = ranked.drop(columns="_tps").to_dict("records")
        trusted = [c for c in records if not equivalence.flagged(c)] or records
        best = trusted[0]
        if equivalence.flagged(best):
            warnings.append(
                f"- **warning**: `{best.get('cell_id')}` is recommended although its loss "
                f"departs from its baseline's ({_gap(best)}): every cell {where} does."
            )
        for faster in records[: records.index(best)]:
            warnings.append(
                f"- **warning**: `{faster.get('cell_id')}` ({label(faster)}) is faster "
                f"({_fmt_tps(faster)} tokens/s) but its loss departs from its baseline's "
                f"({_gap(faster)}, {faster.get('loss_vs_baseline')}): not recommended."
            )
        others = [c for c in trusted if c is not best]
        sure, runner = how_sure(best, others[0] if others else None)
        if not others and len(records) > 1:
            runner = (
                "every other cell that finished ok trains unlike its baseline (see Loss "
                "against the baseline)"
            )
        hours = device_hours_per_1m(best)
        row = [
            f"`{best.get('cell_id')}` ({label(best)})",
            _fmt_tps(best),
            "–" if hours is None else f"{hours:.4g}",
        ]
        if priced:
            row.append(_usd(best.get(COST_PER_1M_TOKENS)))
        return best, [*row, sure, runner]

    gpus = pd.to_numeric(usable["num_gpus"], errors="coerce")
    model = usable["model_name_or_path"].astype(str)
    # a key an older table lacks groups as one value
    task, device = (
        usable[k].astype(str) if k in usable.columns else pd.Series("", usable.index)
        for k in ("task", "device")
    )
    # per scenario: the question each one asks
    per_scenario: list[list[str]] = []
    for key, group in usable.groupby([usable["scenario"].astype(str), model, gpus], sort=False):
        scenario, name, n = (str(k) for k in key)
        on = workers(cpu, whole(n))
        _, row = answer(group, f"of scenario {scenario} at {on} of {name}")
        per_scenario.append([scenario, name, _int(n), *row])
    # across scenarios: only where they share the model, task, device and GPU count
    across: list[list[str]] = []
    for key, group in usable.groupby([model, task, device, gpus], sort=False):
        if group["scenario"].astype(str).nunique() < 2:
            continue
        name, kind, _, n = (str(k) for k in key)
        _, row = answer(group, f"of {name} at {workers(cpu, whole(n))}")
        across.append([name, kind or "–", _int(n), *row])
    # per model, task and device across GPU counts: the cheapest per 1M tokens
    cheapest: list[str] = []
    for key, group in usable.groupby([model, task, device], sort=False):
        name = str(key[0])
        records = [c for c in group.to_dict("records") if not equivalence.flagged(c)]
        cheap = min(records or group.to_dict("records"), key=_hours_or_inf)
        hours = device_hours_per_1m(cheap)
        if hours is None:
            continue
        price = number(cheap.get(COST_PER_1M_TOKENS)) if priced else None
        on = workers(ran_on_cpu(cheap), whole(cheap.get("num_gpus")))
        cheapest.append(
            f"- cheapest per 1M tokens for {name}: `{cheap.get('cell_id')}` "
            f"({label(cheap)}) on {on}: {hours:.4g} {unit}"
            + (f" ({_usd(price)})" if price is not None else "")
        )
    intro = (
        f"Per scenario (the question it asks) and number of {count}, the fastest cell "
        "that finished ok (median tokens/s over its repeats); oom, pruned, spared, failed "
        "and timed-out cells are never recommended"
        + (f" ({excluded} cell(s) left out)" if excluded else "")
        + f". Cost per 1M tokens is {count} ÷ tokens/s, in {unit}, so at one count the "
        "fastest cell is also the cheapest. The runner-up is the next fastest of the same "
        'group; its "fewer tokens/s" is 1 − its tokens/s ÷ the fastest\'s. A cell whose '
        "loss departs from its baseline's is not recommended as the fastest."
    )
    lines += [intro, "", *md_table(["scenario", "model", count, *figures], per_scenario)]
    if across:
        lines += [
            "",
            f"Across scenarios, where two or more share the model, task and number of {count}:",
            "",
            *md_table(["model", "task", count, *figures], across),
        ]
    return [*lines, "", *cheapest, *warnings, ""]


def _hours_or_inf(cell: Mapping[Any, Any]) -> float:
    hours = device_hours_per_1m(cell)
    return math.inf if hours is None else hours


def _gap(cell: Mapping[Any, Any]) -> str:
    gap = number(cell.get("loss_gap_pct"))
    return "gap unknown" if gap is None else f"loss gap {gap:.1f}%"


def _fmt_tps(cell: Mapping[Any, Any]) -> str:
    value = number(cell.get(TPS))
    return "–" if value is None else f"{value:,.0f}"


def _usd(value: Any) -> str:
    found = number(value)
    if found is None:
        return "–"
    return f"${found:,.4f}" if found < 1 else f"${found:,.2f}"
