"""result.json as a typed record: one writer, one validating reader, the same keys as before."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.contract import columns as registry
from orchestrator.contract.result import (
    ChildMetrics,
    ChildResult,
    ResultError,
    RunTimings,
    load_result,
    read_result,
    write_result,
)

GOLDEN = Path(__file__).resolve().parents[1] / "fixtures" / "child_results"


def failure(**update: object) -> ChildResult:
    fields: dict[str, object] = {
        "experiment_id": "e1",
        "cell_id": None,
        "scenario": "s",
        "framework_config": None,
        "model_name_or_path": "tiny-llama",
        "repeat": 0,
        "swept": {"per_device_train_batch_size": 2},
        "status": "oom",
        "error": "OutOfMemoryError: CUDA out of memory",
        "error_type": "OutOfMemoryError",
        "error_rank": 1,
        "world_size": 2,
        "launch_id": "slurm-7-0-1",
        "timings": RunTimings(interpreter_start_s=0.02),
        "finished_at": "2026-01-01T00:00:00+00:00",
        **update,
    }
    return ChildResult(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", sorted(p.name for p in GOLDEN.glob("*.json")))
def test_results_written_before_the_typed_record_read_and_write_back_unchanged(
    tmp_path: Path, name: str
) -> None:
    """Files the child wrote before ChildResult existed: every key is declared, none is added."""
    original = json.loads((GOLDEN / name).read_text())
    result = load_result(GOLDEN / name)
    assert result is not None and result.status == original["status"]
    write_result(tmp_path / "result.json", result)
    assert json.loads((tmp_path / "result.json").read_text()) == original


def test_a_failure_has_only_the_failure_fields(tmp_path: Path) -> None:
    path = tmp_path / "result.json"
    write_result(path, failure())
    written = json.loads(path.read_text())
    assert set(written) == {
        "schema_version",
        "experiment_id",
        "cell_id",
        "scenario",
        "framework_config",
        "model_name_or_path",
        "repeat",
        "swept",
        "status",
        "error",
        "error_type",
        "error_rank",
        "world_size",
        "launch_id",
        "timings",
        "finished_at",
    }
    assert written["schema_version"] == 1 and written["cell_id"] is None
    assert written["timings"] == {"interpreter_start_s": 0.02}
    # sorted keys, two-space indent, a final newline: the format the child always wrote
    assert path.read_text() == json.dumps(written, indent=2, sort_keys=True) + "\n"


def test_nan_and_infinity_are_written_as_null(tmp_path: Path) -> None:
    path = tmp_path / "result.json"
    write_result(path, failure(timings=RunTimings(import_s=float("nan"), data_prep_s=float("inf"))))
    assert json.loads(path.read_text())["timings"] == {"import_s": None, "data_prep_s": None}


def test_an_ok_result_without_step_records_leaves_the_step_figures_out() -> None:
    data = json.loads((GOLDEN / "ok_uninstrumented_hf_tracker.json").read_text())
    metrics = ChildResult.model_validate(data).record()["metrics"]
    assert metrics["steps"] == 0
    assert "step_time_median_s" not in metrics and "tokens_per_second_global" not in metrics
    assert metrics["flops_per_token"] is None  # always written, None when unknown


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"status": "exploded"}, r"result\.json: status: Input should be 'ok', 'oom'"),
        ({"tokens_per_sec": 1.0}, r"result\.json: tokens_per_sec: Extra inputs are not permitted"),
        ({"timings": {"warp_s": 1.0}}, r"result\.json: timings\.warp_s: Extra inputs"),
        ({"world_size": "two"}, r"result\.json: world_size: Input should be a valid integer"),
    ],
)
def test_an_invalid_result_is_one_line_naming_the_file_and_the_key(
    tmp_path: Path, change: dict, message: str
) -> None:
    path = tmp_path / "result.json"
    data = {**failure().record(), **change}
    path.write_text(json.dumps(data))
    with pytest.raises(ResultError, match=message):
        load_result(path)
    # the unvalidated reader still gives the object as it is
    assert read_result(path) == data


def test_missing_or_unreadable_files_are_no_result(tmp_path: Path) -> None:
    assert load_result(tmp_path / "none.json") is None
    (tmp_path / "cut.json").write_text('{"status": "o')
    assert load_result(tmp_path / "cut.json") is None and read_result(tmp_path / "cut.json") is None
    (tmp_path / "list.json").write_text("[1, 2]")
    assert (
        load_result(tmp_path / "list.json") is None and read_result(tmp_path / "list.json") is None
    )


def test_read_result_reads_any_json_object(tmp_path: Path) -> None:
    # the parent reads its own outcome.json and executor records with it
    outcome = {"status": "timeout", "returncode": -9, "anything": [1, 2]}
    (tmp_path / "outcome.json").write_text(json.dumps(outcome))
    assert read_result(tmp_path / "outcome.json") == outcome


def test_the_result_and_the_tables_declare_the_same_child_figures() -> None:
    # ChildMetrics types what the child writes; the metric columns say how tables show it
    assert set(ChildMetrics.model_fields) == {c.name for c in registry.child_metrics()}
