"""Loss equivalence: each framework or trainer variant against its scenario's baseline,
on synthetic loss curves written as the runs' result.json files."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from orchestrator.results import compare as comparing
from orchestrator.results import equivalence
from orchestrator.results.equivalence import (
    DIFFERENT,
    FAST_BUT_DIFFERENT,
    IS_BASELINE,
    NO_BASELINE,
    NO_CURVE,
    SAME,
    add_equivalence,
    loss_gap,
    median_curve,
)

BASE_CURVE = [[s, 7.0 - 0.2 * s] for s in range(1, 9)]


def _row(cell: str, repeat: int = 0, **more: Any) -> dict[str, Any]:
    row = {
        "experiment_id": f"{cell}-r{repeat}" if repeat else cell,
        "cell_id": cell,
        "status": "ok",
        "scenario": "s",
        "framework_config": "none",
        "trainer": "sft",
        "task": "causal-lm",
        "model_name_or_path": "tiny-llama",
        "num_gpus": 1,
        "effective_batch_size": 4,
        "max_seq_len": 32,
        "packing": True,
        "device": "cpu",
        "tokens_per_second_global": 1000.0,
    }
    row.update(more)
    return row


def _write(
    root: Path, row: dict[str, Any], curve: Any, swept: dict[str, Any] | None = None
) -> None:
    folder = root / "runs" / row["experiment_id"]
    folder.mkdir(parents=True)
    (folder / "spec.json").write_text(json.dumps({"swept": swept or {}}))
    if curve is not None:
        (folder / "result.json").write_text(json.dumps({"loss_history": curve}))


def _report(
    root: Path, runs: list[tuple[dict[str, Any], Any, dict[str, Any] | None]], **kw: Any
) -> dict[str, dict[str, Any]]:
    for row, curve, swept in runs:
        _write(root, row, curve, swept)
    rows = pd.DataFrame([r for r, _, _ in runs])
    cells = rows.drop_duplicates("cell_id").reset_index(drop=True)
    out = add_equivalence(cells, rows, root, **kw)
    return {str(c["cell_id"]): c for c in out.to_dict("records")}


def shifted(by: float) -> list[list[float]]:
    return [[s, loss * (1 + by)] for s, loss in BASE_CURVE]


def test_gap_is_the_mean_absolute_difference_over_the_baselines_mean() -> None:
    base = {1: 4.0, 2: 2.0}
    gap = loss_gap({1: 4.4, 2: 2.0, 3: 9.0}, base)
    assert gap is not None and gap.steps == 2  # step 3: the baseline has none
    assert gap.mean == pytest.approx(0.2 / 3.0)  # mean |diff| 0.2 over mean loss 3
    assert gap.largest == pytest.approx(0.1)
    assert loss_gap({5: 1.0}, base) is None
    assert loss_gap({1: math.nan}, base) is None


def test_median_curve_per_step_over_repeats() -> None:
    curve = median_curve([[[1, 1.0], [2, 2.0]], [[1, 3.0], [2, 4.0]], [[1, 2.0]]])
    assert curve == {1: 2.0, 2: 3.0}


def test_identical_shifted_faster_and_missing_baseline(tmp_path: Path) -> None:
    base = _row("base")
    same = _row("same", framework_config="ddp")
    off = _row("off", framework_config="hot")
    fast = _row("fast", framework_config="fast", tokens_per_second_global=2000.0)
    lora_variant = _row("lora", framework_config="ddp", peft_method="lora")
    cells = _report(
        tmp_path,
        [
            (base, BASE_CURVE, None),
            (same, BASE_CURVE, None),
            (off, shifted(0.10), None),
            (fast, shifted(-0.10), None),
            (lora_variant, BASE_CURVE, None),
        ],
    )
    assert cells["base"]["loss_vs_baseline"] == IS_BASELINE
    assert cells["same"]["loss_vs_baseline"] == SAME
    assert cells["same"]["loss_gap_pct"] == pytest.approx(0.0)
    assert cells["same"]["loss_steps_compared"] == len(BASE_CURVE)
    assert cells["same"]["loss_baseline"] == "base"
    assert cells["off"]["loss_vs_baseline"] == DIFFERENT  # 10% > 5%, not faster
    assert cells["off"]["loss_gap_pct"] == pytest.approx(10.0)
    assert cells["fast"]["loss_vs_baseline"] == FAST_BUT_DIFFERENT
    # another PEFT method is another experiment: its baseline would be a lora none cell
    assert cells["lora"]["loss_vs_baseline"] == NO_BASELINE
    assert cells["lora"]["loss_baseline"] is None


def test_tolerance_is_configurable(tmp_path: Path) -> None:
    runs = [(_row("base"), BASE_CURVE, None), (_row("v", framework_config="x"), shifted(0.1), None)]
    loose = _report(tmp_path, runs, tolerance=0.2)
    assert loose["v"]["loss_vs_baseline"] == SAME


def test_trainer_variant_swept_values_and_repeats(tmp_path: Path) -> None:
    runs = [
        # a swept learning rate: each variant matched with the baseline of its own value
        (_row("b1"), BASE_CURVE, {"learning_rate": 1e-3}),
        (_row("b2"), shifted(0.5), {"learning_rate": 1e-2}),
        (_row("hf1", trainer="hf"), BASE_CURVE, {"learning_rate": 1e-3, "trainer": "hf"}),
        (_row("hf2", trainer="hf"), shifted(0.5), {"learning_rate": 1e-2, "trainer": "hf"}),
        # repeats: the median per step (two of three agree with the baseline)
        (_row("r", framework_config="ddp"), BASE_CURVE, {"learning_rate": 1e-3}),
        (_row("r", 1, framework_config="ddp"), shifted(0.9), {"learning_rate": 1e-3}),
        (_row("r", 2, framework_config="ddp"), BASE_CURVE, {"learning_rate": 1e-3}),
    ]
    cells = _report(tmp_path, runs)
    assert cells["b1"]["loss_vs_baseline"] == IS_BASELINE  # sft: causal-lm's default
    assert cells["hf1"]["loss_baseline"] == "b1" and cells["hf1"]["loss_vs_baseline"] == SAME
    assert cells["hf2"]["loss_baseline"] == "b2" and cells["hf2"]["loss_vs_baseline"] == SAME
    assert cells["r"]["loss_vs_baseline"] == SAME


def test_without_a_null_framework_trainers_compare_within_their_framework(
    tmp_path: Path,
) -> None:
    runs = [
        (_row("ddp-sft", framework_config="ddp"), BASE_CURVE, None),
        (_row("ddp-hf", framework_config="ddp", trainer="hf"), shifted(0.2), None),
        (_row("fsdp-sft", framework_config="fsdp"), BASE_CURVE, None),
        (_row("fsdp-hf", framework_config="fsdp", trainer="hf"), BASE_CURVE, None),
        # a framework with no other trainer: nothing compares with it
        (_row("ds-sft", framework_config="ds"), BASE_CURVE, None),
    ]
    cells = _report(tmp_path, runs)
    assert cells["ddp-hf"]["loss_baseline"] == "ddp-sft"
    assert cells["ddp-hf"]["loss_vs_baseline"] == DIFFERENT
    assert cells["fsdp-hf"]["loss_baseline"] == "fsdp-sft"
    assert cells["fsdp-hf"]["loss_vs_baseline"] == SAME
    assert cells["ddp-sft"]["loss_vs_baseline"] == IS_BASELINE
    assert cells["fsdp-sft"]["loss_vs_baseline"] == IS_BASELINE
    # frameworks are not compared with each other without a null framework
    assert cells["ds-sft"]["loss_vs_baseline"] == NO_BASELINE


def test_failed_cells_and_missing_curves(tmp_path: Path) -> None:
    runs = [
        (_row("base", status="oom"), None, None),
        (_row("v", framework_config="x"), BASE_CURVE, None),
        (_row("w", framework_config="y", status="failed"), None, None),
    ]
    cells = _report(tmp_path, runs)
    assert cells["v"]["loss_vs_baseline"] == NO_BASELINE
    assert cells["v"]["loss_baseline"] == "base"
    assert cells["w"]["loss_vs_baseline"] is None  # did not finish: nothing to say
    other = tmp_path / "other"
    cells = _report(
        other, [(_row("base"), None, None), (_row("v", framework_config="x"), BASE_CURVE, None)]
    )
    assert cells["v"]["loss_vs_baseline"] == NO_CURVE


def test_a_table_without_run_folders_gets_no_columns(tmp_path: Path) -> None:
    rows = pd.DataFrame([_row("base")])
    out = add_equivalence(rows, rows, tmp_path / "raw_summary.csv")
    assert "loss_vs_baseline" not in out.columns


def test_summary_section_lists_the_variants(tmp_path: Path) -> None:
    runs = [(_row("base"), BASE_CURVE, None), (_row("v", framework_config="x"), shifted(0.2), None)]
    for row, curve, swept in runs:
        _write(tmp_path, row, curve, swept)
    rows = pd.DataFrame([r for r, _, _ in runs])
    cells = add_equivalence(rows.copy(), rows, tmp_path)
    text = "\n".join(equivalence.markdown(cells, 0.05))
    assert "## Loss against the baseline" in text
    assert "| s | v | x | sft | base | 8 | 20.00% | 20.00% | **different** |" in text
    assert "1 of 1 variant(s) flagged" in text
    assert "no baseline to compare with" not in text


def test_cells_without_a_baseline_are_counted_not_listed(tmp_path: Path) -> None:
    runs = [
        (_row("base"), BASE_CURVE, None),
        (_row("v", framework_config="x"), BASE_CURVE, None),
        (_row("alone", scenario="other", framework_config="ddp"), BASE_CURVE, None),
    ]
    for row, curve, swept in runs:
        _write(tmp_path, row, curve, swept)
    rows = pd.DataFrame([r for r, _, _ in runs])
    cells = add_equivalence(rows.copy(), rows, tmp_path)
    text = "\n".join(equivalence.markdown(cells, 0.05))
    assert "| s | v | x |" in text and "| alone |" not in text
    assert "1 other cell(s) have no baseline to compare with" in text
    # a matrix where no cell has a baseline gets no section
    alone = add_equivalence(rows.iloc[[2]].copy(), rows.iloc[[2]], tmp_path)
    assert equivalence.markdown(alone, 0.05) == []


def test_compare_reports_a_loss_change_between_folders(tmp_path: Path) -> None:
    new, ref = tmp_path / "new", tmp_path / "ref"
    for root, curve in ((new, shifted(0.2)), (ref, BASE_CURVE)):
        _write(root, _row("a"), curve)
        _write(root, _row("b", framework_config="x"), BASE_CURVE)
    rows = pd.DataFrame([_row("a"), _row("b", framework_config="x")])
    keys = ["scenario", "framework_config"]
    matched = comparing.matched_experiments(rows, rows, keys)
    table = equivalence.compare_losses(matched, new, ref, 0.05)
    assert len(table) == 2
    changed = table[table["loss_change"]]
    assert list(changed["framework_config"]) == ["none"]
    assert changed["loss_gap_pct"].iloc[0] == pytest.approx(20.0)
    result = comparing.Comparison(
        table=pd.DataFrame(),
        keys=keys,
        only_new=pd.DataFrame(),
        only_ref=pd.DataFrame(),
        metrics=[],
        loss=table,
        loss_tolerance=0.05,
    )
    assert len(result.loss_changes) == 1
    md = comparing.markdown(result, "new", "ref", 0.1)
    assert "**1 loss change(s)** in 2 matched cell(s)" in md
    assert "| s · none | 8 | 20.00% | **loss change** |" in md


def test_compare_leaves_out_cells_whose_step_counts_differ(tmp_path: Path) -> None:
    # a steady-state run (cap 200) against a fixed one (20 steps): the learning-rate
    # schedules differ, so the curves would differ with nothing changed
    new, ref = tmp_path / "new", tmp_path / "ref"
    for root, steps in ((new, 200), (ref, 20)):
        _write(root, _row("a"), shifted(0.2) if root == new else BASE_CURVE)
        spec = root / "runs" / "a" / "spec.json"
        spec.write_text(json.dumps({"swept": {}, "arguments": {"max_steps": steps}}))
    rows = pd.DataFrame([_row("a")])
    matched = comparing.matched_experiments(rows, rows, ["scenario", "framework_config"])
    assert equivalence.compare_losses(matched, new, ref, 0.05).empty
