"""``allocator: jemalloc``, for real: a tiny CPU cell runs with jemalloc preloaded, and its
row records the allocator its child found in force (not the one the file asked for).

The pure parts (the file's forms, ids, the job's environment, the child's reading of
its maps) are tests/unit/test_allocator.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_run import REPO, rows, tunematrix

from orchestrator.config.allocator import find_library

pytestmark = [pytest.mark.e2e, pytest.mark.long]

DEFAULTS = "max_steps: 3\nlogging_steps: 1\nreport_to: none\nsave_strategy: 'no'\nseed: 42\n"
SCENARIOS = f"""\
accelerate_config: {REPO / "accelerate-ddp.yaml"}
matrix:
  effective_batch_size: [2]
  max_seq_len: [64]
scenarios:
  - name: jemalloc
    device: cpu
    num_gpus: [1]
    allocator: jemalloc
    arguments:
      model_name_or_path: tiny-llama
      torch_dtype: float32
"""


def test_a_cell_under_jemalloc_records_it(tmp_path: Path) -> None:
    library = find_library("jemalloc")
    if library is None:
        pytest.skip("jemalloc is not installed here (apt-get install libjemalloc2)")
    (tmp_path / "defaults.yaml").write_text(DEFAULTS)
    (tmp_path / "scenarios.yaml").write_text(SCENARIOS)
    done = tunematrix(
        tmp_path,
        "--scenarios",
        "scenarios.yaml",
        "--defaults",
        "defaults.yaml",
        "--device",
        "cpu",
        "--no-check",
        "--results",
        "results",
        "--no-report",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (row,) = rows(tmp_path / "results")
    assert row["status"] == "ok"
    assert row["allocator"].startswith("jemalloc "), row["allocator"]
    # the library the child found serving malloc is the one the plan found (or its real path)
    assert Path(row["allocator"].split(" ", 1)[1]).resolve() == Path(library).resolve()
    command = (tmp_path / "results" / "runs" / row["experiment_id"] / "command.sh").read_text()
    assert f"export LD_PRELOAD={library}" in command
