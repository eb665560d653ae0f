"""Energy in the report: the derived figures against hand arithmetic, summary.md's
section, the frontier plot, --rank-by energy, compare and the prices' flags."""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from fakeruns import write_run

from orchestrator.cli.app import main
from orchestrator.results import collect, plots
from orchestrator.results.aggregate import CostSettings, add_energy
from orchestrator.results.compare import compare
from orchestrator.results.report import add_derived, build_report, write_report

MEASURED = 30.0  # seconds of measured steps in every fake run


def _row(**more: Any) -> dict[str, Any]:
    return {
        "device": "gpu",
        "num_gpus": 2,
        "run_mode": "alone",
        "energy_j": 6000.0,
        "energy_window": "measured",
        "energy_devices": 2,
        "tokens_measured": 30_000,
        "samples_measured": 300,
        **more,
    }


def test_energy_per_token_by_hand() -> None:
    prices = CostSettings(usd_per_kwh=0.15, grams_co2_per_kwh=400)
    out = add_energy(pd.DataFrame([_row()]), prices).iloc[0]
    assert out["energy_per_token_j"] == pytest.approx(6000 / 30_000)  # 0.2 J
    assert out["energy_per_sample_j"] == pytest.approx(6000 / 300)
    kwh = 0.2 * 1e6 / 3.6e6  # per 1M tokens
    assert out["kwh_per_1m_tokens"] == pytest.approx(kwh)
    assert out["energy_cost_per_1m_tokens_usd"] == pytest.approx(kwh * 0.15)
    assert out["co2_per_1m_tokens_g"] == pytest.approx(kwh * 400)
    # without prices, no cost and no emissions
    assert "energy_cost_per_1m_tokens_usd" not in add_energy(pd.DataFrame([_row()]), CostSettings())


@pytest.mark.parametrize(
    ("more", "why"),
    [
        ({"energy_window": "training"}, "energy over the training, not the measured steps"),
        ({"energy_devices": 1}, "energy of another number of GPUs than the cell ran on"),
        ({"energy_devices": 4}, "energy of another number of GPUs than the cell ran on"),
        (
            {"energy_source": "rapl package counter"},
            "the CPU packages' energy (RAPL), not the GPUs' the cell ran on",
        ),
        ({"tokens_measured": None}, "no tokens measured"),
        (
            {"device": "cpu", "run_mode": "packed", "energy_devices": 1},
            "RAPL counts the whole CPU package, which packed jobs shared",
        ),
    ],
)
def test_energy_that_does_not_cover_the_cell_gives_no_figure(more, why) -> None:
    out = add_energy(pd.DataFrame([_row(**more)]), CostSettings(usd_per_kwh=0.1)).iloc[0]
    assert math.isnan(out["energy_per_token_j"]) and math.isnan(out["kwh_per_1m_tokens"])
    assert math.isnan(out["energy_cost_per_1m_tokens_usd"])
    assert out["energy_note"] == f"no energy per token: {why}"
    # a CPU cell alone on its packages has one (its note says what RAPL counts)
    alone = add_energy(pd.DataFrame([_row(device="cpu", energy_devices=1)]), CostSettings())
    assert alone.iloc[0]["energy_per_token_j"] == pytest.approx(0.2)


def _energy(joules: float, n: int, conditions: str = "700 W limit", throttled: float = 0.0):
    return {
        "energy_j": joules,
        "energy_source": "nvml energy counter",
        "energy_window": "measured",
        "energy_devices": n,
        "power_mean_w": joules / MEASURED / n,
        "gpu_conditions": conditions,
        "gpu_throttled_pct": throttled,
        "gpu_clock_reasons": "sw power cap 62%" if throttled else "none",
    }


def _cell(root: Path, cell: str, tps: float, side: dict[str, Any], *, n: int = 1, **more: Any):
    for repeat in range(2):
        write_run(
            root,
            f"{cell}-r{repeat}",
            cell_id=cell,
            repeat=repeat,
            num_gpus=n,
            tps=tps,
            sidecar=side,
            metrics={"tokens_measured": tps * MEASURED, "measured_time_s": MEASURED},
            **more,
        )


def _folder(root: Path) -> Path:
    # fast but hungry, slower but frugal, throttled under a lower limit, no figure
    _cell(root, "fast", 9000.0, _energy(700 * MEASURED, 1), framework="ddp")
    _cell(root, "frugal", 8000.0, _energy(500 * MEASURED, 1), framework="fsdp")
    _cell(
        root,
        "capped",
        7000.0,
        _energy(450 * MEASURED, 1, "500 W limit, throttled (sw power cap)", 62.0),
        framework="deepspeed",
    )
    _cell(
        root,
        "blind",
        6000.0,
        {"energy_note": "no energy figure: GPU 0 has no energy counter; no power samples"},
        framework="dp",
    )
    return root


def test_summary_has_the_energy_columns_notes_and_plot(tmp_path) -> None:
    root = _folder(tmp_path / "r")
    report = write_report(root, root, CostSettings(usd_per_kwh=0.2, grams_co2_per_kwh=300))
    md = (root / "summary.md").read_text()
    energy = md.split("## Energy\n", 1)[1]
    assert "At $0.2 per kWh and 300 g CO2 per kWh (your numbers)" in energy
    table = [line for line in energy.splitlines() if line.startswith("| `")]
    fast = next(line for line in table if line.startswith("| `fast`"))
    # 700 W over 9000 tokens/s: 0.07778 J/token; 0.02160 kWh per 1M tokens
    j = 700 / 9000
    kwh = j * 1e6 / 3.6e6
    cells = [c.strip() for c in fast.strip("|").split("|")]
    assert cells[1:8] == [
        "9,000",
        f"{j:.4g}",
        "700",
        f"{kwh:.4g}",
        f"{kwh * 0.2:.3g}",
        f"{kwh * 300:.3g}",
        "nvml energy counter",
    ]
    assert "`capped` (org/model, deepspeed, 1 GPU) ran slowed in 62% of its measured " in md
    assert (
        "scenario s: its cells ran under different conditions (500 W limit, throttled (sw power cap); 700 W limit)"
        in md
    )
    assert "- GPU 0 has no energy counter; no power samples: `blind`" in md
    # the main table shows J/token beside tokens/s
    header = next(line for line in md.splitlines() if line.startswith("| model | framework |"))
    assert "| tokens/s |" in header and "| J/token |" in header
    assert root / "plots" / "energy.png" in report.written
    assert any(
        n.startswith("`plots/energy.png`: tokens/s against joules") for n in report.plot_notes
    )


def test_frontier_by_hand() -> None:
    # (J/token, tokens/s): 0 and 1 are on it; 2 is beaten by 1 on both; 3 ties 0 on energy
    # and is slower
    points = [(0.05, 8000.0), (0.08, 9000.0), (0.09, 8500.0), (0.05, 7000.0)]
    assert plots.frontier(points) == [0, 1]
    assert plots.frontier([(1.0, 1.0)]) == [0]
    # the sweep against the definition, point by point against every other, on many small
    # sets with ties and duplicates
    rng = random.Random(7)

    def by_definition(points: list[tuple[float, float]]) -> list[int]:
        return [
            i
            for i, (j, t) in enumerate(points)
            if not any(
                oj <= j and ot >= t and (oj < j or ot > t)
                for k, (oj, ot) in enumerate(points)
                if k != i
            )
        ]

    for _ in range(2000):
        points = [
            (rng.choice([0.1, 0.2, 0.3]), rng.choice([1.0, 2.0, 3.0]))
            for _ in range(rng.randint(1, 8))
        ]
        assert plots.frontier(points) == by_definition(points), points


def test_rank_by_energy_recommends_the_frugal_cell(tmp_path, capsys) -> None:
    root = _folder(tmp_path / "r")
    assert main(["report", str(root), "--no-plots"]) == 0
    speed = (root / "summary.md").read_text().split("## Recommendation", 1)[1]
    assert "| `fast` (" in speed.split("\n\n")[2]
    assert main(["report", str(root), "--no-plots", "--rank-by", "energy"]) == 0
    energy = (root / "summary.md").read_text().split("## Recommendation", 1)[1]
    row = energy.split("\n\n")[2].splitlines()[2]
    # frugal uses the least (500 W / 8000 tokens/s = 0.0625 J); the next, capped (450 W /
    # 7000 = 0.0643 J, 2.9% more), ran throttled under a lower limit
    assert row.split(" | ")[3].startswith("`frugal`")
    assert (
        "uses 2.9% more energy per token and ran under other conditions (700 W limit vs "
        "500 W limit, throttled (sw power cap)): not separable by their medians" in row
    )
    assert "Ranked by energy (--rank-by energy)" in energy
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        main(["report", str(root), "--rank-by", "joules"])
    assert exit_.value.code == 2 and "invalid choice: 'joules'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        main(["report", str(root), "--usd-per-kwh", "-1"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2
    assert "--usd-per-kwh: -1 is not a positive number" in err and len(err.splitlines()) == 1


def test_compare_matches_energy_and_marks_other_conditions(tmp_path) -> None:
    new, ref = tmp_path / "new", tmp_path / "ref"
    _cell(new, "a", 9000.0, _energy(900 * MEASURED, 1, "500 W limit"))
    _cell(ref, "a", 9000.0, _energy(700 * MEASURED, 1))
    rows_new = add_derived(collect.load(new), CostSettings())
    rows_ref = add_derived(collect.load(ref), CostSettings())
    done = compare(rows_new, rows_ref)
    row = done.table[done.table["metric"] == "energy_per_token_j"].iloc[0]
    assert bool(row["regression"])  # 29% more joules per token
    assert row["differs"] == "gpu_conditions"
    assert "gpu_conditions: 700 W limit (ref) vs 500 W limit (new)" in row["mismatch"]


def test_no_energy_recorded_no_section(tmp_path) -> None:
    root = tmp_path / "old"
    write_run(root, "a")  # a folder from before energy was recorded
    report = build_report(root, CostSettings())
    md = write_report(root, root, CostSettings(), plots=False)
    assert report.cells["energy_per_token_j"].isna().all()
    assert "## Energy" not in (root / "summary.md").read_text() and md is not None
