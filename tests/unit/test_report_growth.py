"""How the report's work grows with a results folder, checked by counting, not timing.

A report over 10,000 run folders once read each ``result.json`` three times (the
rows, the loss check, the loss plot) and turned the cells table into records
once per scenario. These tests count what grows: the reads of each run's
records, and the table-to-records conversions as the number of scenarios grows.
The times themselves are measured by ``benchmarks/bench_report.py``.
"""

from __future__ import annotations

import builtins
import io
from collections import Counter
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from fakeruns import write_run

from orchestrator.results.markdown import summary_markdown
from orchestrator.results.report import CostSettings, build_report, write_report


def _folder(root: Path, scenarios: int) -> Path:
    """Per scenario, a baseline and a variant of two repeats each, with loss curves."""
    for s in range(scenarios):
        for framework in ("none", "fast"):
            for repeat in (0, 1):
                cell = f"sc{s}.m.{framework}.g1.eb8"
                write_run(
                    root,
                    cell + (f".r{repeat}" if repeat else ""),
                    scenario=f"sc{s}",
                    framework=framework,
                    cell_id=cell,
                    repeat=repeat,
                    tps=1000.0 + 10 * s + (50 if framework == "fast" else 0),
                    loss_history=[
                        [i, 2.0 - 0.1 * i - (0.3 if framework == "fast" else 0)]
                        for i in range(1, 6)
                    ],
                )
    return root


def test_each_run_record_is_read_once(tmp_path: Path, monkeypatch) -> None:
    """The loss check and the loss plot take the loss curves the read of the folder
    parsed: no record of a run is opened twice by one report."""
    root = _folder(tmp_path / "results", scenarios=3)
    opened: Counter[str] = Counter()
    real = builtins.open

    def counting(file: Any, *args: Any, **kwargs: Any) -> Any:
        if str(file).endswith(".json") and "/runs/" in str(file):
            opened[str(file)] += 1
        return real(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", counting)
    monkeypatch.setattr(io, "open", counting)
    report = write_report(root, tmp_path / "out", CostSettings())
    # the loss check compared the variants, and the loss plot was drawn
    assert set(report.cells["loss_vs_baseline"].dropna()) == {"baseline", "fast but different"}
    assert (tmp_path / "out" / "plots" / "loss.png").is_file()
    results = {f for f in opened if f.endswith("/result.json")}
    assert len(results) == 12
    assert max(opened.values()) == 1, opened.most_common(3)


def test_the_summary_turns_the_tables_into_records_a_fixed_number_of_times(
    tmp_path: Path, monkeypatch
) -> None:
    """summary.md's sections read cells through records made once: the to_dict calls do
    not grow with the number of scenarios (once per scenario, they were most of its
    time over 5,000 cells)."""
    calls: list[str] = []
    for cls in (pd.DataFrame, pd.Series):
        real = cls.to_dict

        def counted(self: Any, *args: Any, _real: Any = real, **kwargs: Any) -> Any:
            calls.append(type(self).__name__)
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(cls, "to_dict", counted)
    counts = []
    for scenarios in (2, 12):
        root = _folder(tmp_path / f"s{scenarios}", scenarios)
        report = build_report(root, CostSettings())
        calls.clear()
        text = summary_markdown(report, root, CostSettings())
        assert sum(line.startswith("## sc") for line in text.splitlines()) == scenarios
        counts.append(len(calls))
    assert counts[0] == counts[1], counts


@pytest.mark.parametrize("scenarios", [2, 12])
def test_the_report_builds_records_a_fixed_number_of_times(
    tmp_path: Path, monkeypatch, scenarios: int
) -> None:
    """The same for building the report's tables (the loss check's records of the cells)."""
    calls: list[int] = []
    real = pd.DataFrame.to_dict

    def counted(self: pd.DataFrame, *args: Any, **kwargs: Any) -> Any:
        calls.append(len(self))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(pd.DataFrame, "to_dict", counted)
    build_report(_folder(tmp_path / "results", scenarios), CostSettings())
    # one: the derived columns of the raw rows (report._raw_with_derived)
    assert len(calls) <= 1, calls
