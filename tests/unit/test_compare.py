"""compare: an injected regression is caught, noise is not, and the exit code says so."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from fakeruns import write_run

from orchestrator import collect, history
from orchestrator.cli import main
from orchestrator.compare import compare
from orchestrator.report import CostSettings, add_derived
from orchestrator.stats import mann_whitney_u

NOISE = (0.98, 1.01, 1.00, 0.99, 1.02)  # ±2% run-to-run


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


def test_predecessor_reference(tmp_path) -> None:
    ref = tmp_path / "a100_80gb.csv"
    ref.write_text(
        "framework_config,model_name_or_path,num_gpus,peft_method,per_device_train_batch_size,train_tokens_per_second,train_runtime\n"
        "none,org/model,1,,8,1100.0,100\n"
        "none,org/model,2,,4,1000.0,100\n"
    )
    new = _results(tmp_path / "new", repeats=1)
    for row in (new / "runs").iterdir():  # our runs used fsdp; make them "none" to match
        spec = (row / "spec.json").read_text().replace('"fsdp"', '"none"')
        (row / "spec.json").write_text(spec)
    result = compare(_load(new), _load(ref), metrics=["train_tokens_per_second"])
    assert result.keys == [
        "framework_config",
        "model_name_or_path",
        "num_gpus",
        "per_device_train_batch_size",
        "peft_method",
    ]
    assert "matched without scenario, max_seq_len (missing on one side)" in result.notes
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
        "regression: s · fsdp · org/model · 1 GPU · bs 8/dev · seq 1024 · eb 8: tokens_per_second_global -20.0% p = 0.00397"
        in out
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
