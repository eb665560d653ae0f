"""compare: an injected regression is caught, noise is not, and the exit code says so."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest
from fakeruns import write_run

from orchestrator.cli.app import main
from orchestrator.results import collect, history
from orchestrator.results.compare import cell_label, compare, markdown
from orchestrator.results.report import CostSettings, add_derived
from orchestrator.results.stats import mann_whitney_u

NOISE = (0.98, 1.01, 1.00, 0.99, 1.02)  # ±2% run-to-run
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def _edit(run: Path, name: str, **fields: Any) -> None:
    """Change fields of one of a run folder's JSON records (spec, outcome, result)."""
    path = run / name
    data = json.loads(path.read_text())
    data.update(fields)
    path.write_text(json.dumps(data))


def _results(
    root: Path,
    *,
    scale: float = 1.0,
    repeats: int = 5,
    tps: float = 1000.0,
    memory_scale: float = 1.0,
    extra: bool = False,
) -> Path:
    for cell, gpus in (("a", 1), ("b", 2)):
        for r in range(repeats):
            write_run(
                root,
                f"{cell}.r{r}",
                cell_id=cell,
                repeat=r,
                num_gpus=gpus,
                tps=tps * gpus * scale * NOISE[r % len(NOISE)],
                memory=10 * 2**30 * memory_scale,
            )
    if extra:
        write_run(root, "c.r0", cell_id="c", framework="ddp")
    return root


def _load(path: Path):
    return add_derived(collect.load(path), CostSettings())


def test_an_injected_regression_is_caught(tmp_path) -> None:
    ref = _results(tmp_path / "ref")
    new = _results(tmp_path / "new", scale=0.8)  # 20% slower
    result = compare(_load(new), _load(ref), metrics=["tokens_per_second_global"], threshold=0.1)
    assert len(result.regressions) == 2
    row = result.regressions.iloc[0]
    assert row["change"] == pytest.approx(-0.2)
    assert row["p_value"] == pytest.approx(1 / 252)  # 5 vs 5, fully separated, one-sided
    assert row["n_ref"] == row["n_new"] == 5


def test_three_against_three_fully_separated_is_confirmed(tmp_path) -> None:
    # the smallest p with 3 vs 3 is 1/20 = 0.05: the common repeat count must be
    # able to confirm a clear regression, and an overlapping one must not pass
    ref = _results(tmp_path / "ref", repeats=3)
    new = _results(tmp_path / "new", repeats=3, scale=0.8)
    result = compare(_load(new), _load(ref), metrics=["tokens_per_second_global"])
    assert len(result.regressions) == 2
    assert list(result.regressions["p_value"]) == pytest.approx([1 / 20, 1 / 20])
    ref_root, new_root = tmp_path / "ref2", tmp_path / "new2"
    for r, (a, b) in enumerate(((1000, 1010), (1200, 850), (900, 800))):
        write_run(ref_root, f"x.r{r}", cell_id="x", repeat=r, tps=float(a))
        write_run(new_root, f"x.r{r}", cell_id="x", repeat=r, tps=float(b))
    result = compare(_load(new_root), _load(ref_root), metrics=["tokens_per_second_global"])
    (row,) = result.table.itertuples()
    assert row.change == pytest.approx(850 / 1000 - 1)
    assert row.p_value == pytest.approx(
        mann_whitney_u([1010, 850, 800], [1000, 1200, 900], "less")[1]
    )
    assert row.p_value > 0.05 and not row.regression and "within the noise" in row.why


def test_noise_is_not_a_regression(tmp_path) -> None:
    ref = _results(tmp_path / "ref")
    new = _results(tmp_path / "new", scale=0.97)
    result = compare(_load(new), _load(ref), threshold=0.1)
    assert result.regressions.empty


def test_past_the_threshold_but_within_the_noise(tmp_path) -> None:
    # medians 12% apart, but the samples overlap: the test does not confirm it
    ref_root, new_root = tmp_path / "ref", tmp_path / "new"
    for r, (a, b) in enumerate(((1000, 1000), (1300, 880), (700, 1250), (1200, 800), (900, 600))):
        write_run(ref_root, f"x.r{r}", cell_id="x", repeat=r, tps=float(a))
        write_run(new_root, f"x.r{r}", cell_id="x", repeat=r, tps=float(b))
    result = compare(_load(new_root), _load(ref_root), metrics=["tokens_per_second_global"])
    (row,) = result.table.itertuples()
    assert row.change == pytest.approx(880 / 1000 - 1)
    assert not row.regression and "within the noise" in row.why
    assert row.p_value == pytest.approx(
        mann_whitney_u([1000, 880, 1250, 800, 600], [1000, 1300, 700, 1200, 900], "less")[1]
    )


def test_with_few_repeats_the_threshold_decides(tmp_path) -> None:
    ref = _results(tmp_path / "ref", repeats=1)
    new = _results(tmp_path / "new", repeats=1, scale=0.85)
    result = compare(_load(new), _load(ref), metrics=["tokens_per_second_global"])
    assert len(result.regressions) == 2
    assert set(result.regressions["why"]) == {"1 vs 1 repeats: threshold alone"}


def test_memory_growth_is_a_regression(tmp_path) -> None:
    ref = _results(tmp_path / "ref", repeats=1)
    new = _results(tmp_path / "new", repeats=1, memory_scale=1.25)
    result = compare(_load(new), _load(ref), metrics=["peak_memory_bytes"])
    assert len(result.regressions) == 2 and (result.regressions["change"] > 0.2).all()


def test_a_cell_that_fails_now_and_one_sided_rows(tmp_path) -> None:
    ref = _results(tmp_path / "ref", repeats=1, extra=True)
    new = tmp_path / "new"
    write_run(new, "a.r0", cell_id="a", num_gpus=1, tps=1000.0)
    write_run(new, "b.r0", cell_id="b", num_gpus=2, status="oom", error="CUDA out of memory")
    write_run(new, "d.r0", cell_id="d", num_gpus=8)
    result = compare(_load(new), _load(ref))
    status = result.table[result.table["metric"] == "status"]
    assert len(status) == 1 and status.iloc[0]["regression"] and status.iloc[0]["new"] == "oom"
    assert "CUDA out of memory" in status.iloc[0]["why"]
    assert list(result.only_new["num_gpus"]) == ["8"]
    assert list(result.only_ref["framework_config"]) == ["ddp"]


def test_a_cell_pruned_now_is_lost_like_its_oom(tmp_path) -> None:
    ref = _results(tmp_path / "ref", repeats=1)
    new = tmp_path / "new"
    write_run(new, "a.r0", cell_id="a", num_gpus=1, tps=1000.0)
    write_run(
        new, "b.r0", cell_id="b", num_gpus=2, status="skipped", error="pruned: x ran out of memory"
    )
    result = compare(_load(new), _load(ref))
    status = result.table[result.table["metric"] == "status"]
    assert len(status) == 1 and status.iloc[0]["regression"]
    assert status.iloc[0]["new"] == "pruned"
    assert "x ran out of memory" in status.iloc[0]["why"]


def test_predecessor_reference(tmp_path) -> None:
    ref = tmp_path / "a100_80gb.csv"
    ref.write_text(
        "framework_config,model_name_or_path,num_gpus,peft_method,per_device_train_batch_size,train_tokens_per_second,train_runtime\n"
        "none,org/model,1,,8,1100.0,100\n"
        "none,org/model,2,,4,1000.0,100\n"
    )
    new = _results(tmp_path / "new", repeats=1)
    old = _results(tmp_path / "old", repeats=1)  # ours from before trainers were chosen: hf
    for row in [*(new / "runs").iterdir(), *(old / "runs").iterdir()]:
        # our runs used fsdp; make them "none" to match
        spec = json.loads((row / "spec.json").read_text().replace('"fsdp"', '"none"'))
        if row.parents[1] == new:  # a run of today names its task and trainer
            spec["arguments"].update(task="causal-lm", trainer="sft")
        (row / "spec.json").write_text(json.dumps(spec))
    # the predecessor's fms-hf-tuning trains with TRL's SFTTrainer: its rows are sft's
    result = compare(_load(new), _load(ref), metrics=["train_tokens_per_second"])
    assert result.keys == [
        "trainer",
        "task",
        "framework_config",
        "model_name_or_path",
        "num_gpus",
        "per_device_train_batch_size",
        "peft_method",
    ]
    # keys both sides lack (torch_dtype) are not worth a note
    assert "matched without scenario, max_seq_len, packing, device (missing on one side)" in (
        result.notes
    )
    hf = compare(_load(old), _load(ref), metrics=["train_tokens_per_second"])
    assert hf.table.empty and len(hf.only_new) == len(hf.only_ref) == 2
    assert len(result.table) == 2
    # ours (first repeat, noise 0.98): 1.1 × 980 / 1 GPU = 1078 vs 1100; 1.1 × 1960 / 2 = 1078 vs 1000
    assert sorted(round(c, 4) for c in result.table["change"]) == [
        round(1078 / 1100 - 1, 4),
        round(1078 / 1000 - 1, 4),
    ]
    assert result.regressions.empty


def test_cli_exit_codes_and_files(tmp_path, capsys) -> None:
    ref = _results(tmp_path / "ref")
    new = _results(tmp_path / "new", scale=0.8)
    assert main(["compare", str(new), str(ref), "--metric", "tokens_per_second_global"]) == 1
    out = capsys.readouterr().out
    assert "tunematrix compare: 2 matched cells, 2 regression(s)" in out
    assert (
        "regression: s · hf · fsdp · org/model · 1 GPU · bs 8/dev · seq 1024 · packed · gpu · eb 8: "
        "tokens_per_second_global -20.0% p = 0.00397" in out
    )
    rows = list(csv.DictReader((new / "compare.csv").open()))
    assert len(rows) == 2 and {r["regression"] for r in rows} == {"True"}
    md = (new / "compare.md").read_text()
    assert "**2 regression(s)** in 2 matched cell(s)." in md
    assert md.split("## Regressions")[1].split("## By metric")[0].count("**regression**") == 2
    assert (new / "plots" / "compare-tokens_per_second_global.png").stat().st_size > 10_000
    same = _results(tmp_path / "same")
    assert main(["compare", str(same), str(ref), "--no-plots"]) == 0
    assert main(["compare", str(same), str(ref), "--metric", "speed"]) == 2
    assert "--metric 'speed' is not a metric compare knows" in capsys.readouterr().err


def test_history_and_run_ids(tmp_path, capsys) -> None:
    ref = _results(tmp_path / "results", repeats=3)
    rows = _load(ref)
    db = history.path_for(ref)
    env = {
        "started_at": "2026-11-22T10:00:00+00:00",
        "finished_at": "2026-11-22T11:00:00+00:00",
        "host": "box",
        "gpus": {"devices": [{"name": "NVIDIA H100 80GB HBM3"}]},
        "versions": {"torch": "2.13.0"},
        "command": ["tunematrix", "run"],
    }
    first = history.record(db, rows, env, ref)
    second = history.record(db, rows, env, ref)
    assert (first, second) == (1, 2)
    assert [r["experiments"] for r in history.runs(db)] == [6, 6]
    loaded = history.load_run(db, 1)
    assert len(loaded) == 6 and set(loaded["status"]) == {"ok"}
    assert main(["history", str(ref)]) == 0
    out = capsys.readouterr().out
    assert (
        "   1  2026-11-22T10:00:00+00:00            6  ok 6" in out
        and "box / NVIDIA H100 80GB HBM3" in out
    )
    # the folder's latest results against a recorded run
    assert main(["compare", str(ref), "run:1", "--no-plots"]) == 0
    assert main(["compare", str(ref), "run:9", "--no-plots"]) == 2
    assert "run 9 is not in" in capsys.readouterr().err
    with pytest.raises(LookupError):
        history.load_run(tmp_path / "none.sqlite", 1)


# --- what makes two rows the same cell ------------------------------------------------------


def _two_kinds(root: Path, field: str, values: tuple[Any, Any]) -> Path:
    """3 repeats at about 1000 tok/s with ``values[0]`` and 3 at about 600 with ``values[1]``."""
    for value, tps in zip(values, (1000.0, 600.0), strict=True):
        for r in range(3):
            eid = f"{field}-{value}.r{r}"
            if field == "device":
                run = write_run(root, eid, repeat=r, device=value, tps=tps * NOISE[r])
            elif field == "torch_dtype":
                run = write_run(
                    root, eid, repeat=r, tps=tps * NOISE[r], extra_arguments={field: value}
                )
            else:
                run = write_run(root, eid, repeat=r, tps=tps * NOISE[r])
                _edit(run / ".." / eid, "spec.json", **{field: value})
    return root


@pytest.mark.parametrize(
    ("field", "values", "label"),
    [
        ("packing", (True, False), ("packed", "unpacked")),
        ("torch_dtype", ("bfloat16", "float32"), ("bfloat16", "float32")),
        ("device", ("gpu", "cpu"), ("gpu", "cpu")),
    ],
)
def test_packing_dtype_and_device_are_separate_cells(tmp_path, field, values, label) -> None:
    # reproduced from the issue: 3 packed runs at ~1000 tok/s and 3 unpacked at ~600
    # became one cell with n = 6 and a median between the two
    new = _load(_two_kinds(tmp_path / "new", field, values))
    ref = _load(_two_kinds(tmp_path / "ref", field, values))
    result = compare(new, ref, metrics=["tokens_per_second_global"])
    assert field in result.keys
    assert len(result.table) == 2 and set(result.table["n_new"]) == {3}
    assert set(result.table["n_ref"]) == {3}
    medians = {
        next(word for word in cell_label(row, result.keys).split(" · ") if word in label): row[
            "new"
        ]
        for row in result.table.to_dict("records")
    }
    assert medians == {label[0]: pytest.approx(1000.0), label[1]: pytest.approx(600.0)}
    assert result.regressions.empty


def test_trainer_and_task_are_keys(tmp_path) -> None:
    for side, trainer in (("sft", "sft"), ("hf", "hf")):
        for r in range(2):
            extra = {"trainer": trainer, "task": "causal-lm"}
            write_run(tmp_path / side, f"x.r{r}", repeat=r, extra_arguments=extra)
    sft, hf = _load(tmp_path / "sft"), _load(tmp_path / "hf")
    different = compare(sft, hf)
    assert {"trainer", "task"} <= set(different.keys)
    assert different.table.empty and len(different.only_new) == len(different.only_ref) == 1
    same = compare(sft, sft)
    assert len(same.table) > 0 and "trainer" in same.keys


def test_an_old_reference_is_read_as_causal_lm_on_hf(tmp_path) -> None:
    """Rows from before runs named their task and trainer ran a causal LM with the plain
    Trainer: a new run's hf cell is compared with them, its sft cell is not."""
    new, old = tmp_path / "new", tmp_path / "old"
    for r in range(2):
        for trainer in ("sft", "hf"):
            write_run(
                new,
                f"{trainer}.r{r}",
                cell_id=trainer,
                repeat=r,
                tps=1000.0 if trainer == "hf" else 800.0,
                extra_arguments={"trainer": trainer, "task": "causal-lm"},
            )
        write_run(old, f"x.r{r}", cell_id="x", repeat=r, tps=1000.0)  # an old-style row
    assert (
        "trainer" not in json.loads((old / "runs" / "x.r0" / "spec.json").read_text())["arguments"]
    )
    loaded = _load(old)
    assert set(loaded["task"]) == {"causal-lm"} and set(loaded["trainer"]) == {"hf"}
    # the same holds for the old run's tables (raw_summary.csv without the two columns)
    table = loaded.drop(columns=["task", "trainer"])
    table.to_csv(tmp_path / "old.csv", index=False)
    assert set(_load(tmp_path / "old.csv")["trainer"]) == {"hf"}
    result = compare(_load(new), loaded, metrics=["tokens_per_second_global"])
    assert {"trainer", "task"} <= set(result.keys)
    assert list(result.table["trainer"]) == ["hf"]
    assert list(result.table["new"]) == [1000.0] and list(result.table["ref"]) == [1000.0]
    assert list(result.only_new["trainer"]) == ["sft"] and result.only_ref.empty
    assert not any("matched without" in n and "trainer" in n for n in result.notes)


def test_outputs_and_bookkeeping_are_never_keys(tmp_path) -> None:
    # the predecessor's epoch is measured (it varies with the data and the batch), and its
    # index is the row's position in the matrix: neither says which experiment a row is
    header = "epoch,index,framework_config,model_name_or_path,num_gpus,per_device_train_batch_size,r,train_runtime,train_tokens_per_second\n"
    ref = tmp_path / "ref.csv"
    ref.write_text(
        header + "0.15,0,none,org/model,1,4,16,100,1000\n0.29,1,none,org/model,1,8,16,100,1100\n"
    )
    new = tmp_path / "new.csv"
    new.write_text(
        header + "0.3,0,none,org/model,1,8,16,100,1000\n0.16,1,none,org/model,1,4,16,100,900\n"
    )
    result = compare(_load(new), _load(ref), metrics=["train_tokens_per_second"])
    assert "epoch" not in result.keys and "index" not in result.keys
    assert "per_device_train_batch_size" in result.keys
    assert "outputs and bookkeeping, not used to match rows: epoch, index" in result.notes
    by_batch = result.table.set_index("per_device_train_batch_size")
    assert by_batch.loc["4", "change"] == pytest.approx(900 / 1000 - 1)
    assert by_batch.loc["8", "change"] == pytest.approx(1000 / 1100 - 1)


#: the predecessor's configuration columns in these two tables (everything else is measured,
#: or bookkeeping: epoch, index, train_*, memory)
FMS_CONFIG = (
    "framework_config",
    "model_name_or_path",
    "num_gpus",
    "per_device_train_batch_size",
    "peft_method",
    "fp16",
    "learning_rate",
    "lora_alpha",
    "lora_dropout",
    "r",
    "target_modules",
)


def _fms_cells(path: Path) -> dict[tuple[Any, ...], bool]:
    """Configuration -> whether the run has metrics, read with the csv module alone."""

    def spell(value: str) -> Any:
        try:
            return float(value)  # 2e-5 and 2.00E-05, 16 and 16.0
        except ValueError:
            return value.strip()

    cells: dict[tuple[Any, ...], bool] = {}
    for row in csv.DictReader(path.open()):
        key = tuple(spell(row.get(c) or "") for c in FMS_CONFIG)
        assert key not in cells  # one run per configuration in these tables
        cells[key] = bool(row["train_runtime"].strip())
    return cells


def test_two_published_predecessor_tables(tmp_path) -> None:
    # fms-acceleration scripts/benchmarks/refs/a100_80gb.csv as published at 735cac8
    # (2024-06-07) and at f1895b7 (2024-05-27). With epoch as a key nothing matched:
    # the May run's epochs (0.04, 0.07) are not the June run's (0.15, 0.29).
    new_path = FIXTURES / "fms_a100_80gb_2024-06-07.csv"
    ref_path = FIXTURES / "fms_a100_80gb_2024-05-27.csv"
    result = compare(_load(new_path), _load(ref_path), metrics=["train_tokens_per_second"])
    # both read as what fms-hf-tuning ran: a causal LM with TRL's SFTTrainer
    assert set(result.keys) == {*FMS_CONFIG, "trainer", "task"}
    new_cells, ref_cells = _fms_cells(new_path), _fms_cells(ref_path)
    both = new_cells.keys() & ref_cells.keys()
    assert len(new_cells) - len(result.only_new) == len(both)
    assert len(ref_cells) - len(result.only_ref) == len(both)
    # the table: every cell with metrics on both sides (no cell was ok and is lost now)
    compared = [k for k in both if new_cells[k] and ref_cells[k]]
    assert len(result.table) == len(compared) >= 40
    assert "outputs and bookkeeping, not used to match rows: epoch" in result.notes
    assert any("matched without torch_dtype" in n for n in result.notes)


def test_key_spellings_agree(tmp_path) -> None:
    # a column with blanks is read as floats (16.0), one without as integers (16);
    # learning rates come as 2.00E-04 or 0.0002
    header = "framework_config,model_name_or_path,num_gpus,peft_method,r,learning_rate,train_runtime,train_tokens_per_second\n"
    ref = tmp_path / "ref.csv"
    ref.write_text(
        header + "none,m,1,lora,16,2.00E-04,100,1000\n"
        "none,m,1,lora,8,2.00E-04,100,2000\n"
        "none,m,1,,,2.00E-05,100,3000\n"
    )
    new = tmp_path / "new.csv"
    new.write_text(header + "none,m,1,lora,16,0.0002,100,1000\nnone,m,1,lora,8,0.0002,100,2000\n")
    result = compare(_load(new), _load(ref), metrics=["train_tokens_per_second"])
    assert {"r", "learning_rate"} <= set(result.keys)
    assert len(result.table) == 2 and result.only_new.empty and len(result.only_ref) == 1
    assert sorted(result.table["r"]) == ["16", "8"]
    assert set(result.table["learning_rate"]) == {"0.0002"}
    # a yes/no column with blanks becomes 1.0/NaN when read from a CSV file
    ours = _load(_results(tmp_path / "ours", repeats=1))
    assert ours["packing"].tolist() == [True, True]
    as_read = ours.assign(packing=1.0)
    result = compare(ours, as_read, metrics=["tokens_per_second_global"])
    assert len(result.table) == 2 and set(result.table["packing"]) == {"true"}


# --- conditions that differ between the sides ------------------------------------------------


def test_different_gpus_memory_sources_and_run_modes_are_marked(tmp_path, capsys) -> None:
    ref = _results(tmp_path / "ref", repeats=3)
    new = _results(tmp_path / "new", repeats=3, scale=0.8)
    for run in (ref / "runs").iterdir():
        _edit(run, "result.json", gpu_device_name="NVIDIA A100-SXM4-80GB")
        _edit(run, "outcome.json", run_mode="alone")
        if run.name.startswith("b."):  # no sidecar figures: the peak comes from the RSS
            _edit(run, "outcome.json", memory=None)
    for run in (new / "runs").iterdir():
        _edit(run, "outcome.json", run_mode="packed" if run.name.startswith("a.") else "alone")
    result = compare(_load(new), _load(ref), metrics=["tokens_per_second_global"])
    table = result.table.set_index("num_gpus")
    assert table.loc["1", "differs"] == "gpu_device_name, run_mode"
    assert table.loc["2", "differs"] == "gpu_device_name, peak_memory_source"
    assert (
        "peak_memory_source: resident memory of a training process (ref) vs NVML peak"
        in (table.loc["2", "mismatch"])
    )
    assert table.loc["1", "mismatch"] == (
        "gpu_device_name: NVIDIA A100-SXM4-80GB (ref) vs NVIDIA H100 80GB HBM3 (new); "
        "run_mode: alone (ref) vs packed (new)"
    )
    assert (
        "gpu_device_name differs between the sides in 2 matched cell(s), "
        "marked ≠ (columns differs and mismatch)" in result.notes
    )
    md = markdown(result, "new", "ref", 0.1)
    assert "1 GPU · bs 8/dev · seq 1024 · packed · gpu · eb 8 (≠ gpu_device_name, run_mode)" in md
    assert "; ≠ gpu_device_name: NVIDIA A100-SXM4-80GB (ref) vs NVIDIA H100 80GB HBM3 (new)" in md
    assert main(["compare", str(new), str(ref), "--no-plots"]) == 1
    out = capsys.readouterr().out
    assert "eb 8 (≠ gpu_device_name, run_mode): tokens_per_second_global -20.0%" in out
    assert "note: run_mode differs between the sides in 1 matched cell(s)" in out
    assert "differs" in next(csv.DictReader((new / "compare.csv").open()))
    same = compare(_load(ref), _load(ref), metrics=["tokens_per_second_global"])
    assert set(same.table["differs"]) == {""} and "≠" not in markdown(same, "a", "b", 0.1)


def test_allocator_settings_against_the_defaults_are_marked(tmp_path) -> None:
    ref = _results(tmp_path / "ref", repeats=3)
    new = _results(tmp_path / "new", repeats=3)
    old = _results(tmp_path / "old", repeats=3)  # before rows recorded the allocator
    for run in (ref / "runs").iterdir():
        _edit(run, "result.json", allocator="glibc 2.36")  # no variable set: the defaults
    for run in (new / "runs").iterdir():
        settings = "MALLOC_MMAP_THRESHOLD_=4294967296" if run.name.startswith("a.") else None
        _edit(run, "result.json", allocator="glibc 2.36", allocator_settings=settings)
    result = compare(_load(new), _load(ref), metrics=["tokens_per_second_global"])
    table = result.table.set_index("num_gpus")
    assert table.loc["1", "differs"] == "allocator_settings"
    assert table.loc["1", "mismatch"] == (
        "allocator_settings: default (ref) vs MALLOC_MMAP_THRESHOLD_=4294967296 (new)"
    )
    assert table.loc["2", "differs"] == ""
    # a reference that recorded no allocator: not checked, and said so
    result = compare(_load(new), _load(old), metrics=["tokens_per_second_global"])
    assert set(result.table["differs"]) == {""}
    assert "allocator is not recorded in the reference, so it is not checked" in result.notes


def test_an_interrupted_cell_is_lost(tmp_path) -> None:
    ref = _results(tmp_path / "ref", repeats=1)
    new = tmp_path / "new"
    write_run(new, "a.r0", cell_id="a", num_gpus=1)
    write_run(new, "b.r0", cell_id="b", num_gpus=2, status="interrupted", error="stopped (SIGINT)")
    result = compare(_load(new), _load(ref))
    (lost,) = result.regressions[result.regressions["metric"] == "status"].itertuples()
    assert lost.new == "interrupted" and lost.why == "was ok, now interrupted: stopped (SIGINT)"
