"""The column registry: one declaration per column, and every table reads it."""

from __future__ import annotations

import csv
import io
import json
import typing
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
from fakeruns import write_run
from pydantic import BaseModel

from orchestrator import api
from orchestrator.contract import columns as registry
from orchestrator.contract.columns import Column
from orchestrator.contract.result import ChildMetrics, ChildResult
from orchestrator.results import (
    aggregate,
    capacity,
    collect,
    compare,
    envtables,
    equivalence,
    markdown,
    plots,
)
from orchestrator.results.report import CostSettings, build_report, write_report
from orchestrator.results.rows import UndeclaredMetricWarning, build_row, column_order, to_csv
from orchestrator.results.tablecolumns import CELL_ORDER, config_columns, is_output

# ---------------------------------------------------------------------------
# The child's record and the registry agree
# ---------------------------------------------------------------------------


def test_every_figure_of_the_childs_metrics_is_declared_and_nothing_more() -> None:
    """A figure added to ``ChildMetrics`` (which the child must fill) needs its column here."""
    declared = {c.name for c in registry.child_metrics()}
    assert declared == set(ChildMetrics.model_fields), (
        f"in ChildMetrics, not declared: {sorted(set(ChildMetrics.model_fields) - declared)}; "
        f"declared, not in ChildMetrics: {sorted(declared - set(ChildMetrics.model_fields))}"
    )


def _model_of(annotation: object) -> type[BaseModel] | None:
    for candidate in (annotation, *typing.get_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def test_every_child_column_names_a_field_of_the_result() -> None:
    """``world_size``, ``model.trainable_params``, ``timings.time_to_first_step_s``…"""
    for column in registry.select(source="child"):
        model: type[BaseModel] | None = ChildResult
        for key in column.where:
            assert model is not None and key in model.model_fields, (column.name, key)
            model = _model_of(model.model_fields[key].annotation)


# ---------------------------------------------------------------------------
# Declarations are checked
# ---------------------------------------------------------------------------


def test_register_refuses_a_second_declaration_and_key_columns() -> None:
    with pytest.raises(ValueError, match="column 'mfu' is declared twice"):
        registry.register(Column(name="mfu", source="child", unit="fraction"))
    with pytest.raises(ValueError, match="'slurm_job_id' is declared"):
        registry.register(Column(name="some_id", source="outcome", aliases=("slurm_job_id",)))
    with pytest.raises(ValueError, match="key columns come from the plan"):
        registry.register(Column(name="seed", source="plan", key=True))
    with pytest.raises(ValueError, match="aggregate must be one of"):
        Column(name="x_s", source="child", aggregate="mean")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="is one of the declared columns"):
        registry.unregister("mfu")
    assert registry.get("mfu").better == "higher"
    with pytest.raises(KeyError, match=r"declared in orchestrator/contract/columns\.py"):
        registry.get("no_such_metric")


def test_the_tables_views_name_declared_columns_of_the_right_kind() -> None:
    """The few hand-picked views (an order, a selection) cannot name a stale column."""
    medians = {c.name for c in registry.select(aggregate="median")}
    assert set(aggregate.FIGURE_ORDER) <= medians
    assert len(set(aggregate.FIGURE_ORDER)) == len(aggregate.FIGURE_ORDER)
    for name in (*markdown.SUMMARY_FIGURES, *capacity.RUN_FIGURES, *compare.ANNOTATED):
        registry.get(name)
    for name, _, _ in aggregate.PEAK_MEMORY_SOURCES:
        assert registry.get(name).unit in ("bytes", "MiB"), name
    for name in compare.DEFAULT_METRICS:
        assert registry.direction(name) in ("higher", "lower"), name
    assert registry.KEY_COLUMNS[0] == "experiment_id" and registry.KEY_COLUMNS[-1] == "status"


def test_the_derived_columns_are_the_ones_the_report_adds() -> None:
    rows = pd.DataFrame(
        [
            {
                "num_gpus": 2,
                "tokens_per_second_global": 1000.0,
                "job_s": 100.0,
                "data_tokens": 10_000,
                "mem_peak_rss_bytes": 2**30,
            }
        ]
    )
    prices = CostSettings(usd_per_gpu_hour=2.0, tokens=1e9, usd_per_kwh=0.1, grams_co2_per_kwh=9)
    added = aggregate.add_derived(rows, prices)
    new = set(added.columns) - set(rows.columns)
    assert new == {c.name for c in registry.select(source="derived")}
    # the report's own columns are outputs, never a scenario argument
    assert config_columns(added) == []


def test_outputs_are_what_the_registry_says() -> None:
    assert not is_output("num_gpus") and not is_output("status") and not is_output("lora_r")
    assert is_output("error") and is_output("job_id") and is_output("mfu")
    # an alias of a declared column (an old table's, the predecessor's) is one too
    assert is_output("slurm_job_id") and is_output("nvidia_mem_reserved")
    assert compare.known_metrics() == sorted(registry.directions())
    assert "tokens_per_second_global" in compare.known_metrics()
    assert "step_time_cv" not in compare.known_metrics()  # no direction: not compared


# ---------------------------------------------------------------------------
# Collection does not drop a figure silently
# ---------------------------------------------------------------------------

SPEC = {
    "experiment_id": "e1",
    "cell_id": "c1",
    "scenario": "s",
    "num_gpus": 1,
    "arguments": {"model_name_or_path": "org/m", "learning_rate": 1e-4},
    "swept": {},
}


def test_an_undeclared_metric_is_left_out_with_a_warning_that_names_it() -> None:
    result = {"status": "ok", "metrics": {"tokens_per_second_global": 10.0, "joules_total": 5.0}}
    with pytest.warns(
        UndeclaredMetricWarning, match=r"a run's result reports the metric 'joules_total'"
    ) as caught:
        row = build_row(SPEC, {"status": "ok"}, result)
    assert "orchestrator/contract/columns.py" in str(caught[0].message)
    assert row["tokens_per_second_global"] == 10.0
    # left out: an undeclared name would read as a scenario argument, and split the cells
    assert "joules_total" not in row and "joules_total" not in to_csv([row])


def test_old_records_and_tables_with_slurm_job_id_read_as_job_id(tmp_path: Path) -> None:
    row = build_row(SPEC, {"status": "ok", "executor": "slurm", "slurm_job_id": "77"}, None)
    assert row["job_id"] == "77" and row["executor"] == "slurm" and "slurm_job_id" not in row
    new = build_row(SPEC, {"status": "ok", "executor": "slurm", "job_id": "78"}, None)
    assert new["job_id"] == "78"
    old_csv = tmp_path / "raw_summary.csv"
    header = [c if c != "job_id" else "slurm_job_id" for c in column_order([row])]
    old_csv.write_text(
        ",".join(header) + "\n" + ",".join("77" if c == "slurm_job_id" else "" for c in header)
    )
    table = collect.load(old_csv)
    assert "slurm_job_id" not in table.columns and table["job_id"].tolist() == [77]


# ---------------------------------------------------------------------------
# A new metric: the child's figure plus one registry entry
# ---------------------------------------------------------------------------

NEW = Column(
    name="gpu_utilization",
    source="child",
    unit="fraction",
    aggregate="median",
    better="higher",
    label="GPU util.",
)


@pytest.fixture
def new_metric() -> Iterator[Column]:
    registry.register(NEW)
    try:
        yield NEW
    finally:
        registry.unregister(NEW.name)


def _with_figure(run: Path, name: str, value: float) -> None:
    """Add a figure to the child's ``metrics`` of a fake run."""
    result = json.loads((run / "result.json").read_text())
    result["metrics"][name] = value
    (run / "result.json").write_text(json.dumps(result))


def _folder(root: Path, utilizations: dict[int, list[float]]) -> Path:
    """One cell per GPU count, one repeat per figure."""
    for gpus, values in utilizations.items():
        for repeat, value in enumerate(values):
            run = write_run(
                root, f"g{gpus}r{repeat}", num_gpus=gpus, repeat=repeat, cell_id=f"g{gpus}"
            )
            _with_figure(run, "gpu_utilization", value)
    return root


def _csv(path: Path) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(path.read_text())))


def test_a_registered_metric_reaches_every_table(tmp_path: Path, new_metric: Column) -> None:
    new = _folder(tmp_path / "new", {1: [0.50, 0.52, 0.54], 2: [0.90, 0.92, 0.94]})
    ref = _folder(tmp_path / "ref", {1: [0.80, 0.81, 0.82], 2: [0.60, 0.61, 0.62]})

    report = write_report(new, tmp_path / "out", CostSettings(), plots=False)
    raw = _csv(tmp_path / "out" / "raw_summary.csv")
    assert sorted(float(r["gpu_utilization"]) for r in raw) == [0.5, 0.52, 0.54, 0.9, 0.92, 0.94]
    # a fixed column, placed with the declared ones (before the scenario arguments)
    header = list(raw[0])
    assert header.index("gpu_utilization") < header.index("learning_rate")
    bench = {r["cell_id"]: r for r in _csv(tmp_path / "out" / "benchmarks.csv")}
    assert float(bench["g1"]["gpu_utilization"]) == 0.52  # the median of the repeats
    assert float(bench["g2"]["gpu_utilization"]) == 0.92
    # an output: its values vary per repeat, yet each cell stays one cell
    assert len(report.cells) == 2 and "gpu_utilization" not in config_columns(report.rows)

    result = api.compare(new, ref, metrics=["gpu_utilization"], out=tmp_path / "cmp", plots=False)
    table = result.table.set_index("num_gpus")
    # higher is better: down from 0.81 is a regression, up from 0.61 is not
    assert bool(table.loc["1", "regression"]) and table.loc["1", "why"] == "p = 0.05"
    assert not bool(table.loc["2", "regression"])
    assert "gpu_utilization" in (tmp_path / "cmp" / "compare.csv").read_text()


def test_a_lower_is_better_metric_flags_the_other_way(tmp_path: Path) -> None:
    column = registry.register(
        Column(
            name="joules_per_sample_test_j",
            source="child",
            unit="J",
            aggregate="median",
            better="lower",
        )
    )
    try:
        new, ref = tmp_path / "new", tmp_path / "ref"
        for root, value in ((new, 2.0), (ref, 1.0)):
            _with_figure(write_run(root, "a"), column.name, value)
        rows_new = aggregate.add_derived(collect.load(new), CostSettings())
        rows_ref = aggregate.add_derived(collect.load(ref), CostSettings())
        up = compare.compare(rows_new, rows_ref, metrics=[column.name])
        down = compare.compare(rows_ref, rows_new, metrics=[column.name])
        assert up.table["regression"].tolist() == [True]
        assert down.table["regression"].tolist() == [False]
        assert build_report(new, CostSettings()).cells[column.name].tolist() == [2.0]
    finally:
        registry.unregister(column.name)
    # unregistered, it is unknown again
    with pytest.raises(ValueError, match="no direction known"):
        compare.direction("joules_per_sample_test_j")


# ---------------------------------------------------------------------------
# The lists of the report, read from the columns' roles
# ---------------------------------------------------------------------------

#: each role's list as the report wrote it out by hand before the roles existed
ROLE_LISTS = {
    "compare": (
        "scenario",
        "trainer",
        "task",
        "framework_config",
        "model_name_or_path",
        "num_gpus",
        "per_device_train_batch_size",
        "peft_method",
        "max_seq_len",
        "packing",
        "torch_dtype",
        "device",
        "environment",
    ),
    "baseline": (
        "scenario",
        "task",
        "model_name_or_path",
        "num_gpus",
        "effective_batch_size",
        "max_seq_len",
        "packing",
        "peft_method",
        "torch_dtype",
        "device",
        "environment",
    ),
    "sort": (
        "scenario",
        "framework_config",
        "model_name_or_path",
        "num_gpus",
        "effective_batch_size",
        "max_seq_len",
    ),
    "series": (
        "scenario",
        "task",
        "trainer",
        "framework_config",
        "model_name_or_path",
        "effective_batch_size",
        "max_seq_len",
        "packing",
        "peft_method",
        "torch_dtype",
        "device",
    ),
    "numeric": (
        "num_gpus",
        "per_device_train_batch_size",
        "gradient_accumulation_steps",
        "effective_batch_size",
        "max_seq_len",
        "repeat",
        "position",
    ),
    "cell_order": (
        "model_name_or_path",
        "framework_config",
        "num_gpus",
        "effective_batch_size",
        "per_device_train_batch_size",
    ),
    "label_base": ("model_name_or_path", "framework_config", "num_gpus"),
    "label": (
        "task",
        "trainer",
        "effective_batch_size",
        "per_device_train_batch_size",
        "peft_method",
        "max_seq_len",
        "torch_dtype",
        "packing",
        "gradient_accumulation_steps",
        "environment",
        "device",
        "processes",
    ),
    "varying": (
        "task",
        "trainer",
        "peft_method",
        "max_seq_len",
        "torch_dtype",
        "packing",
        "environment",
    ),
    "environment_row": ("scenario", "model_name_or_path", "framework_config", "num_gpus"),
    "summary": (
        "tokens_per_second_global",
        "tokens_per_second_per_device",
        "train_tokens_per_second",
        "peak_memory_bytes",
        "mfu",
        "cost_per_1m_tokens_usd",
        "train_loss",
        "gpu_util_mean_pct",
        "cpu_util_mean_pct",
        "energy_per_token_j",
    ),
    "compared": (
        "tokens_per_second_global",
        "tokens_per_second_per_device",
        "train_tokens_per_second",
        "step_time_median_s",
        "peak_memory_bytes",
        "mfu",
        "energy_per_token_j",
    ),
    "environment_figure": ("tokens_per_second_global", "peak_memory_bytes"),
    "run_figure": (
        "train_runtime",
        "tokens_per_second_global",
        "train_tokens_per_second",
        "step_time_median_s",
        "train_loss",
    ),
    "annotated": (
        "gpu_device_name",
        "peak_memory_source",
        "memory_backend",
        "run_mode",
        "allocator",
        "allocator_settings",
        "gpu_conditions",
    ),
    "cell_figure": (
        "train_tokens_per_second",
        "train_samples_per_second",
        "train_runtime",
        "step_time_cv",
        "train_loss",
        "loss_last",
        "mfu",
        "achieved_tflops_per_device",
        "flops_per_token",
        "peak_memory_bytes",
        "mem_nvidia_mem_reserved",
        "mem_peak_torch_mem_alloc_in_bytes",
        "mem_torch_mem_alloc_in_bytes",
        "mem_peak_rss_bytes",
        "torch_max_memory_reserved_bytes",
        "mem_tree_peak_pss_bytes",
        "mem_tree_peak_rss_bytes",
        "time_to_first_step_s",
        "job_s",
        "padding_fraction",
        "data_tokens",
        "cost_per_1m_tokens_usd",
        "cost_per_run_usd",
        "time_per_epoch_s",
        "cost_per_epoch_usd",
        "time_to_train_s",
        "cost_to_train_usd",
        "energy_per_token_j",
        "power_mean_w",
        "kwh_per_1m_tokens",
        "energy_cost_per_1m_tokens_usd",
        "co2_per_1m_tokens_g",
    ),
}


def test_each_role_lists_the_columns_the_report_wrote_out_in_their_order() -> None:
    assert set(ROLE_LISTS) == set(registry.ROLES)
    for role, expected in ROLE_LISTS.items():
        assert registry.with_role(role) == expected, role


def test_the_report_reads_its_lists_from_the_roles() -> None:
    views = {
        "compare": compare.KEYS,
        "compared": compare.DEFAULT_METRICS,
        "annotated": compare.ANNOTATED,
        "baseline": equivalence.MATCH_KEYS,
        "series": aggregate.SCALING_SERIES,
        "cell_figure": aggregate.FIGURE_ORDER,
        "numeric": collect.NUMERIC,
        "cell_order": CELL_ORDER,
        "label_base": plots.LABEL_BASE,
        "label": plots.LABEL_KEYS,
        "summary": markdown.SUMMARY_FIGURES,
        "run_figure": capacity.RUN_FIGURES,
        "environment_figure": envtables.SIDE_BY_SIDE,
    }
    for role, view in views.items():
        assert view == registry.with_role(role), role


def test_each_role_names_declared_columns_of_the_right_kind_once() -> None:
    """A role's tuple is its order: each name in it once, each a column of its kind."""
    key_roles = {"compare", "baseline", "sort", "series", "numeric", "cell_order"}
    key_roles |= {"label_base", "label", "varying", "environment_row"}
    for role in registry.ROLES:
        members = registry.with_role(role)
        assert members, f"no column has the role {role!r}"
        assert len(set(members)) == len(members), role
        assert all(registry.get(n).key == (role in key_roles) for n in members), role
        assert {c.name for c in registry.select(role=role)} == set(members), role
    # the figures of summary.md and of compare's default are medians or spreads with a
    # direction; the order of a cell's figures names only medians
    for name in (*registry.with_role("summary"), *registry.with_role("compared")):
        assert registry.get(name).aggregate in ("median", "spread"), name
    for name in registry.with_role("compared"):
        assert registry.direction(name) in ("higher", "lower"), name
    assert {registry.get(n).aggregate for n in registry.with_role("cell_figure")} == {"median"}


def test_roles_are_checked() -> None:
    check = registry._check_roles
    with pytest.raises(ValueError, match="'summary' names 'x_s', which is not a declared"):
        check({"summary": registry.Role("", ("x_s",))})
    with pytest.raises(ValueError, match="'summary' names a column twice"):
        check({"summary": registry.Role("", ("mfu", "mfu"))})
    registry.register(Column(name="x_s", source="child"))
    try:  # a column registered later joins no list: the lists are the declared columns'
        with pytest.raises(ValueError, match="'x_s', which is not a declared column"):
            check({"summary": registry.Role("", ("x_s",))})
        assert "x_s" not in {c.name for c in registry.select(role="summary")}
    finally:
        registry.unregister("x_s")
    with pytest.raises(KeyError, match="no role 'nope'"):
        registry.with_role("nope")
    assert "x_s" not in registry.names()


def test_the_names_the_code_reads_columns_by_are_declared_columns() -> None:
    """``TOKENS_PER_SECOND`` and the like: each a declared column's own name."""
    names = {n: v for n, v in vars(registry).items() if n.isupper() and isinstance(v, str)}
    assert "TOKENS_PER_SECOND" in names and "PEAK_MEMORY" in names
    for constant, name in names.items():
        assert registry.get(name).name == name, constant
    # summary.md's reading guide explains the figures it shows by the registry's words
    for name in registry.with_role("summary"):
        column = registry.get(name)
        assert column.meaning or name in (registry.HF_TOKENS_PER_SECOND, registry.PEAK_MEMORY)
