"""Run files that are there but cannot be read: their rows read failed, with a warning.

Real results folders on disk (``fakeruns.write_run``), damaged as a copy or a full
disk leaves them, and the report run as the command line runs it.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pandas as pd
from fakeruns import write_run

from orchestrator.cli.app import main
from orchestrator.contract import columns as registry
from orchestrator.contract.jsonio import read_json_object, read_json_object_reason
from orchestrator.results.collect import load, rows_from_folder

#: what the standard library says of ``{not json``
NOT_JSON = "Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"


def _raw_summary(folder: Path) -> dict[str, dict[str, str]]:
    with (folder / "raw_summary.csv").open(newline="", encoding="utf-8") as f:
        return {row["experiment_id"]: row for row in csv.DictReader(f)}


def _truncate(path: Path, size: int = 200) -> None:
    data = path.read_bytes()
    assert len(data) > size, "the record must be longer than what is kept of it"
    path.write_bytes(data[:size])


def test_reader_tells_missing_from_unreadable(tmp_path) -> None:
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"a": 1, "b": [1, 2, 3]}))
    truncated = tmp_path / "truncated.json"
    truncated.write_text('{\n  "a": 1,\n  "b": [1, 2')
    listed = tmp_path / "list.json"
    listed.write_text("[1, 2]")
    empty = tmp_path / "empty.json"
    empty.write_bytes(b"")
    folder = tmp_path / "folder.json"
    folder.mkdir()

    assert read_json_object_reason(good) == ({"a": 1, "b": [1, 2, 3]}, None)
    assert read_json_object_reason(tmp_path / "missing.json") == (None, None)
    # under a file, not a folder: missing too (a stray file in runs/)
    assert read_json_object_reason(good / "spec.json") == (None, None)
    assert read_json_object_reason(truncated) == (
        None,
        "truncated or not JSON: Expecting ',' delimiter: line 3 column 13 (char 24)",
    )
    assert read_json_object_reason(empty) == (
        None,
        "truncated or not JSON: Expecting value: line 1 column 1 (char 0)",
    )
    assert read_json_object_reason(listed) == (None, "not a JSON object")
    assert read_json_object_reason(folder) == (None, "Is a directory")
    # the old reader is unchanged: None for all but the object
    assert read_json_object(good) == {"a": 1, "b": [1, 2, 3]}
    for path in (tmp_path / "missing.json", truncated, empty, listed, folder):
        assert read_json_object(path) is None


def test_report_marks_unreadable_runs_failed_and_warns(tmp_path, capsys) -> None:
    root = tmp_path / "results"
    for eid in ("a.r0", "a.r1", "b", "c"):
        write_run(root, eid)
    assert main(["report", str(root), "--no-plots"]) == 0
    capsys.readouterr()
    _truncate(root / "runs" / "a.r1" / "result.json")
    (root / "runs" / "b" / "outcome.json").write_text("{not json")
    (root / "raw_summary.csv").unlink()

    assert main(["report", str(root), "--no-plots"]) == 0
    captured = capsys.readouterr()
    rows = _raw_summary(root)
    assert rows["a.r1"]["status"] == "failed"
    assert rows["a.r1"]["error"].startswith("result.json unreadable: truncated or not JSON: ")
    assert rows["b"]["status"] == "failed"
    assert rows["b"]["error"] == f"outcome.json unreadable: truncated or not JSON: {NOT_JSON}"
    # what the other files say is kept: the spec's columns, the readable figures
    assert rows["a.r1"]["cell_id"] == "a.r1" and rows["a.r1"]["framework_config"] == "fsdp"
    assert rows["b"]["tokens_per_second_global"] == "1000.0"
    assert (rows["a.r0"]["status"], rows["c"]["status"]) == ("ok", "ok")
    # no row is ok without the figures every run that trains reports
    figures = registry.with_role("run_figure")
    for row in rows.values():
        assert row["status"] != "ok" or any(row[c] for c in figures), row

    reason = rows["a.r1"]["error"].removeprefix("result.json unreadable: ")
    warnings = [
        f"runs/a.r1/result.json unreadable ({reason}); its row reads failed",
        f"runs/b/outcome.json unreadable (truncated or not JSON: {NOT_JSON}); its row reads failed",
    ]
    console = (captured.out + captured.err).splitlines()
    assert [line for line in console if line.startswith("warning:")] == [
        f"warning: {w}" for w in warnings
    ]
    assert "failed 2, ok 2" in captured.out
    summary = (root / "summary.md").read_text()
    for warning in warnings:
        assert summary.count(f"- **warning**: {warning}\n") == 1


def test_unreadable_spec_still_gives_a_row(tmp_path, capsys) -> None:
    root = tmp_path / "results"
    write_run(root, "a", scenario="lora", cell_id="cell-a")
    write_run(root, "b")
    (root / "runs" / "stray-file").write_text("not a run")  # not a run's folder: no row
    (root / "runs" / "empty").mkdir()  # no spec.json: no row
    assert main(["report", str(root), "--no-plots"]) == 0
    capsys.readouterr()
    _truncate(root / "runs" / "a" / "spec.json", 100)

    assert main(["report", str(root), "--no-plots"]) == 0
    rows = _raw_summary(root)
    assert sorted(rows) == ["a", "b"]
    assert rows["a"]["status"] == "failed"
    assert rows["a"]["error"].startswith("spec.json unreadable: truncated or not JSON: ")
    # the plan's columns from the last raw_summary.csv: still in its cell and scenario
    assert (rows["a"]["cell_id"], rows["a"]["scenario"]) == ("cell-a", "lora")
    assert rows["a"]["tokens_per_second_global"] == "1000.0"  # its result was read
    err = capsys.readouterr().err
    assert "warning: runs/a/spec.json unreadable (truncated or not JSON: " in err
    assert "- **warning**: runs/a/spec.json unreadable (" in (root / "summary.md").read_text()


def test_ok_without_figures_reads_failed(tmp_path) -> None:
    root = tmp_path / "results"
    write_run(root, "fine")
    bare = write_run(root, "bare")  # a result with no metrics
    record = json.loads((bare / "result.json").read_text())
    (bare / "result.json").write_text(json.dumps({**record, "metrics": {}}))
    (write_run(root, "gone") / "result.json").unlink()  # the parent said ok, no result
    rows = {row["experiment_id"]: row for row in rows_from_folder(root)}
    assert rows["fine"]["status"] == "ok" and rows["fine"]["error"] is None
    assert rows["bare"]["status"] == "failed"
    assert rows["bare"]["error"] == (
        "ok without figures: result.json has none of "
        "train_runtime, tokens_per_second_global, train_tokens_per_second, "
        "step_time_median_s, train_loss"
    )
    assert (rows["gone"]["status"], rows["gone"]["error"]) == (
        "failed",
        "ok without figures: no result.json",
    )


def test_a_recorded_verdict_other_than_ok_is_kept(tmp_path) -> None:
    root = tmp_path / "results"
    run = write_run(root, "big", status="oom", error="CUDA out of memory")
    (run / "result.json").write_text('{"status": "oom", "err')
    both = write_run(root, "both")
    (both / "result.json").write_text("[]")
    (both / "outcome.json").write_text("{not json")
    warnings: list[str] = []
    rows = {row["experiment_id"]: row for row in rows_from_folder(root, warnings=warnings)}
    assert rows["big"]["status"] == "oom"
    assert rows["big"]["error"].startswith("result.json unreadable: truncated or not JSON: ")
    assert rows["big"]["error"].endswith("; CUDA out of memory")
    assert rows["both"]["status"] == "failed"
    assert rows["both"]["error"] == (
        f"result.json unreadable: not a JSON object; "
        f"outcome.json unreadable: truncated or not JSON: {NOT_JSON}"
    )
    assert warnings[0].startswith("runs/big/result.json unreadable (truncated or not JSON: ")
    assert warnings[0].endswith("); its row reads oom")
    assert warnings[1:] == [
        "runs/both/result.json unreadable (not a JSON object); its row reads failed",
        f"runs/both/outcome.json unreadable (truncated or not JSON: {NOT_JSON}); "
        "its row reads failed",
    ]


def test_table_rows_keep_their_status(tmp_path) -> None:
    """The figures rule is the run folders': a table's ok row without figures stays ok."""
    folder = tmp_path / "copied"  # a folder with only its summary table
    folder.mkdir()
    table = folder / "raw_summary.csv"
    table.write_text("experiment_id,status,error,num_gpus\nx,ok,,1\n")
    for source in (table, folder):
        rows = load(source)
        assert rows.loc[0, "status"] == "ok" and pd.isna(rows.loc[0, "error"])
