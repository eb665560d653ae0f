"""What the report's plots say: labels that tell every cell apart, a memory axis kept to
its bars, whiskers named only where drawn, loss curves that cannot hide one another."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
import pytest
from fakeruns import write_run

from orchestrator.results import plots
from orchestrator.results.aggregate import scaling
from orchestrator.results.capacity import Capacity
from orchestrator.results.report import CostSettings, build_report, write_report

GIB = 2**30


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _cell(scenario: str, **more) -> dict:
    cell = {
        "scenario": scenario,
        "cell_id": f"{scenario}.{len(more)}",
        "model_name_or_path": "org/tiny-llama",
        "framework_config": "ddp",
        "num_gpus": 1,
        "effective_batch_size": 4,
        "per_device_train_batch_size": 4,
        "max_seq_len": 128,
        "packing": True,
        "task": "causal_lm",
        "trainer": "sft",
        "peft_method": "none",
        "device": "gpu",
        "environment": None,
        "status": "ok",
        "tokens_per_second_global": 1000.0,
        "tokens_per_second_global_min": 1000.0,
        "tokens_per_second_global_max": 1000.0,
        "peak_memory_bytes": 0.6 * GIB,
    }
    cell.update(more)
    return cell


def _ticks(fig) -> list[str]:
    return [t.get_text() for t in fig.axes[0].get_yticklabels() if t.get_text()]


def _legend(fig) -> list[str]:
    return [t.get_text() for t in fig.axes[0].get_legend().get_texts()]


# -- labels ------------------------------------------------------------------------------


def test_two_scenarios_that_hold_one_setup_get_apart_labels(tmp_path) -> None:
    # the same two cells (eb 4 and eb 8) in two scenarios: the split used to count the
    # scenario, but the label never named it, so each label was there twice
    root = tmp_path / "results"
    for scenario in ("baseline", "rerun"):
        for eb in (4, 8):
            write_run(root, f"{scenario}.eb{eb}", scenario=scenario, effective_batch_size=eb)
    write_run(root, "other.g1", scenario="other", framework="deepspeed")
    cells = build_report(root, CostSettings()).cells
    texts = plots.labels(cells)
    assert len(set(texts)) == len(texts) == 5
    by_cell = dict(zip(cells["cell_id"], texts, strict=True))
    # the colliding ones name their scenario; the one no other reads like stays short
    assert "baseline" in by_cell["baseline.eb4"] and "rerun" in by_cell["rerun.eb4"]
    assert "other" not in by_cell["other.g1"]
    fig = plots.throughput_figure(cells)
    assert fig is not None
    ticks = _ticks(fig)
    assert len(set(ticks)) == len(ticks) == 5


def test_the_key_that_differs_goes_in_the_colliding_labels_only() -> None:
    cells = pd.DataFrame(
        [
            _cell("full", effective_batch_size=4, cell_id="f4"),
            _cell("full", effective_batch_size=8, cell_id="f8", framework_config="deepspeed"),
            _cell("lora", effective_batch_size=4, cell_id="l4", peft_method="lora"),
            # one scenario, two cells apart only by the environment they ran under
            _cell("envs", cell_id="e1", framework_config="fsdp", environment="torch-2.4"),
            _cell("envs", cell_id="e2", framework_config="fsdp", environment="torch-2.5"),
        ]
    )
    texts = dict(zip(cells["cell_id"], plots.labels(cells), strict=True))
    assert len(set(texts.values())) == 5
    # full and lora at eb 4 read alike but for the PEFT method, which their labels add
    assert texts["f4"].endswith("no PEFT") and texts["l4"].endswith("lora")
    # the environment tells the two cells of "envs" apart
    assert "env torch-2.4" in texts["e1"] and "env torch-2.5" in texts["e2"]
    # the environment splits a scenario, so every label names it (as before); the
    # deepspeed cell collides with nothing: no PEFT method, no scenario in its label
    assert texts["f8"] == "tiny-llama · deepspeed · 1 GPU · no env"


def test_cells_nothing_tells_apart_are_numbered() -> None:
    cells = pd.DataFrame([_cell("s"), _cell("s")]).drop(columns=["cell_id"])
    assert plots.labels(cells) == [
        "tiny-llama · ddp · 1 GPU · #1",
        "tiny-llama · ddp · 1 GPU · #2",
    ]


def test_cpu_cells_count_processes_in_their_labels() -> None:
    cpu = plots.labels(pd.DataFrame([_cell("s", device="cpu", num_gpus=2)]))
    gpu = plots.labels(pd.DataFrame([_cell("s", num_gpus=2)]))
    # a table from before the device column: GPUs
    old = plots.labels(pd.DataFrame([_cell("s", num_gpus=2)]).drop(columns=["device"]))
    assert cpu == ["tiny-llama · ddp · 2 proc"]
    assert gpu == old == ["tiny-llama · ddp · 2 GPU"]


def test_scaling_lines_apart_by_every_key_of_their_series() -> None:
    # two series apart only by packing: the plot grouped them on fewer keys than
    # the table's, and drew them as one line
    cells = pd.DataFrame(
        [
            _cell("s", cell_id=f"{packing}{n}", num_gpus=n, packing=packing)
            | {"tokens_per_second_global": 1000.0 * n * (0.9 if packing else 0.8)}
            for packing in (True, False)
            for n in (1, 2)
        ]
    )
    fig = plots.scaling_figure(scaling(cells))
    assert fig is not None
    legend = _legend(fig)
    assert len(fig.axes[0].get_legend().legend_handles) == 2
    assert len(set(legend)) == 2
    assert any("packed" in t and "unpacked" not in t for t in legend)
    assert any("unpacked" in t for t in legend)


# -- memory: the axis keeps to the bars ---------------------------------------------------


def _capacity_lines(ax) -> list:
    return [line for line in ax.lines if line.get_color() == "#b71c1c"]


def test_a_far_capacity_is_named_not_drawn() -> None:
    cells = pd.DataFrame(
        [
            _cell("s", cell_id=str(i), device="cpu", peak_memory_bytes=g * GIB)
            for i, g in enumerate((0.6, 0.64))
        ]
    )
    fig = plots.memory_figure(cells, Capacity(23.5 * GIB, "env.json", gpu=False))
    assert fig is not None
    ax = fig.axes[0]
    # the axis used to reach 23.5 GiB, the bars 3% of it
    assert ax.get_xlim()[1] < 1.0
    assert _capacity_lines(ax) == []
    assert "machine memory 23.5 GiB: off the axis" in ax.get_xlabel()
    assert not any("machine memory" in t.get_text() for t in ax.texts)


def test_a_capacity_the_bars_come_near_is_drawn() -> None:
    cells = pd.DataFrame(
        [_cell("s", cell_id=str(i), peak_memory_bytes=g * GIB) for i, g in enumerate((30, 50))]
    )
    fig = plots.memory_figure(cells, Capacity(80 * GIB, "given"))
    assert fig is not None
    ax = fig.axes[0]
    (line,) = _capacity_lines(ax)
    assert list(line.get_xdata()) == [80, 80]
    assert ax.get_xlim()[1] >= 80
    assert "device memory 80 GiB " in [t.get_text() for t in ax.texts]
    assert "off the axis" not in ax.get_xlabel()


def test_the_capacity_line_rule() -> None:
    assert plots.near_capacity(11.75, 23.5)  # half of it
    assert not plots.near_capacity(11.7, 23.5)
    assert plots.near_capacity(30, 23.5)  # past it
    assert not plots.near_capacity(1, 0)


# -- whiskers ----------------------------------------------------------------------------


def test_no_whisker_no_word_of_whiskers(tmp_path) -> None:
    root = tmp_path / "results"
    write_run(root, "a.g1", tps=1000.0)
    write_run(root, "b.g1", framework="ddp", tps=1200.0)
    fig = plots.throughput_figure(build_report(root, CostSettings()).cells)
    assert fig is not None
    ax = fig.axes[0]
    assert len(ax.lines) == 0  # one repeat each: min == max, nothing drawn
    assert "min–max" not in ax.get_xlabel() and "whisker" not in ax.get_xlabel()
    assert "median over repeats" in ax.get_xlabel()


def test_a_drawn_whisker_is_named_for_what_it_spans(tmp_path) -> None:
    root = tmp_path / "results"
    for repeat, tps in enumerate((900.0, 1000.0, 1300.0)):
        write_run(root, f"a.g1.r{repeat}", cell_id="a.g1", repeat=repeat, tps=tps)
    write_run(root, "b.g1", framework="ddp", tps=1200.0)
    fig = plots.throughput_figure(build_report(root, CostSettings()).cells)
    assert fig is not None
    ax = fig.axes[0]
    (whisker,) = ax.lines
    assert list(whisker.get_xdata()) == [900.0, 1300.0]
    assert "bar: the median over repeats, whisker: their min–max" in ax.get_xlabel()


# -- loss curves ---------------------------------------------------------------------------


def _loss_root(tmp_path: Path) -> Path:
    root = tmp_path / "results"
    same = [[s, 3.0 - 0.01 * s * s % 0.7] for s in range(1, 61)]
    write_run(
        root, "hf.g1", scenario="sft-vs-hf", extra_arguments={"trainer": "hf"}, loss_history=same
    )
    write_run(
        root,
        "sft.g1",
        scenario="sft-vs-hf",
        extra_arguments={"trainer": "sft"},
        loss_history=[list(h) for h in same],
    )
    write_run(
        root,
        "other.g1",
        scenario="sft-vs-hf",
        framework="ddp",
        extra_arguments={"trainer": "sft"},
        loss_history=[[s, v + 0.05] for s, v in same],
    )
    return root


def test_identical_loss_curves_say_so_and_stay_visible(tmp_path) -> None:
    root = _loss_root(tmp_path)
    report = build_report(root, CostSettings())
    curves, finished = plots._loss_curves(report.rows, root)
    assert finished == 3
    fig = plots.loss_figure(curves, finished)
    ax = fig.axes[0]
    legend = _legend(fig)
    assert len(set(legend)) == 3
    same = [t for t in legend if "same loss as" in t]
    assert len(same) == 2
    # each names the other by what tells it apart
    assert any(
        "trainer=hf" in t.split("(same loss as")[0] and t.endswith("trainer=sft)") for t in same
    )
    assert not any("same loss" in t for t in legend if "ddp" in t.split(" (")[0])
    lines = ax.get_lines()
    # more than 40 points and still a marker on each curve, never two on one step
    assert all(line.get_marker() not in (None, "None", "") for line in lines)
    marked = [
        {int(line.get_xdata()[k]) for k in range(len(line.get_xdata()))[slice(*_every(line))]}
        for line in lines
    ]
    assert all(marked) and not (
        marked[0] & marked[1] or marked[0] & marked[2] or marked[1] & marked[2]
    )
    # the identical pair differ in dash, and the one drawn first lies wider beneath
    pair = [line for line, t in zip(lines, legend, strict=True) if "same loss as" in t]
    assert pair[0].get_linestyle() != pair[1].get_linestyle()
    assert pair[0].get_linewidth() > pair[1].get_linewidth()


def _every(line) -> tuple[int, None, int]:
    start, step = line.get_markevery()
    return start, None, step


def test_curves_that_merely_cross_are_not_called_the_same() -> None:
    a = [[1, 2.0], [2, 1.5], [3, 1.0]]
    assert plots._same_loss(a, [[1, 2.0], [2, 1.5 + 1e-9], [3, 1.0]])
    assert not plots._same_loss(a, [[1, 2.0], [2, 1.4], [3, 1.0]])
    assert not plots._same_loss(a, [[4, 2.0]])  # no step in common


# -- GPUs or processes -------------------------------------------------------------------


@pytest.mark.parametrize(("device", "worker"), [("cpu", "process"), ("gpu", "GPU")])
def test_cpu_runs_say_process_not_gpu(tmp_path, device, worker) -> None:
    root = tmp_path / "results"
    write_run(root, "a.g1", device=device, tps=1000.0)
    report = write_report(root, root, CostSettings())
    fig = plots.hf_estimate_figure(report.cells)
    assert fig is not None
    assert f"train_tokens_per_second: per {worker}, padding" in fig.axes[0].get_xlabel()
    # one count only: no scaling plot, and the note says of what
    assert any(f"at two or more {worker} counts" in note for note in report.plot_notes)
    other = "GPU" if device == "cpu" else "process"
    assert not any(other in note for note in report.plot_notes)
