"""summary.md's opening: what to run, per model and GPU count, and how sure we are.

Among the cells that finished ok (every repeat ok, a measured tokens/s; never
an ``oom``, pruned, failed, timed-out or mixed cell), per model, device and GPU
count: the fastest (highest median tokens/s, global) and, per model and device
across GPU counts, the cheapest per 1M tokens (device-hours per 1M tokens =
GPUs ÷ tokens/s; in USD where a price per GPU-hour is set). At one GPU count
the two are the same cell, since one price makes cost per token proportional
to GPUs ÷ tokens/s.

How sure: the fastest cell's ok repeats and the coefficient of variation of
its tokens/s, and whether the runner-up is separable. With at least 2 repeats
on both, it is when every repeat of the fastest beat every repeat of the
runner-up (their min/max ranges do not overlap; with 3 against 3 that is a
one-sided Mann–Whitney U test at p = 0.05). With 1 repeat there is no spread
to judge by: a runner-up within ``SINGLE_RUN_NOISE`` is called not separable.

A cell whose loss departs from its baseline's (``orchestrator.results.equivalence``)
is not recommended as the fastest: the fastest cell that trains like its
baseline is, with a warning naming the faster one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import pandas as pd

from orchestrator.results.numbers import number
from orchestrator.contract.outcome import PRUNED_PREFIX
from orchestrator.results import equivalence
from orchestrator.results.mdtable import md_table

#: with 1 repeat, a runner-up closer than this fraction is not separable (a usual
#: run-to-run spread of throughput on one machine is a few percent)
SINGLE_RUN_NOISE = 0.05
TPS = "tokens_per_second_global"




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
    gap = fast / slow - 1
    name = f"`{runner_up.get('cell_id')}` ({label(runner_up)})"
    m = _repeats(runner_up)
    if n >= 2 and m >= 2:
        lo, hi = number(best.get(f"{TPS}_min")), number(runner_up.get(f"{TPS}_max"))
        if lo is not None and hi is not None and lo > hi:
            return sure, (
                f"the next, {name}, is {100 * gap:.1f}% slower: separable (every one of "
                f"{n} repeats faster than each of its {m})"
            )
        return sure, (
            f"the next, {name}, is within {100 * gap:.1f}%: within the noise (their "
            f"repeats overlap, {n} vs {m})"
        )
    if gap < SINGLE_RUN_NOISE:
        return sure, (f"the next, {name}, is within {100 * gap:.1f}%: not separable with 1 repeat")
    return sure, (
        f"the next, {name}, is {100 * gap:.1f}% slower (1 repeat: no spread measured; "
        "--repeats 3 would confirm it)"
    )


def _unit(cells: pd.DataFrame) -> str:
    devices = set(cells["device"].astype(str)) if "device" in cells.columns else {"gpu"}
    if devices == {"cpu"}:
        return "process-h"
    return "GPU-h" if devices <= {"gpu", "None", "nan"} else "device-h"


def markdown(cells: pd.DataFrame) -> list[str]:
    """The recommendation section, first in summary.md (after the title)."""
    if cells.empty:
        return []
    usable = candidates(cells)
    excluded = len(cells) - len(usable)
    lines = ["## Recommendation", ""]
    if usable.empty:
        return [*lines, f"No cell finished ok ({len(cells)} cell(s)): nothing to recommend.", ""]
    unit = _unit(usable)
    priced = "cost_per_1m_tokens_usd" in usable.columns and bool(
        pd.to_numeric(usable["cost_per_1m_tokens_usd"], errors="coerce").notna().any()
    )
    headers = ["model", "GPUs", "fastest cell", "tokens/s", f"{unit} per 1M tokens"]
    headers += ["$ per 1M tokens"] if priced else []
    headers += ["how sure", "runner-up"]
    body: list[list[str]] = []
    warnings: list[str] = []
    cheapest: list[str] = []
    group_keys = [k for k in ("model_name_or_path", "device") if k in usable.columns]
    for model_key, by_model in usable.groupby(
        [usable[k].astype(str) for k in group_keys], sort=False
    ):
        model = model_key[0] if isinstance(model_key, tuple) else model_key
        per_model_best: list[Mapping[Any, Any]] = []
        gpu_counts = pd.to_numeric(by_model["num_gpus"], errors="coerce")
        for _, group in by_model.groupby(gpu_counts, sort=True):
            ranked = group.assign(_tps=pd.to_numeric(group[TPS], errors="coerce")).sort_values(
                "_tps", ascending=False, kind="stable"
            )
            records = ranked.drop(columns="_tps").to_dict("records")
            trusted = [c for c in records if not equivalence.flagged(c)] or records
            best = trusted[0]
            if equivalence.flagged(best):
                warnings.append(
                    f"- **warning**: `{best.get('cell_id')}` is recommended although its loss "
                    f"departs from its baseline's ({_gap(best)}): every cell at "
                    f"{_int(best.get('num_gpus'))} {_workers(best)} of {model} does."
                )
            for faster in records[: records.index(best)]:
                warnings.append(
                    f"- **warning**: `{faster.get('cell_id')}` ({label(faster)}) is faster "
                    f"({_fmt_tps(faster)} tokens/s) but its loss departs from its baseline's "
                    f"({_gap(faster)}, {faster.get('loss_vs_baseline')}): not recommended."
                )
            others = [c for c in trusted if c is not best]
            sure, runner = how_sure(best, others[0] if others else None)
            hours = device_hours_per_1m(best)
            row = [
                str(model),
                _int(best.get("num_gpus")),
                f"`{best.get('cell_id')}` ({label(best)})",
                _fmt_tps(best),
                "–" if hours is None else f"{hours:.4g}",
            ]
            if priced:
                row.append(_usd(best.get("cost_per_1m_tokens_usd")))
            body.append([*row, sure, runner])
            per_model_best.extend(trusted)
        cheap = min(per_model_best, key=lambda c: device_hours_per_1m(c) or math.inf)
        hours = device_hours_per_1m(cheap)
        if hours is not None:
            price = number(cheap.get("cost_per_1m_tokens_usd")) if priced else None
            cheapest.append(
                f"- cheapest per 1M tokens for {model}: `{cheap.get('cell_id')}` "
                f"({label(cheap)}) on {_int(cheap.get('num_gpus'))} {_workers(cheap)}: {hours:.4g} "
                f"{unit}" + (f" ({_usd(price)})" if price is not None else "")
            )
    intro = (
        "Per model and GPU count, the fastest cell that finished ok (median tokens/s over "
        "its repeats); oom, pruned, spared, failed and timed-out cells are never recommended"
        + (f" ({excluded} cell(s) left out)" if excluded else "")
        + ". Cost per 1M tokens is GPUs ÷ tokens/s (on the CPU, processes: "
        "process-hours), so at one GPU count the fastest cell is also the cheapest; the "
        "cheapest across GPU counts follows. A cell whose loss departs from its "
        "baseline's is not recommended as the fastest."
    )
    return [*lines, intro, "", *md_table(headers, body), "", *cheapest, *warnings, ""]


def _workers(cell: Mapping[Any, Any]) -> str:
    """What the GPU count counts: GPUs, or processes on the CPU."""
    return "process(es)" if str(cell.get("device")) == "cpu" else "GPU(s)"


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
