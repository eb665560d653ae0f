"""The local results store: every completed run, appended to one SQLite file.

``RESULT_DIR/history.sqlite`` (kept in place when an earlier run is moved
aside) holds a table of runs — when, where, on what hardware and code — and a
table of their experiments with every figure of their summary row, so
``tunematrix history`` lists past runs and ``compare`` can take ``run:<id>``
as its reference even after the run's folder is gone.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Iterator, Mapping
from contextlib import closing, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.contract.columns import JOB_S, TOKENS_PER_SECOND
from orchestrator.contract.layout import file_mode

if TYPE_CHECKING:  # pandas only where a table is built: `tunematrix plan` reads the history too
    import pandas as pd

FILE_NAME = "history.sqlite"

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id INTEGER PRIMARY KEY AUTOINCREMENT,
    started_at TEXT,
    finished_at TEXT,
    results_dir TEXT,
    host TEXT,
    git_sha TEXT,
    gpus TEXT,
    torch TEXT,
    transformers TEXT,
    command TEXT,
    experiments INTEGER,
    counts TEXT,
    interrupted INTEGER
);
CREATE TABLE IF NOT EXISTS experiments (
    run_id INTEGER NOT NULL REFERENCES runs(run_id),
    experiment_id TEXT NOT NULL,
    cell_id TEXT,
    scenario TEXT,
    framework_config TEXT,
    model_name_or_path TEXT,
    num_gpus INTEGER,
    status TEXT,
    tokens_per_second_global REAL,
    row TEXT NOT NULL,
    PRIMARY KEY (run_id, experiment_id)
);
"""


def path_for(results: Path) -> Path:
    return results / FILE_NAME


@contextmanager
def _connect(db: Path) -> Iterator[sqlite3.Connection]:
    db.parent.mkdir(parents=True, exist_ok=True)
    new = not db.exists()
    with closing(sqlite3.connect(db, timeout=30)) as conn:
        conn.executescript(SCHEMA)
        if new:
            # SQLite creates its file 0o644 whatever the umask; the umask decides here
            os.chmod(db, file_mode())
        yield conn


def _clean(value: Any) -> Any:
    if isinstance(value, float) and value != value:  # NaN
        return None
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    return value


def record(db: Path, rows: pd.DataFrame, env: Mapping[str, Any], results_dir: Path) -> int:
    """Append a run and its experiments; returns the new run id."""
    gpus = [d.get("name") for d in ((env.get("gpus") or {}).get("devices") or [])]
    versions = env.get("versions") or {}
    counts = rows["status"].value_counts().to_dict() if len(rows) else {}
    with _connect(db) as conn, conn:
        cur = conn.execute(
            "INSERT INTO runs (started_at, finished_at, results_dir, host, git_sha, gpus, torch, "
            "transformers, command, experiments, counts, interrupted) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
            (
                env.get("started_at"),
                env.get("finished_at"),
                str(results_dir.resolve()),
                env.get("host"),
                env.get("tunematrix_git_sha"),
                json.dumps(gpus),
                versions.get("torch"),
                versions.get("transformers"),
                json.dumps(env.get("command") or []),
                len(rows),
                json.dumps(counts, sort_keys=True),
                int(bool(env.get("interrupted"))),
            ),
        )
        run_id = int(cur.lastrowid or 0)
        conn.executemany(
            "INSERT INTO experiments VALUES (?,?,?,?,?,?,?,?,?,?)",
            [
                (
                    run_id,
                    str(r.get("experiment_id")),
                    _clean(r.get("cell_id")),
                    _clean(r.get("scenario")),
                    _clean(r.get("framework_config")),
                    _clean(r.get("model_name_or_path")),
                    _clean(r.get("num_gpus")),
                    _clean(r.get("status")),
                    _clean(r.get(TOKENS_PER_SECOND)),
                    json.dumps({k: _clean(v) for k, v in r.items()}, default=str),
                )
                for r in rows.to_dict("records")
            ],
        )
    return run_id


def runs(db: Path) -> list[dict[str, Any]]:
    if not db.is_file():
        return []
    with _connect(db) as conn:
        conn.row_factory = sqlite3.Row
        return [dict(r) for r in conn.execute("SELECT * FROM runs ORDER BY run_id")]


def load_run(db: Path, run_id: int) -> pd.DataFrame:
    """The experiments of one recorded run, as the rows a report reads."""
    import pandas as pd

    if not db.is_file():
        raise LookupError(f"no history at {db}")
    with _connect(db) as conn:
        found = conn.execute("SELECT 1 FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        if not found:
            known = [r[0] for r in conn.execute("SELECT run_id FROM runs ORDER BY run_id")]
            raise LookupError(
                f"run {run_id} is not in {db}; recorded runs: {', '.join(map(str, known)) or 'none'}"
            )
        rows = [
            json.loads(r[0])
            for r in conn.execute(
                "SELECT row FROM experiments WHERE run_id = ? ORDER BY rowid", (run_id,)
            )
        ]
    return pd.DataFrame(rows)


def longest_ok_job(db: Path, cell_id: str) -> float | None:
    """The longest job time (s) of an ok run of ``cell_id`` on record, or None."""
    if not db.is_file():
        return None
    with _connect(db) as conn:
        rows = conn.execute(
            "SELECT row FROM experiments WHERE cell_id = ? AND status IN ('ok', 'skipped')",
            (cell_id,),
        ).fetchall()
    times = [json.loads(r[0]).get(JOB_S) for r in rows]
    values = [float(t) for t in times if isinstance(t, (int, float))]
    return max(values) if values else None


def ok_rows(db: Path) -> list[dict[str, Any]]:
    """The rows of every ok experiment on record, oldest run first (what an estimate of
    a plan's time is made from); empty without a history."""
    if not db.is_file():
        return []
    with _connect(db) as conn:
        found = conn.execute(
            "SELECT row FROM experiments WHERE status = 'ok' ORDER BY run_id, rowid"
        ).fetchall()
    out = []
    for (text,) in found:
        try:
            row = json.loads(text)
        except ValueError:
            continue
        if isinstance(row, dict):
            out.append(row)
    return out
