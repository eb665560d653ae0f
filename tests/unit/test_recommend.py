"""summary.md's recommendation: the fastest and cheapest cells that fitted, how sure."""

from __future__ import annotations

from typing import Any

import pandas as pd
import pytest

from orchestrator.results import recommend

TPS = "tokens_per_second_global"


def _cell(cell_id: str, tps: float | None, **more: Any) -> dict[str, Any]:
    cell = {
        "cell_id": cell_id,
        "scenario": "s",
        "framework_config": "none",
        "model_name_or_path": "org/m",
        "device": "gpu",
        "num_gpus": 1,
        "per_device_train_batch_size": 4,
        "gradient_accumulation_steps": 1,
        "status": "ok",
        "error": None,
        "repeats_ok": 1,
        TPS: tps,
        f"{TPS}_cv": None,
        f"{TPS}_min": tps,
        f"{TPS}_max": tps,
    }
    cell.update(more)
    return cell


def _table(text: str, scenario: str = "s") -> list[str]:
    """The per-scenario table's rows of ``scenario``."""
    return [line for line in text.splitlines() if line.startswith(f"| {scenario} | org/m")]


def _across(text: str) -> list[str]:
    """The across-scenarios table's rows."""
    return [line for line in text.splitlines() if line.startswith("| org/m")]


def test_never_recommends_oom_pruned_or_failed_cells() -> None:
    cells = pd.DataFrame(
        [
            _cell("oom", None, status="oom", error="CUDA out of memory"),
            _cell("pruned", None, status="skipped", error="pruned: oom ran out of memory"),
            # a pruned cell shown as ok still never counts
            _cell("pruned-ok", 9e9, status="ok", error="pruned: oom ran out of memory"),
            _cell("failed", None, status="failed"),
            _cell("mixed", 9e9, status="ok×2 oom×1"),
            _cell("fits", 1000.0),
        ]
    )
    assert list(recommend.candidates(cells)["cell_id"]) == ["fits"]
    text = "\n".join(recommend.markdown(cells))
    (row,) = _table(text)
    assert "`fits`" in row and "no other cell finished ok" in row
    assert "(5 cell(s) left out)" in text


def test_nothing_fitted() -> None:
    cells = pd.DataFrame([_cell("oom", None, status="oom")])
    assert "nothing to recommend" in "\n".join(recommend.markdown(cells))


def test_fastest_per_gpu_count_and_cheapest_across_counts() -> None:
    cells = pd.DataFrame(
        [
            _cell("a1", 1000.0),
            _cell("b1", 1500.0, framework_config="ddp"),
            _cell("a2", 2400.0, num_gpus=2),
        ]
    )
    text = "\n".join(recommend.markdown(cells))
    rows = _table(text)
    assert len(rows) == 2
    assert "`b1`" in rows[0] and "| 1 |" in rows[0]
    assert "`a2`" in rows[1] and "| 2 |" in rows[1]
    # GPU-hours per 1M tokens: GPUs / tokens/s; b1: 1e6/1500/3600
    assert recommend.device_hours_per_1m(cells.iloc[1].to_dict()) == pytest.approx(
        1e6 / 1500 / 3600
    )
    # the cheapest across counts is b1 (1 GPU at 1500) rather than a2 (2 GPUs at 2400)
    assert "cheapest per 1M tokens for org/m: `b1`" in text


def test_runner_up_within_noise_and_separable() -> None:
    one = pd.DataFrame([_cell("a", 1000.0), _cell("b", 985.0)])
    text = "\n".join(recommend.markdown(one))
    assert (
        "has 1.5% fewer tokens/s (the fastest is 1.02× as fast): not separable with 1 repeat"
        in text
    )
    # the runner-up's shortfall is 1 - 800/1000 = 20%, not the 25% the fastest is ahead
    far = pd.DataFrame([_cell("a", 1000.0), _cell("b", 800.0)])
    text = "\n".join(recommend.markdown(far))
    assert "has 20.0% fewer tokens/s (the fastest is 1.25× as fast); 1 repeat: no spread" in text
    assert "25.0%" not in text
    # 5% is judged on the shortfall: 1 - 950/1000 = 5.0% is separable enough to say
    edge = pd.DataFrame([_cell("a", 1000.0), _cell("b", 950.0)])
    assert "not separable" not in "\n".join(recommend.markdown(edge))
    overlap = pd.DataFrame(
        [
            _cell("a", 1000.0, repeats_ok=3, **{f"{TPS}_cv": 0.03, f"{TPS}_min": 960.0}),
            _cell("b", 980.0, repeats_ok=3, **{f"{TPS}_max": 1010.0}),
        ]
    )
    text = "\n".join(recommend.markdown(overlap))
    assert "3 repeats, CV 3.0%" in text
    assert "within the noise (their repeats overlap, 3 vs 3)" in text
    apart = pd.DataFrame(
        [
            _cell("a", 1000.0, repeats_ok=3, **{f"{TPS}_min": 990.0}),
            _cell("b", 900.0, repeats_ok=3, **{f"{TPS}_max": 950.0}),
        ]
    )
    assert "separable (every one of 3 repeats faster" in "\n".join(recommend.markdown(apart))


def test_fast_but_different_is_not_recommended_without_a_warning() -> None:
    cells = pd.DataFrame(
        [
            _cell("base", 1000.0, loss_vs_baseline="baseline"),
            _cell(
                "wrong",
                2000.0,
                framework_config="x",
                loss_vs_baseline="fast but different",
                loss_gap_pct=12.0,
            ),
        ]
    )
    text = "\n".join(recommend.markdown(cells))
    (row,) = _table(text)
    assert "`base`" in row
    assert "**warning**: `wrong`" in text and "loss gap 12.0%" in text
    # every cell flagged: recommended, with a warning
    alone = pd.DataFrame([cells.iloc[1].to_dict()])
    text = "\n".join(recommend.markdown(alone))
    assert "`wrong`" in _table(text)[0]
    assert "recommended although its loss departs" in text


def test_cost_in_usd_where_priced() -> None:
    cells = pd.DataFrame([_cell("a", 1000.0, cost_per_1m_tokens_usd=0.7)])
    text = "\n".join(recommend.markdown(cells))
    assert "$ per 1M tokens" in text and "$0.7000" in text


def test_per_scenario_then_across_only_where_scenarios_share_model_task_and_count() -> None:
    cells = pd.DataFrame(
        [
            _cell("lora-a", 1000.0, scenario="lora", task="causal-lm"),
            _cell("lora-b", 1200.0, scenario="lora", task="causal-lm"),
            _cell("full-a", 900.0, scenario="full", task="causal-lm"),
            # another task: never ranked against the causal-lm scenarios
            _cell("cls-a", 5000.0, scenario="cls", task="seq-classification"),
            # another GPU count: a row of its own, never ranked against 1 GPU
            _cell("full-2", 1700.0, scenario="full", task="causal-lm", num_gpus=2),
        ]
    )
    text = "\n".join(recommend.markdown(cells))
    # each scenario answers its own question, per GPU count
    assert "`lora-b`" in _table(text, "lora")[0]
    assert "`lora-a`" in _table(text, "lora")[0]  # its runner-up
    full = _table(text, "full")
    assert len(full) == 2 and "`full-a`" in full[0] and "`full-2`" in full[1]
    assert "`cls-a`" in _table(text, "cls")[0]
    # across scenarios: only causal-lm at 1 GPU is shared (lora and full)
    (row,) = _across(text)
    assert "| causal-lm | 1 |" in row and "`lora-b`" in row and "`full-a`" not in row
    assert "`cls-a`" not in row
    # no group of one scenario: no across table at all
    alone = "\n".join(recommend.markdown(cells[cells["scenario"] == "lora"]))
    assert not _across(alone) and "Across scenarios" not in alone


def test_cpu_cells_count_processes() -> None:
    cells = pd.DataFrame([_cell("a", 1000.0, device="cpu"), _cell("b", 900.0, device="cpu")])
    text = "\n".join(recommend.markdown(cells))
    assert "| scenario | model | processes |" in text
    assert "process-h per 1M tokens" in text and "on 1 process:" in text
    assert "GPU" not in text


def test_a_runner_up_left_out_for_its_loss_is_not_called_missing() -> None:
    cells = pd.DataFrame(
        [
            _cell("base", 1000.0, loss_vs_baseline="baseline"),
            _cell("hot", 900.0, framework_config="hot", loss_vs_baseline="different"),
        ]
    )
    (row,) = _table("\n".join(recommend.markdown(cells)))
    assert "`base`" in row and "no other cell finished ok" not in row
    assert "every other cell that finished ok trains unlike its baseline" in row


def test_the_records_are_built_once_whatever_the_number_of_groups(monkeypatch) -> None:
    """A growth check by counting, not timing: the recommendation turns the table into
    records a fixed number of times, however many scenario, model and GPU-count groups
    it has (once per group, it was most of the report's time over 10,000 cells)."""
    calls = []
    real = pd.DataFrame.to_dict

    def counted(self: pd.DataFrame, *args: Any, **kwargs: Any) -> Any:
        calls.append(len(self))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(pd.DataFrame, "to_dict", counted)

    def table(groups: int) -> pd.DataFrame:
        cells = [
            _cell(f"c{g}-{i}", 1000.0 + 10 * i, scenario=f"s{g % 3}", num_gpus=1 + g)
            for g in range(groups)
            for i in range(3)
        ]
        return pd.DataFrame(cells)

    counts = []
    for groups in (2, 40):
        calls.clear()
        lines = recommend.markdown(table(groups))
        # a row per scenario, model and GPU count: every group answered
        assert sum(line.startswith(("| s0 ", "| s1 ", "| s2 ")) for line in lines) == groups
        counts.append(len(calls))
    assert counts[0] == counts[1] <= 2, counts
