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

Ranked by energy (``rank_by="energy"``, ``--rank-by energy``), the question is
which cell uses the fewest joules per token (``energy_per_token_j``, lowest
median), among the cells that have the figure; how sure is judged on its
repeats the same way. A runner-up that ran under other conditions (another
power limit, throttled) is said to have.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from orchestrator.contract.columns import (
    COST_PER_1M_TOKENS,
    ENERGY_PER_TOKEN,
    GPU_CONDITIONS,
    TOKENS_PER_SECOND,
)
from orchestrator.contract.outcome import PRUNED, skip_from_error
from orchestrator.contract.wording import fewer, times, workers
from orchestrator.results import equivalence
from orchestrator.results.energyreport import conditions_differ
from orchestrator.results.mdtable import md_table
from orchestrator.results.numbers import number, whole
from orchestrator.results.tablecolumns import ran_on_cpu

#: with 1 repeat, a runner-up with fewer tokens/s by less than this share of the
#: fastest's is not separable (a usual run-to-run spread of throughput on one
#: machine is a few percent)
SINGLE_RUN_NOISE = 0.05
TPS = TOKENS_PER_SECOND


@dataclass(frozen=True)
class Ranking:
    """What the recommendation ranks cells by: a figure and which way is better."""

    name: str
    metric: str
    higher: bool
    #: the recommended cell, as the table's header names it
    best: str


#: the columns of a cell the recommendation reads
READ = tuple(
    dict.fromkeys(
        (
            "cell_id",
            "scenario",
            "model_name_or_path",
            "task",
            "device",
            "num_gpus",
            "framework_config",
            "per_device_train_batch_size",
            "gradient_accumulation_steps",
            "trainer",
            "peft_method",
            "max_seq_len",
            "status",
            "error",
            "repeats_ok",
            "loss_gap_pct",
            "loss_vs_baseline",
            COST_PER_1M_TOKENS,
            GPU_CONDITIONS,
            *(f"{m}{s}" for m in (TPS, ENERGY_PER_TOKEN) for s in ("", "_cv", "_min", "_max")),
        )
    )
)
SPEED = Ranking("speed", TPS, higher=True, best="fastest cell")
ENERGY = Ranking("energy", ENERGY_PER_TOKEN, higher=False, best="least energy per token")
#: the rankings ``--rank-by`` takes
RANK_BY = {r.name: r for r in (SPEED, ENERGY)}


def candidates(cells: pd.DataFrame, ranking: Ranking = SPEED) -> pd.DataFrame:
    """The cells that may be recommended: every repeat ok, a measured tokens/s (and the
    figure ranked by), not pruned."""
    if cells.empty or TPS not in cells.columns or ranking.metric not in cells.columns:
        none: pd.DataFrame = cells.iloc[0:0]
        return none
    tps = pd.to_numeric(cells[TPS], errors="coerce")
    ranked = pd.to_numeric(cells[ranking.metric], errors="coerce")
    error = cells["error"] if "error" in cells.columns else pd.Series("", index=cells.index)
    skips = [skip_from_error(e) for e in error]
    pruned = pd.Series([s is not None and s.kind == PRUNED for s in skips], index=cells.index)
    usable: pd.DataFrame = cells[
        (cells["status"] == "ok") & tps.notna() & (tps > 0) & (ranked > 0) & ~pruned
    ]
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


def how_sure(
    best: Mapping[Any, Any], runner_up: Mapping[Any, Any] | None, ranking: Ranking = SPEED
) -> tuple[str, str]:
    """The best cell's repeats and CV, and what can be said of the runner-up."""
    n = _repeats(best)
    metric = ranking.metric
    cv = number(best.get(f"{metric}_cv"))
    sure = f"{n} repeat{'s' if n != 1 else ''}" + (
        f", CV {100 * cv:.1f}%" if cv is not None else ""
    )
    if runner_up is None:
        return sure, "no other cell finished ok"
    ours, theirs = number(best.get(metric)), number(runner_up.get(metric))
    assert ours is not None and theirs is not None
    name = f"`{runner_up.get('cell_id')}` ({label(runner_up)})"
    if ranking.higher:
        short = 1 - theirs / ours
        faster = times(ours, theirs)
        behind = f"the next, {name}, has {fewer(ours, theirs)} (the fastest is {faster} as fast)"
        beats = "faster than"
    else:
        short = 1 - ours / theirs
        behind = f"the next, {name}, uses {100 * (theirs / ours - 1):.1f}% more energy per token"
        beats = "below"
    differ = conditions_differ(best, runner_up)
    behind += f" and ran under other conditions ({differ})" if differ else ""
    m = _repeats(runner_up)
    if n >= 2 and m >= 2:
        if ranking.higher:
            lo, hi = number(best.get(f"{metric}_min")), number(runner_up.get(f"{metric}_max"))
        else:
            lo, hi = number(runner_up.get(f"{metric}_min")), number(best.get(f"{metric}_max"))
        if lo is not None and hi is not None:
            if lo > hi:
                return (
                    sure,
                    f"{behind}: separable (every one of {n} repeats {beats} each of its {m})",
                )
            return sure, f"{behind}: within the noise (their repeats overlap, {n} vs {m})"
        # no spread of the figure is kept (energy per token: medians only)
        if short < SINGLE_RUN_NOISE:
            return sure, f"{behind}: not separable by their medians"
        return sure, f"{behind} (by medians: the spread of its repeats is not kept for this figure)"
    if short < SINGLE_RUN_NOISE:
        return sure, f"{behind}: not separable with 1 repeat"
    return sure, f"{behind}; 1 repeat: no spread measured, --repeats 3 would confirm it"


def _unit(cells: pd.DataFrame) -> str:
    devices = set(cells["device"].astype(str)) if "device" in cells.columns else {"gpu"}
    if devices == {"cpu"}:
        return "process-h"
    return "GPU-h" if devices <= {"gpu", "None", "nan"} else "device-h"


def markdown(cells: pd.DataFrame, rank_by: str = "speed") -> list[str]:
    """The recommendation section, first in summary.md after the reading guide;
    ``rank_by``: a key of ``RANK_BY``."""
    if cells.empty:
        return []
    ranking = RANK_BY[rank_by]
    usable = candidates(cells, ranking)
    excluded = len(cells) - len(usable)
    # only the columns read here: each group's records are built from them (with all of a
    # cell's columns, building them was most of the report's time over 10,000 cells)
    usable = usable[[c for c in READ if c in usable.columns]]
    lines = ["## Recommendation", ""]
    if usable.empty:
        return [*lines, f"{_why_none(cells, ranking)}: nothing to recommend.", ""]
    cpu = ran_on_cpu(usable)
    count = workers(cpu)
    unit = _unit(usable)
    priced = COST_PER_1M_TOKENS in usable.columns and bool(
        pd.to_numeric(usable[COST_PER_1M_TOKENS], errors="coerce").notna().any()
    )
    energy = ENERGY_PER_TOKEN in usable.columns and bool(
        pd.to_numeric(usable[ENERGY_PER_TOKEN], errors="coerce").notna().any()
    )
    figures = [ranking.best, "tokens/s", *(["J/token"] if energy else [])]
    figures += [f"{unit} per 1M tokens", *(["$ per 1M tokens"] if priced else [])]
    figures += ["how sure", "runner-up"]
    # every cell's record built once; a group is the positions of its cells
    rows = usable.to_dict("records")
    answers = _Answers(
        ranking,
        rows,
        pd.to_numeric(usable[ranking.metric], errors="coerce").tolist(),
        energy=energy,
        priced=priced,
    )
    gpus = pd.to_numeric(usable["num_gpus"], errors="coerce")
    model = usable["model_name_or_path"].astype(str)
    # a key an older table lacks groups as one value
    task, device = (
        usable[k].astype(str) if k in usable.columns else pd.Series("", usable.index)
        for k in ("task", "device")
    )
    scenarios = usable["scenario"].astype(str)
    # per scenario: the question each one asks
    per_scenario: list[list[str]] = []
    for key, group in _groups([scenarios, model, gpus]):
        scenario, name, n = (str(k) for k in key)
        on = workers(cpu, whole(n))
        row = answers.row(group, f"of scenario {scenario} at {on} of {name}")
        per_scenario.append([scenario, name, _int(n), *row])
    # across scenarios: only where they share the model, task, device and GPU count
    across: list[list[str]] = []
    scenario_of = scenarios.tolist()
    for key, group in _groups([model, task, device, gpus]):
        if len({scenario_of[i] for i in group}) < 2:
            continue
        name, kind, _, n = (str(k) for k in key)
        row = answers.row(group, f"of {name} at {workers(cpu, whole(n))}")
        across.append([name, kind or "–", _int(n), *row])
    # per model, task and device across GPU counts: the cheapest per 1M tokens
    cheapest = [
        line
        for key, group in _groups([model, task, device])
        if (line := _cheapest(str(key[0]), [rows[i] for i in group], unit, priced))
    ]
    intro = _intro(ranking, count, unit, excluded)
    lines += [intro, "", *md_table(["scenario", "model", count, *figures], per_scenario)]
    if across:
        lines += [
            "",
            f"Across scenarios, where two or more share the model, task and number of {count}:",
            "",
            *md_table(["model", "task", count, *figures], across),
        ]
    return [*lines, "", *cheapest, *answers.warnings, ""]


@dataclass
class _Answers:
    """The best trusted cell of each group of cells (positions in ``rows``), as its row
    of the tables; the warnings of the groups asked, in the order asked."""

    ranking: Ranking
    rows: list[dict[Any, Any]]
    #: each row's figure the ranking reads
    ranked_by: list[float]
    energy: bool
    priced: bool
    warnings: list[str] = field(default_factory=list)

    def row(self, group: list[int], where: str) -> list[str]:
        """The best trusted cell of ``group``: its row's figures."""
        ranking, ranked_by, rows, warnings = self.ranking, self.ranked_by, self.rows, self.warnings
        # the best first, ties in the table's order (the sort is stable)
        order = sorted(group, key=lambda i: -ranked_by[i] if ranking.higher else ranked_by[i])
        records = [rows[i] for i in order]
        trusted = [c for c in records if not equivalence.flagged(c)] or records
        best = trusted[0]
        if equivalence.flagged(best):
            warnings.append(
                f"- **warning**: `{best.get('cell_id')}` is recommended although its loss "
                f"departs from its baseline's ({_gap(best)}): every cell {where} does."
            )
        for better in records[: records.index(best)]:
            than = (
                f"is faster ({_fmt_tps(better)} tokens/s)"
                if ranking.higher
                else f"uses less energy ({_joules(better)} J/token)"
            )
            warnings.append(
                f"- **warning**: `{better.get('cell_id')}` ({label(better)}) {than} "
                f"but its loss departs from its baseline's "
                f"({_gap(better)}, {better.get('loss_vs_baseline')}): not recommended."
            )
        others = [c for c in trusted if c is not best]
        sure, runner = how_sure(best, others[0] if others else None, ranking)
        if not others and len(records) > 1:
            runner = (
                "every other cell that finished ok trains unlike its baseline (see Loss "
                "against the baseline)"
            )
        hours = device_hours_per_1m(best)
        row = [
            f"`{best.get('cell_id')}` ({label(best)})",
            _fmt_tps(best),
            *([_joules(best)] if self.energy else []),
            "–" if hours is None else f"{hours:.4g}",
        ]
        if self.priced:
            row.append(_usd(best.get(COST_PER_1M_TOKENS)))
        return [*row, sure, runner]


def _why_none(cells: pd.DataFrame, ranking: Ranking) -> str:
    """Why no cell can be recommended."""
    ok = int((cells["status"] == "ok").sum()) if "status" in cells.columns else 0
    if ok == 0:
        return f"No cell finished ok ({len(cells)} cell(s))"
    if ranking is SPEED or candidates(cells).empty:
        return (
            f"No cell has a measured tokens/s ({ok} of {len(cells)} cell(s) finished ok; "
            "HF's estimate is not a measurement)"
        )
    return (
        f"No cell that finished ok has an energy per token ({ok} of {len(cells)} "
        "cell(s) finished ok; see the Energy section for why)"
    )


def _cheapest(name: str, members: list[Mapping[Any, Any]], unit: str, priced: bool) -> str | None:
    """The line naming the cheapest cell per 1M tokens of model ``name`` on one task
    and device across GPU counts (a trusted one where there is one); None without the
    figure."""
    records = [c for c in members if not equivalence.flagged(c)]
    cheap = min(records or members, key=_hours_or_inf)
    hours = device_hours_per_1m(cheap)
    if hours is None:
        return None
    price = number(cheap.get(COST_PER_1M_TOKENS)) if priced else None
    on = workers(ran_on_cpu(cheap), whole(cheap.get("num_gpus")))
    return (
        f"- cheapest per 1M tokens for {name}: `{cheap.get('cell_id')}` "
        f"({label(cheap)}) on {on}: {hours:.4g} {unit}"
        + (f" ({_usd(price)})" if price is not None else "")
    )


def _intro(ranking: Ranking, count: str, unit: str, excluded: int) -> str:
    """What the section's tables recommend, and how."""
    left_out = f" ({excluded} cell(s) left out)" if excluded else ""
    if ranking is ENERGY:
        return (
            f"Ranked by energy (--rank-by energy): per scenario and number of {count}, the "
            "cell that finished ok with the fewest joules per token (median over its repeats, "
            "the measured steps; see the Energy section), among the cells that have the "
            f"figure; oom, pruned, spared, failed and timed-out cells are never recommended"
            f"{left_out}. The runner-up is the next lowest of the same group. A cell whose "
            "loss departs from its baseline's is not recommended."
        )
    return (
        f"Per scenario (the question it asks) and number of {count}, the fastest cell "
        "that finished ok (median tokens/s over its repeats); oom, pruned, spared, failed "
        f"and timed-out cells are never recommended{left_out}. Cost per 1M tokens is "
        f"{count} ÷ tokens/s, in {unit}, so at one count the fastest cell is also the "
        'cheapest. The runner-up is the next fastest of the same group; its "fewer '
        "tokens/s\" is 1 − its tokens/s ÷ the fastest's. A cell whose loss departs from "
        "its baseline's is not recommended as the fastest."
    )


def _groups(by: list[pd.Series]) -> list[tuple[tuple[Any, ...], list[int]]]:
    """The groups of a table by ``by`` (its columns, aligned), in the order their first
    cells come: each group's key and its cells' positions. A key with a missing value
    makes no group (as pandas' groupby drops it)."""
    numbers = pd.concat(by, axis=1).groupby(by, sort=False, dropna=True).ngroup().tolist()
    values = [s.tolist() for s in by]
    found: dict[int, tuple[tuple[Any, ...], list[int]]] = {}
    for position, group in enumerate(numbers):
        if group < 0:
            continue
        if group not in found:
            found[group] = (tuple(v[position] for v in values), [])
        found[group][1].append(position)
    return [found[n] for n in sorted(found)]


def _hours_or_inf(cell: Mapping[Any, Any]) -> float:
    hours = device_hours_per_1m(cell)
    return math.inf if hours is None else hours


def _gap(cell: Mapping[Any, Any]) -> str:
    gap = number(cell.get("loss_gap_pct"))
    return "gap unknown" if gap is None else f"loss gap {gap:.1f}%"


def _joules(cell: Mapping[Any, Any]) -> str:
    value = number(cell.get(ENERGY_PER_TOKEN))
    return "–" if value is None else f"{value:.4g}"


def _fmt_tps(cell: Mapping[Any, Any]) -> str:
    value = number(cell.get(TPS))
    return "–" if value is None else f"{value:,.0f}"


def _usd(value: Any) -> str:
    found = number(value)
    if found is None:
        return "–"
    return f"${found:,.4f}" if found < 1 else f"${found:,.2f}"
