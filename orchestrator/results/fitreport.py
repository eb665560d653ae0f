"""A fit's answer as files: ``fit.json``, ``fit.md``, and its section of ``summary.md``.

``tunematrix fit`` (``orchestrator.running.fitrun``) searches, per setup and
searched key, the largest per-device batch or sequence length that fits; this module
only writes and reads what it found, so a report can show it from the files alone.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.contract.layout import ResultsLayout, write_atomic
from orchestrator.results.capacity import GIB, gib
from orchestrator.results.mdtable import md_table

#: the version of fit.json's shape
FIT_VERSION = 1
#: why a search ended, in words
ENDINGS = {
    "bracketed": "between a probe that fitted and the next value, which did not",
    "limit": "the limit was reached, every probe fitted",
    "nothing fits": "the lower bound did not fit",
    "stopped": "a probe failed for a reason other than memory",
}


@dataclass
class ProbeRecord:
    """One probe: a short run of the search's setup at one value."""

    value: int
    experiment_id: str
    status: str
    #: ``fits``, ``too_big`` or ``stop`` (``orchestrator.matrix.fitsearch.Verdict``)
    verdict: str
    #: why it did not fit, or why it stopped the search
    reason: str | None = None
    peak_memory_bytes: float | None = None
    peak_memory_source: str | None = None
    tokens_per_second: float | None = None
    wall_s: float | None = None
    #: taken from an earlier fit into the same folder, not launched again
    reused: bool = False


@dataclass
class SearchFit:
    """One search: what stays fixed, the bounds, the answer, the probes (fit.json's keys:
    ``family`` is the search's label, ``family_id`` its key)."""

    family: str
    family_id: str
    searched: str
    scenario: str
    model: str
    framework: str
    device: str
    num_gpus: int
    #: the planned cells of the search (the matrix's own, which the search never changes)
    cells: list[str]
    low: int
    limit: int | None
    margin: float
    #: one device's memory the margin is taken of (a GPU's; on the CPU, the job's limit)
    capacity_bytes: float | None
    capacity_source: str | None
    largest_fit: int | None = None
    tokens_per_second: float | None = None
    peak_memory_bytes: float | None = None
    first_too_big: int | None = None
    why_too_big: str | None = None
    #: the probe's failure that stopped the search (not a verdict on memory)
    stopped_by: str | None = None
    #: ``bracketed``, ``limit``, ``nothing fits`` or ``stopped`` (None: not finished)
    ending: str | None = None
    notes: list[str] = field(default_factory=list)
    probes: list[ProbeRecord] = field(default_factory=list)


@dataclass
class FitRecord:
    """Every search of one fit (``families``: fit.json's key)."""

    probe_steps: int
    families: list[SearchFit]
    interrupted: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {"fit_version": FIT_VERSION, **asdict(self)}


def write_fit(layout: ResultsLayout, record: FitRecord) -> None:
    """fit.json and fit.md, each written whole."""
    write_atomic(layout.fit_json, json.dumps(record.as_dict(), indent=2) + "\n")
    write_atomic(layout.fit_md, "\n".join(fit_markdown(record)) + "\n")


def read_fit(path: Path) -> FitRecord | None:
    """The fit.json at ``path``; None where there is none or it is not one."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        searches = [
            SearchFit(
                **{
                    **{k: v for k, v in search.items() if k != "probes"},
                    "probes": [ProbeRecord(**p) for p in search["probes"]],
                }
            )
            for search in data["families"]
        ]
        return FitRecord(
            probe_steps=int(data["probe_steps"]),
            families=searches,
            interrupted=bool(data.get("interrupted", False)),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _num(value: float | None, digits: int = 0) -> str:
    return "" if value is None else f"{value:,.{digits}f}"


def _gib(value: float | None) -> str:
    return "" if value is None else gib(value)


def _value(value: int | None) -> str:
    return "" if value is None else str(value)


def answer_rows(record: FitRecord) -> tuple[list[str], list[list[str]]]:
    """One row per search: the largest value that fits, its speed and memory, the first miss."""
    headers = [
        "family",
        "searched",
        "largest that fits",
        "tokens/s",
        "peak mem GiB",
        "first that did not",
        "why",
        "probes",
    ]
    rows = []
    for f in record.families:
        if f.ending == "stopped":
            why = f"search stopped: {f.stopped_by}"
        else:
            why = f.why_too_big or ENDINGS.get(f.ending or "", "not finished")
        rows.append(
            [
                f.family,
                f.searched,
                _value(f.largest_fit) or "none",
                _num(f.tokens_per_second),
                _gib(f.peak_memory_bytes),
                _value(f.first_too_big) or ("above the limit" if f.ending == "limit" else ""),
                why,
                str(len(f.probes)),
            ]
        )
    return headers, rows


def probe_rows(search: SearchFit) -> tuple[list[str], list[list[str]]]:
    headers = [search.searched, "status", "verdict", "peak mem GiB", "tokens/s", "wall s", "id"]
    rows = [
        [
            str(p.value),
            p.status + (" (reused)" if p.reused else ""),
            p.verdict + (f": {p.reason}" if p.reason else ""),
            _gib(p.peak_memory_bytes),
            _num(p.tokens_per_second),
            _num(p.wall_s, 1),
            p.experiment_id,
        ]
        for p in search.probes
    ]
    return headers, rows


def fit_markdown(record: FitRecord) -> list[str]:
    """fit.md: the answers, then each search's bounds, capacity and probes."""
    lines = ["# Largest that fits", ""]
    lines += [
        f"Each probe is a fresh launch of {record.probe_steps} step(s) with gradient "
        "accumulation 1. The matrix itself is never changed: this only reports.",
        "",
    ]
    if record.interrupted:
        lines += ["The fit was interrupted: the families below are as far as it got.", ""]
    headers, rows = answer_rows(record)
    lines += md_table(headers, rows)
    for f in record.families:
        lines += ["", f"## {f.family}", ""]
        bounds = f"from {f.low}" + (f" up to the limit {f.limit}" if f.limit else "")
        lines.append(f"- searched {f.searched} {bounds}; ended: {ENDINGS.get(f.ending or '', '')}")
        if f.capacity_bytes is not None:
            lines.append(
                f"- margin {f.margin:g}: a probe above {(1 - f.margin) * f.capacity_bytes / GIB:.2f} "
                f"GiB of {f.capacity_bytes / GIB:.2f} GiB ({f.capacity_source}) does not fit"
            )
        else:
            lines.append("- the device's memory is unknown here: no margin applied")
        lines += [f"- {note}" for note in f.notes]
        lines.append(f"- planned cells: {', '.join(f.cells)}")
        lines.append("")
        headers, rows = probe_rows(f)
        lines += md_table(headers, rows)
    return lines


def summary_section(root: Path) -> list[str]:
    """summary.md's "Largest that fits" section, from ``<root>/fit/fit.json`` (none: nothing)."""
    layout = ResultsLayout(root)
    fit_folder = ResultsLayout(layout.fit)
    record = read_fit(fit_folder.fit_json)
    if record is None:
        return []
    headers, rows = answer_rows(record)
    return [
        "",
        "## Largest that fits",
        "",
        f"Searched by fresh probes of {record.probe_steps} step(s) each, in "
        f"[{layout.relative(fit_folder.fit_md)}]({layout.relative(fit_folder.fit_md)}); "
        "the matrix above ran as configured.",
        "",
        *md_table(headers, rows),
    ]
