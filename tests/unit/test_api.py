"""The Python API: ``from orchestrator import plan, run, report, compare``."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from orchestrator import api
from orchestrator.contract.errors import ConfigError, UserError
from orchestrator.matrix.experiment import Experiment

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"

SCENARIOS = """\
matrix:
  effective_batch_size: [4, 8]
scenarios:
  - name: tiny
    device: cpu
    num_gpus: [1, 2]
    arguments:
      model_name_or_path: tiny-llama
      max_seq_len: 64
"""


def test_the_facade_is_the_api() -> None:
    from orchestrator import compare, plan, report, run

    assert (plan, run, report, compare) == (api.plan, api.run, api.report, api.compare)
    # the modules behind the names can still be imported by their own names
    import orchestrator.matrix.table
    import orchestrator.results.compare
    import orchestrator.results.report

    assert orchestrator.plan is api.plan
    assert orchestrator.results.report.write_report is not None
    assert orchestrator.matrix.table.format_table is not None
    assert orchestrator.results.compare.compare is not api.compare


def test_plan_from_a_path_a_mapping_and_a_loaded_config(tmp_path: Path) -> None:
    import yaml

    path = tmp_path / "scenarios.yaml"
    path.write_text(SCENARIOS)
    from_path = api.plan(path, device="cpu", num_gpus=[1, 2])
    assert all(isinstance(e, Experiment) for e in from_path.experiments)
    assert len(from_path.experiments) == 4  # 2 GPU counts × 2 batch sizes
    # str paths, the loaded config and the file's content as a mapping plan the same
    assert api.plan(str(path), device="cpu", num_gpus=(1, 2)) == from_path
    assert api.plan(api.load(path), device="cpu", num_gpus=(1, 2)) == from_path
    mapping = api.plan(yaml.safe_load(SCENARIOS), device="cpu", num_gpus=(1, 2))
    assert [e.experiment_id for e in mapping.experiments] == [
        e.experiment_id for e in from_path.experiments
    ]
    # overrides of the file's axes, and a filter
    one = api.plan(path, device="cpu", num_gpus=1, effective_batch_size=8, filters="tiny")
    assert [(e.num_gpus, e.effective_batch_size) for e in one.experiments] == [(1, 8)]


def test_plan_of_a_mapping_resolves_relative_paths_from_the_current_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "dp.yaml").write_text("distributed_type: MULTI_GPU\nnum_processes: 1\n")
    monkeypatch.chdir(tmp_path)
    doc = {
        "frameworks": {"dp": {"accelerate_config": "dp.yaml"}},
        "scenarios": [
            {
                "name": "t",
                "device": "cpu",
                "framework_config": ["dp"],
                "arguments": {"model_name_or_path": "tiny-llama"},
            }
        ],
    }
    planned = api.plan(doc, device="cpu")
    assert {e.framework for e in planned.experiments} == {"dp"}
    # a mistake in a mapping is one line naming the key path, as for a file
    doc["scenarios"][0]["framework_config"] = ["nope"]
    with pytest.raises(ConfigError, match=r"scenarios\[0\]\.framework_config\[0\]: unknown"):
        api.plan(doc, device="cpu")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_gpus": 0}, "num_gpus: give positive integers"),
        ({"num_gpus": [1, 1]}, "listed twice"),
        ({"effective_batch_size": ["4"]}, "effective_batch_size: give positive integers"),
        ({"device": "tpu"}, "device must be auto, gpu or cpu"),
        ({"repeats": 0}, "repeats must be a positive integer"),
        ({"filters": "nothing-like-it"}, "filter 'nothing-like-it' matches no scenario"),
    ],
)
def test_plan_refuses_bad_input_with_one_line(
    tmp_path: Path, kwargs: dict[str, object], message: str
) -> None:
    path = tmp_path / "scenarios.yaml"
    path.write_text(SCENARIOS)
    with pytest.raises(UserError, match=message):
        api.plan(path, **{"device": "cpu", **kwargs})


def test_run_refuses_before_anything_starts(tmp_path: Path) -> None:
    path = tmp_path / "scenarios.yaml"
    path.write_text(SCENARIOS)
    planned = api.plan(path, device="cpu")
    with pytest.raises(UserError, match="num_gpus: options of plan"):
        api.run(planned, tmp_path / "results", num_gpus=2)
    with pytest.raises(UserError, match="memory_logging must be one of"):
        api.run(planned, tmp_path / "results", memory_logging="lots")
    with pytest.raises(UserError, match="slots only has a meaning with pack=True"):
        api.run(planned, tmp_path / "results", slots=2)
    for gib in (0.0, -80.0, float("inf")):
        with pytest.raises(UserError, match=r"^gpu_memory_gib must be a positive number, got "):
            api.run(planned, tmp_path / "results", gpu_memory_gib=gib)
        with pytest.raises(UserError, match=r"^gpu_memory_gib must be a positive number, got "):
            api.predict_memory(planned, gib)
    assert not (tmp_path / "results").exists()


@pytest.mark.parametrize("command", [["plan", "--memory"], ["run"]])
def test_a_gpu_memory_that_is_not_positive_is_refused_as_the_flag_is_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    from orchestrator.cli.app import main

    path = tmp_path / "scenarios.yaml"
    path.write_text(SCENARIOS)
    with pytest.raises(SystemExit) as exit_:
        main(
            [
                *command,
                "--scenarios",
                str(path),
                "--results",
                str(tmp_path / "r"),
                "--gpu-memory-gib",
                "-1",
            ]
        )
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.splitlines()[-1].endswith(
        "argument --gpu-memory-gib: -1 is not a positive number (see --help)"
    )
    assert not (tmp_path / "r").exists()


def test_report_and_compare_on_the_predecessors_tables(tmp_path: Path) -> None:
    old = FIXTURES / "fms_a100_80gb_2024-05-27.csv"
    new = FIXTURES / "fms_a100_80gb_2024-06-07.csv"
    written = api.report(new, tmp_path / "report", plots=False)
    assert len(written.rows) == 84
    assert (tmp_path / "report" / "summary.md") in written.written
    # compare takes paths or DataFrames, and says the same either way
    by_path = api.compare(new, old)
    frame = api.compare(pd.read_csv(new), pd.read_csv(old))
    assert by_path.keys == frame.keys
    # every one of the older table's 60 cells is matched: 40 with figures on both
    # sides, 20 failed on both; the newer table adds 24
    compared = by_path.table[by_path.keys].drop_duplicates()
    assert (len(compared), len(by_path.only_new), len(by_path.only_ref)) == (40, 24, 0)
    assert by_path.table.equals(frame.table)
    assert set(by_path.regressions["metric"]) <= set(by_path.metrics)
    # out= writes the files and lists them; nothing is written without it
    assert by_path.written == []
    out = api.compare(new, old, out=tmp_path / "cmp", plots=False)
    assert tmp_path / "cmp" / "compare.md" in out.written
    assert "fms_a100_80gb_2024-05-27.csv" in (tmp_path / "cmp" / "compare.md").read_text()


def test_compare_refuses_bad_options() -> None:
    table = FIXTURES / "fms_a100_80gb_2024-06-07.csv"
    with pytest.raises(UserError, match=r"^threshold must be a fraction"):
        api.compare(table, table, threshold=0)
    with pytest.raises(UserError, match=r"^metric 'speed' is not a metric compare knows"):
        api.compare(table, table, metrics=["speed"])
    with pytest.raises(UserError, match="run:3: no history"):
        api.compare(table, "run:3")


def test_the_package_stays_light_until_the_api_is_used() -> None:
    import subprocess
    import sys

    code = (
        "import sys, orchestrator.contract.spec, orchestrator.contract.layout\n"
        "assert 'orchestrator.api' not in sys.modules, 'api imported'\n"
        "assert 'pandas' not in sys.modules, 'pandas imported'\n"
        "from orchestrator import plan, Comparison, Report\n"
        "assert plan.__module__ == 'orchestrator.api'\n"
        "assert Comparison.__module__ == 'orchestrator.results.compare'\n"
        "assert Report.__module__ == 'orchestrator.results.report'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_run_refuses_a_folder_that_earlier_slurm_jobs_still_write_into(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As ``tunematrix run`` does (tests/e2e/test_slurm.py runs that against real SLURM)."""
    import orchestrator.executors.slurm

    path = tmp_path / "scenarios.yaml"
    path.write_text(SCENARIOS)
    results = tmp_path / "results"
    (results / "runs" / "old").mkdir(parents=True)
    (results / "runs" / "old" / "slurm.json").write_text("{}")
    monkeypatch.setattr(orchestrator.executors.slurm, "settle", lambda layout: (0, ["4242"]))
    with pytest.raises(UserError, match=r"1 SLURM job\(s\) of an earlier run still write into"):
        api.run(api.plan(path, device="cpu"), results)
    assert sorted(p.name for p in results.rglob("*")) == ["old", "runs", "slurm.json"]
