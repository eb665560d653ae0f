"""``orchestrator.run()`` and ``tunematrix run`` on the same files write the same results,
the fit of a ``search:`` scenario included (the API once ran the matrix and dropped the
search, with no word).

Each side is a real run of the tiny Llama on the CPU: one matrix cell, then the
search's probes (batch 1 and 2, up to the scenario's limit). The tables must
agree on every column but the measured ones (times, speeds, memory, the launch id):
the same cells, statuses, settings, token counts and losses.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from test_run import REPO, env

pytestmark = [pytest.mark.e2e, pytest.mark.long]

SCENARIOS = f"""\
frameworks:
  ddp: {{accelerate_config: {REPO / "accelerate-ddp.yaml"}}}
matrix:
  effective_batch_size: [4]
  max_seq_len: [64]
scenarios:
  - name: searched
    device: cpu
    framework_config: [ddp]
    num_gpus: [1]
    search: {{max: per_device_train_batch_size, limit: 2}}
    arguments:
      model_name_or_path: tiny-llama
      torch_dtype: float32
"""
DEFAULTS = "max_steps: 2\nlogging_steps: 1\nreport_to: none\nsave_strategy: 'no'\nseed: 42\n"

API = """\
import sys
import orchestrator
done = orchestrator.run("scenarios.yaml", "api", defaults="defaults.yaml", device="cpu")
sys.exit(done.exit_code)
"""

#: the figures a run measures rather than is configured or counts: they differ run to run
MEASURED_PARTS = ("per_second", "_bytes", "tflops", "util", "page_faults")
MEASURED_NAMES = {"launch_id", "train_runtime", "started_at", "finished_at"}


def measured(name: str) -> bool:
    return name in MEASURED_NAMES or name.endswith("_s") or any(p in name for p in MEASURED_PARTS)


def table(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with path.open() as f:
        reader = csv.DictReader(f)
        rows = list(reader)
    return list(reader.fieldnames or []), rows


def unmeasured(value: Any) -> Any:
    """``value`` (read from fit.json) without its measured keys, at any depth."""
    if isinstance(value, dict):
        return {k: unmeasured(v) for k, v in value.items() if not measured(k)}
    if isinstance(value, list):
        return [unmeasured(v) for v in value]
    return value


def md_tables(path: Path) -> list[list[str]]:
    """fit.md's table rows, the cells of measured columns (tokens/s, memory, wall) blank."""
    out: list[list[str]] = []
    header: list[str] = []
    for line in path.read_text().splitlines():
        if not line.startswith("|"):
            header = []
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        if not header:
            header = cells
        elif set(line) <= set("|- "):
            continue
        keep = [
            c if not any(w in h for w in ("tokens/s", "mem", "wall")) else ""
            for h, c in zip(header, cells, strict=True)
        ]
        out.append(keep)
    return out


def test_the_api_and_the_command_line_write_the_same_files(tmp_path: Path) -> None:
    (tmp_path / "scenarios.yaml").write_text(SCENARIOS)
    (tmp_path / "defaults.yaml").write_text(DEFAULTS)
    common = ("--scenarios", "scenarios.yaml", "--defaults", "defaults.yaml", "--device", "cpu")
    for argv in (
        [sys.executable, "-m", "orchestrator", "run", *common, "--results", "cli"],
        [sys.executable, "-c", API],
    ):
        done = subprocess.run(
            argv, cwd=tmp_path, env=env(), capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    cli, api = tmp_path / "cli", tmp_path / "api"
    for name in ("raw_summary.csv", "fit/raw_summary.csv"):
        (cli_columns, cli_rows), (api_columns, api_rows) = table(cli / name), table(api / name)
        assert cli_columns == api_columns, name
        assert [r["experiment_id"] for r in cli_rows] == [r["experiment_id"] for r in api_rows]
        assert {r["status"] for r in cli_rows} == {"ok"}, name
        compared = [c for c in cli_columns if not measured(c)]
        # the comparison holds what a reader decides from, not just the ids
        assert {"status", "tokens_total", "per_device_train_batch_size", "train_loss"} <= set(
            compared
        )
        for cli_row, api_row in zip(cli_rows, api_rows, strict=True):
            assert {c: cli_row[c] for c in compared} == {c: api_row[c] for c in compared}, name
    # the search ran on both sides: two probes, the answer the limit
    cli_fit = json.loads((cli / "fit" / "fit.json").read_text())
    api_fit = json.loads((api / "fit" / "fit.json").read_text())
    (search,) = cli_fit["families"]
    assert [p["value"] for p in search["probes"]] == [1, 2]
    assert search["largest_fit"] == 2
    assert unmeasured(cli_fit) == unmeasured(api_fit)
    assert md_tables(cli / "fit" / "fit.md") == md_tables(api / "fit" / "fit.md")
    # and summary.md, written again after the search, has its section on both sides
    for side in (cli, api):
        assert "## Largest that fits" in (side / "summary.md").read_text()
