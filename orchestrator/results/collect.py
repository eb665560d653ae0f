"""Read the rows of a results folder (or a summary CSV) into one normalised table.

Sources, in order of trust:

- a tunematrix results folder: every ``runs/<id>/`` (its ``spec.json``,
  ``outcome.json`` and ``result.json``), plus the planned experiments that
  never got a folder (from ``raw_summary.csv``, else ``plan.csv``);
- a ``raw_summary.csv`` or ``benchmarks.csv`` file, ours or the predecessor's
  (fms-acceleration), whose column names are mapped onto ours.

The table has one row per experiment and repeat, with the key columns always
present, so that report and compare need not care where rows came from. Rows
from before runs named their task and trainer are read as what they ran
(``LEGACY_TASK``, ``LEGACY_TRAINER``; the predecessor's ``PREDECESSOR_TRAINER``),
so a new run's ``sft`` and ``hf`` cells each meet their own kind in an old table.
"""

from __future__ import annotations

import csv
import itertools
import json
import math
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from orchestrator.contract import columns as registry
from orchestrator.contract.applicability import DEFAULT_TASK
from orchestrator.contract.columns import KEY_COLUMNS, TRAIN_RUNTIME
from orchestrator.contract.errors import UserError
from orchestrator.contract.jsonio import read_json_object_reason
from orchestrator.contract.outcome import outcome_from_record
from orchestrator.results.rows import build_row
from orchestrator.results.runrecords import RunRecords

#: other names of a scenario argument -> ours; a declared column's other names
#: (the predecessor's, older tables') are declared with it (``Column.aliases``)
ARGUMENT_ALIASES = {"acceleration_framework_config_file": "framework_config_file"}


def aliases() -> dict[str, str]:
    """Other column names -> ours (same meaning and units)."""
    return {**registry.alias_map(), **ARGUMENT_ALIASES}


#: what the rows of tables made before runs named their task and trainer ran: a
#: causal LM, with the plain Trainer (ours, whose only trainer then was ``hf``) or with
#: TRL's SFTTrainer (the predecessor's fms-hf-tuning ``sft_trainer.py``)
LEGACY_TASK = DEFAULT_TASK
LEGACY_TRAINER = "hf"
PREDECESSOR_TRAINER = "sft"

#: key columns read as numbers (the plan's position is empty in older tables)
NUMERIC = registry.with_role("numeric")


def _csv_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a CSV table, after the ``#`` lines that may open it (``_comment_lines``)."""
    comments = _comment_lines(path)
    with path.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(itertools.islice(f, comments, None))
        rows = list(reader)
    for number, row in enumerate(rows, 1):
        if None in row:  # DictReader's key for the fields past the header's
            raise UserError(
                f"{path}: data row {number} has more fields than the header has columns "
                f"({len(reader.fieldnames or ())})"
            )
    return rows


def _our_names(row: dict[str, Any]) -> dict[str, Any]:
    """A row of one of our older tables under today's column names (``slurm_job_id``
    is ``job_id`` now), where it does not have the new name already."""
    names = registry.alias_map()
    return {names[k] if k in names and names[k] not in row else k: v for k, v in row.items()}


def is_results_folder(path: Path) -> bool:
    return path.is_dir() and any(
        (path / name).exists() for name in ("runs", "plan.csv", "raw_summary.csv")
    )


#: the run's records whose file may be unreadable, in the order a row's error names them
_RECORDS = ("spec.json", "result.json", "outcome.json")


def _figure(value: Any) -> bool:
    """Whether a cell holds a figure (not empty, not NaN)."""
    return value is not None and value != "" and value == value


#: the columns whose source is the parent's outcome record
_OUTCOME_COLUMNS = registry.select(source="outcome")


def rows_from_folder(
    root: Path, runs: RunRecords | None = None, warnings: list[str] | None = None
) -> list[dict[str, Any]]:
    """Rows of a tunematrix results folder, rebuilt from its run folders; ``runs`` keeps
    what the loss check and plot read of each run (``runrecords``).

    A run whose ``spec.json``, ``result.json`` or ``outcome.json`` is there but cannot
    be read (truncated, not JSON) reads ``failed``, its error naming the file and why
    (``result.json unreadable: <reason>``), with what the other files say; a recorded
    verdict other than ok (oom, timeout, ...) is kept, after that note. Its experiment
    id is its folder's name, and where its spec is unreadable, the plan's columns come
    from ``raw_summary.csv`` or ``plan.csv``, where they have the experiment. One line
    per unreadable file goes to ``warnings``: ``runs/<id>/result.json unreadable
    (<reason>); its row reads failed``. A row that would read ok without any of the
    figures every run that trains reports (the ``run_figure`` columns) reads failed,
    its error saying so.
    """
    rows: dict[str, dict[str, Any]] = {}
    #: the experiments whose spec.json was unreadable: their plan columns come from a table
    unplanned: set[str] = set()
    #: the verdicts of the experiments recorded without a launch
    verdicts: dict[str, dict[str, Any]] = {}
    figures = registry.with_role("run_figure")
    folder = root / "runs"
    if folder.is_dir():
        for name in sorted(os.listdir(folder)):
            run = os.path.join(folder, name)
            spec, spec_problem = read_json_object_reason(os.path.join(run, "spec.json"))
            record, record_problem = read_json_object_reason(os.path.join(run, "outcome.json"))
            recorded = outcome_from_record(record) if record is not None else None
            if spec is None and spec_problem is None:
                # no spec.json: not a run's folder, or a cell never launched (pruned,
                # spared), whose verdict is all its folder holds; its row is the tables'
                if recorded is not None:
                    verdicts[name] = _verdict(recorded.as_dict(recorded_only=True))
                continue
            result, result_problem = read_json_object_reason(os.path.join(run, "result.json"))
            outcome = recorded.as_dict(recorded_only=True) if recorded is not None else {}
            if not outcome:
                # No parent record (a job collected later, or still running):
                # the child's own result is all there is.
                if result is not None:
                    outcome = {"status": result.get("status"), "error": result.get("error")}
                else:
                    outcome = {
                        "status": "interrupted",
                        "error": "the run left no outcome (stopped, or still running)",
                    }
                outcome["log"] = f"runs/{name}/stderr.log"
            if spec is None:
                spec = {"experiment_id": name}
                unplanned.add(name)
            row = build_row(spec, outcome, result)
            if spec_problem or result_problem or record_problem:
                found = (spec_problem, result_problem, record_problem)
                problems = [(f, p) for f, p in zip(_RECORDS, found, strict=True) if p]
                _unreadable(row, problems, keep_verdict=recorded is not None)
                if warnings is not None:
                    warnings += [
                        f"runs/{name}/{file} unreadable ({problem}); its row reads "
                        + str(row["status"])
                        for file, problem in problems
                    ]
            elif row.get("status") == "ok" and not any(_figure(row.get(c)) for c in figures):
                row["status"] = "failed"
                row["error"] = "ok without figures: " + (
                    f"result.json has none of {', '.join(figures)}"
                    if result is not None
                    else "no result.json"
                )
            rows[str(row["experiment_id"])] = row
            if runs is not None:
                runs.keep(name, spec, result)
    # Planned experiments without a run: the run's summary says why (interrupted, not run
    # after --fail-fast), else their recorded verdict (pruned, spared), else they are
    # still only planned.
    planned = [c.name for c in registry.select(source="plan")] if unplanned else []
    for name, status in (("raw_summary.csv", None), ("plan.csv", "planned")):
        path = root / name
        if not path.is_file():
            continue
        for row in map(_our_names, _csv_rows(path)):
            eid = row.get("experiment_id")
            if eid in unplanned:
                # a run whose spec.json is unreadable: the plan's columns as tabled
                rebuilt = rows[eid]
                for column in planned:
                    if rebuilt.get(column) is None and row.get(column) not in (None, ""):
                        rebuilt[column] = row[column]
            elif eid and eid not in rows:
                if status is not None:
                    row.update(verdicts.get(eid) or {"status": status})
                rows[eid] = row
    return list(rows.values())


def _verdict(outcome: Mapping[str, Any]) -> dict[str, Any]:
    """The columns an outcome fills (status, error, ...), those it has."""
    row = build_row({}, outcome, None)
    return {c.name: row[c.name] for c in _OUTCOME_COLUMNS if row.get(c.name) is not None}


def _unreadable(
    row: dict[str, Any], problems: list[tuple[str, str]], *, keep_verdict: bool
) -> None:
    """Mark a row whose run left ``problems`` (file, why unreadable): it reads failed,
    or, where ``keep_verdict`` and the parent recorded a verdict other than ok, that
    verdict, and its error names the files first."""
    note = "; ".join(f"{file} unreadable: {problem}" for file, problem in problems)
    status, error = row.get("status"), row.get("error")
    if keep_verdict and status not in (None, "ok"):
        row["error"] = f"{note}; {error}" if error else note
    else:
        row["status"], row["error"] = "failed", note


def _is_predecessor(columns: Iterable[str]) -> bool:
    return "status" not in set(columns)


def _predecessor_status(row: Mapping[Any, Any]) -> tuple[str, str | None]:
    error = row.get("error_messages")
    if isinstance(error, str) and error.strip():
        return "failed", " ".join(error.split())[:300]
    runtime = row.get(TRAIN_RUNTIME)
    if runtime is None or (isinstance(runtime, float) and math.isnan(runtime)) or runtime == "":
        # the predecessor recorded failed and out-of-memory runs with empty metrics
        return "failed", "no metrics in the predecessor's table (failed or out of memory)"
    return "ok", None


def _labels(column: pd.Series, missing: str) -> pd.Series:
    """A label column as text, with ``missing`` for empty cells (whatever dtype it was read as)."""
    text = column.astype(object).where(column.notna(), missing).astype(str)
    return text.replace({"None": missing, "nan": missing})


def raw_rows(
    source: Path, runs: RunRecords | None = None, warnings: list[str] | None = None
) -> tuple[list[dict[str, Any]], bool]:
    """The rows of a results folder or a summary CSV as read, and whether they are the
    predecessor's; ``runs`` keeps the run folders' records, ``warnings`` gets a line per
    run file that could not be read (``rows_from_folder``)."""
    if source.is_dir():
        if not is_results_folder(source):
            raise UserError(
                f"{source} is not a results folder (no runs/, plan.csv or raw_summary.csv)"
            )
        if not ((source / "runs").is_dir() or (source / "plan.csv").is_file()):
            # a folder with only a summary table: the predecessor's, or a copied one
            return raw_rows(source / "raw_summary.csv")
        rows = rows_from_folder(source, runs, warnings)
        if not rows:
            raise UserError(f"{source} has no experiments")
        return rows, False
    if source.is_file():
        try:
            rows = _csv_rows(source)
        except (OSError, UnicodeDecodeError, csv.Error) as exc:
            raise UserError(f"{source}: cannot read it as CSV ({exc})") from None
        if not rows:
            raise UserError(f"{source} has no rows")
        return rows, _is_predecessor(rows[0])
    raise UserError(f"{source} not found")


def _table_file(source: Path) -> Path | None:
    """The CSV a source stands for, if it is one (a file, or a folder with only a summary)."""
    if source.is_file():
        return source
    if source.is_dir() and not ((source / "runs").is_dir() or (source / "plan.csv").is_file()):
        path = source / "raw_summary.csv"
        return path if path.is_file() else None
    return None


def load(source: Path) -> pd.DataFrame:
    """The normalised rows of a results folder or a summary CSV."""
    table = _table_file(source)
    if table is not None:
        # pandas' own reader: ten times faster than rows of dicts for large tables
        try:
            df = pd.read_csv(table, low_memory=False, skiprows=_comment_lines(table))
        except (OSError, UnicodeDecodeError, ValueError, pd.errors.ParserError) as exc:
            raise UserError(f"{table}: cannot read it as CSV ({exc})") from None
        if df.empty:
            raise UserError(f"{table} has no rows")
        return normalise(df, predecessor=_is_predecessor(df.columns), from_text=True)
    rows, predecessor = raw_rows(source)
    return normalise(pd.DataFrame(rows), predecessor=predecessor)


def normalise(
    df: pd.DataFrame, *, predecessor: bool = False, from_text: bool = False
) -> pd.DataFrame:
    """Our column names and types, the key columns present, missing labels filled.

    ``from_text``: the rows come from a CSV file, so no cell holds a list or mapping.
    """
    df = df.rename(
        columns={k: v for k, v in aliases().items() if k in df.columns and v not in df.columns}
    )
    df = df.replace({"": None})
    # lists and mappings (target_modules, swept lists) become their JSON text, so
    # that every cell can be compared, grouped and written to CSV alike
    structured = [] if from_text else [c for c in df.columns if pd.api.types.is_object_dtype(df[c])]
    for column in structured:
        values = df[column].tolist()
        if any(isinstance(v, (list, dict)) for v in values):
            df[column] = pd.Series(
                [
                    json.dumps(v, sort_keys=True) if isinstance(v, (list, dict)) else v
                    for v in values
                ],
                index=df.index,
            )
    for column in KEY_COLUMNS:
        if column not in df.columns:
            df[column] = None
    predecessor = predecessor or bool(df["status"].isna().all())
    for column, legacy in (
        ("task", LEGACY_TASK),
        ("trainer", PREDECESSOR_TRAINER if predecessor else LEGACY_TRAINER),
    ):
        df[column] = df[column].astype(object).where(df[column].notna(), legacy)
    if predecessor:
        statuses = [_predecessor_status(r) for r in df.to_dict("records")]
        df["status"] = [s for s, _ in statuses]
        if "error" not in df.columns:
            df["error"] = None
        df["error"] = [e for _, e in statuses]
        if df["experiment_id"].isna().all():
            df["experiment_id"] = [f"row-{i}" for i in range(len(df))]
    for column in df.columns:
        if pd.api.types.is_numeric_dtype(df[column]) or column in (
            "experiment_id",
            "cell_id",
            "scenario",
            "framework_config",
            "model_name_or_path",
            "status",
            "error",
            "log",
        ):
            continue
        converted = pd.to_numeric(df[column], errors="coerce")
        present = df[column].notna()
        if present.any() and converted[present].notna().all():
            df[column] = converted
    for column in NUMERIC:
        df[column] = pd.to_numeric(df[column], errors="coerce")
    df["repeat"] = df["repeat"].fillna(0).astype(int)
    df["framework_config"] = _labels(df["framework_config"], "none")
    df["peft_method"] = _labels(df["peft_method"], "none")
    df["scenario"] = _labels(df["scenario"], "")
    if df["cell_id"].isna().any():
        df["cell_id"] = (
            df["cell_id"].astype(object).where(df["cell_id"].notna(), df["experiment_id"])
        )
    if "error" not in df.columns:
        df["error"] = None
    return df.reset_index(drop=True)


def _comment_lines(table: Path) -> int:
    """How many lines open ``table`` as a comment (``#``: where it came from, its
    licence) before the header; none is read as a row."""
    count = 0
    with open(table, encoding="utf-8", errors="replace") as f:
        for line in f:
            if not line.startswith("#"):
                break
            count += 1
    return count
