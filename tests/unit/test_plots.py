"""The report's plots, rendered headless: every text inside the image, statuses coloured
by meaning, and a plot with nothing to draw left out with a reason."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pytest
from fakeruns import write_run

from orchestrator.results import plots
from orchestrator.results.report import CostSettings, build_report, write_report

GIB = 2**30
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
REFS = FIXTURES / "fms_refs_a100_80gb.csv"


def _texts(fig) -> list:
    """Every text artist a reader must see: tick labels, titles, legends, value labels."""
    ax = fig.axes[0]
    texts = [t for t in ax.get_yticklabels() if t.get_text()]
    texts += [t for t in ax.texts if t.get_text()]
    texts += [t for t in (ax.xaxis.label, *fig.texts) if t.get_text()]
    return texts + [legend for legend in ax.findobj(plt.matplotlib.legend.Legend)]


def _outside(fig) -> list[str]:
    """The texts (and legends) that do not lie inside the figure."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    box = fig.bbox
    bad = []
    for artist in _texts(fig):
        extent = artist.get_window_extent(renderer)
        inside = (
            extent.x0 >= box.x0 - 1
            and extent.y0 >= box.y0 - 1
            and extent.x1 <= box.x1 + 1
            and extent.y1 <= box.y1 + 1
        )
        if not inside:
            name = artist.get_text() if hasattr(artist, "get_text") else type(artist).__name__
            bad.append(f"{name!r}: {extent} not in {box}")
    return bad


def _folder(tmp_path: Path) -> Path:
    root = tmp_path / "results"
    write_run(root, "a.g1", tps=1000.0)
    write_run(root, "a.g2", num_gpus=2, tps=1800.0)
    write_run(root, "b.g1", framework="ddp", status="oom", error="CUDA out of memory")
    write_run(root, "c.g1", framework="ddp", num_gpus=2, status="failed", error="boom")
    write_run(root, "d.g1", framework="deepspeed", tps=None)  # ok, but no figure
    return root


@pytest.fixture(scope="module")
def refs():
    return build_report(REFS, CostSettings())


@pytest.mark.parametrize("figure", ["hf_estimate_figure", "memory_figure"])
def test_every_label_of_the_predecessors_table_fits(refs, figure) -> None:
    fig = getattr(plots, figure)(
        refs.cells, *([refs.capacity] if figure == "memory_figure" else [])
    )
    try:
        labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
        # a cell label names what tells it apart; GPTQ Mixtral with its framework wraps
        assert any("Mixtral-8x7B-Instruct-v0.1-GPTQ" in t and "\n" in t for t in labels)
        assert all(len(line) <= plots.WRAP for t in labels for line in t.splitlines())
        assert len(set(labels)) == len(labels), "two cells with one label"
        assert not any("epoch" in t for t in labels)
        assert _outside(fig) == []
    finally:
        plt.close(fig)


def test_long_names_wrap_and_fit(tmp_path) -> None:
    root = tmp_path / "r"
    long_model = "TheBloke/Mixtral-8x7B-Instruct-v0.1-GPTQ-with-a-much-longer-name-than-any"
    for i, framework in enumerate(
        ("accelerated-peft-autogptq-foak-padding-free-multipack-liger", "none")
    ):
        for gpus in (1, 2):
            write_run(
                root,
                f"x{i}.g{gpus}",
                model=long_model,
                framework=framework,
                num_gpus=gpus,
                tps=1000.0 * gpus,
                extra_arguments={"target_modules": "q_proj k_proj v_proj o_proj gate_proj up_proj"},
            )
    cells = build_report(root, CostSettings()).cells
    fig = plots.throughput_figure(cells)
    assert fig is not None
    try:
        assert _outside(fig) == []
    finally:
        plt.close(fig)


def test_status_colours_carry_meaning(tmp_path) -> None:
    ok, oom = plots.status_color("ok"), plots.status_color("oom")
    assert ok != oom
    assert not plots.is_reddish(ok)
    assert plots.is_reddish(oom) and plots.is_reddish(plots.status_color("failed"))
    assert plots.is_reddish(plots.status_color("likely_oom"))
    assert not plots.is_reddish(plots.status_color("timeout"))
    assert plots.is_reddish("red") and not plots.is_reddish("#1f77b4")  # the test can tell
    # bars of finished cells are never red, whatever the scenario
    assert not any(plots.is_reddish(c) for c in plots.SCENARIO_COLORS)
    assert plots.status_kind("ok×2 oom×1") == "oom"
    assert plots.status_kind("failed", likely_oom=True) == "likely_oom"

    cells = build_report(_folder(tmp_path), CostSettings()).cells
    fig = plots.throughput_figure(cells)
    assert fig is not None
    try:
        marks = {t.get_text(): t.get_color() for t in fig.axes[0].texts}
        assert marks["OOM"] == plots.STATUS_COLORS["oom"]
        assert marks["failed"] == plots.STATUS_COLORS["failed"]
        assert marks["ok, no figure"] == plots.STATUS_COLORS["ok"]
        assert not plots.is_reddish(marks["ok, no figure"])
        assert _outside(fig) == []
    finally:
        plt.close(fig)


def test_likely_oom_cells_are_marked_not_confirmed(refs) -> None:
    # the May 2024 table: 60 cells, all drawn, 20 of them without metrics
    may = build_report(FIXTURES / "fms_a100_80gb_2024-05-27.csv", CostSettings())
    fig = plots.hf_estimate_figure(may.cells)
    assert fig is not None
    try:
        marks = [(t.get_text(), t.get_color()) for t in fig.axes[0].texts]
        likely = [color for text, color in marks if text == "likely OOM"]
        assert likely == [plots.STATUS_COLORS["likely_oom"]] * 20
        assert not any(text == "OOM" for text, _ in marks)  # none is a confirmed OOM
    finally:
        plt.close(fig)
    fig = plots.memory_figure(refs.cells, refs.capacity)
    assert fig is not None
    try:
        texts = [t.get_text() for t in fig.axes[0].texts]
        # the memory a likely-OOM run reached, drawn hatched with its mark: 81,214 MiB
        assert "79.3 · likely OOM" in texts
        assert "device memory 80 GiB " in texts
    finally:
        plt.close(fig)


def test_a_plot_with_nothing_to_draw_is_left_out_and_summary_says_why(tmp_path) -> None:
    # an empty frame an earlier report left there does not stay
    (tmp_path / "plots").mkdir()
    (tmp_path / "plots" / "throughput.png").write_bytes(b"stale")
    report = write_report(REFS, tmp_path, CostSettings())
    names = {p.name for p in (tmp_path / "plots").iterdir()}
    # no measured throughput in the predecessor's table: HF's estimate, in a plot of its own
    assert names == {"throughput_hf_estimate.png", "memory.png"}
    assert plots.throughput_figure(report.cells) is None
    md = (tmp_path / "summary.md").read_text()
    assert "- `plots/throughput.png`: not drawn, no cell has a measured tokens/s" in md
    assert "- `plots/throughput_hf_estimate.png`: HF Trainer's estimate" in md
    assert "- `plots/scaling.png`: not drawn" in md
    assert "- `plots/loss.png`: not drawn" in md


def test_our_own_run_draws_no_hf_plot(tmp_path) -> None:
    root = _folder(tmp_path)
    write_report(root, root, CostSettings())
    names = {p.name for p in (root / "plots").iterdir()}
    assert {"throughput.png", "memory.png", "scaling.png", "loss.png"} == names
    md = (root / "summary.md").read_text()
    assert "- `plots/throughput.png`: measured tokens/s per cell" in md
    assert "throughput_hf_estimate" not in md


def test_the_fit_check_sees_a_label_off_the_image() -> None:
    # the layout the report used to have: a fixed left margin, whatever the labels
    fig, ax = plt.subplots(figsize=(6, 2))
    ax.barh([0], [1])
    ax.set_yticks([0])
    ax.set_yticklabels(["Mixtral-8x7B-Instruct-v0.1-GPTQ · accelerated-peft-autogptq-foak"])
    fig.subplots_adjust(left=0.3)
    try:
        assert len(_outside(fig)) == 1
    finally:
        plt.close(fig)


@pytest.mark.parametrize(
    ("device", "axis", "memory", "scaling"),
    [
        ("gpu", "all GPUs (", "peak memory per device, GiB", ("GPUs", "vs GPU count")),
        (
            "cpu",
            "all processes (",
            "peak memory per process, GiB",
            ("processes", "vs process count"),
        ),
    ],
)
def test_axes_name_what_num_gpus_counts(tmp_path, device, axis, memory, scaling) -> None:
    root = tmp_path / "results"
    write_run(root, "a.g1", device=device, tps=1000.0)
    write_run(root, "a.g2", device=device, num_gpus=2, tps=1800.0)
    report = build_report(root, CostSettings())
    throughput = plots.throughput_figure(report.cells)
    assert axis in throughput.axes[0].get_xlabel()
    assert plots.memory_figure(report.cells).axes[0].get_xlabel() == memory
    figure = plots.scaling_figure(report.scaling)
    label, title = figure.axes[0].get_xlabel(), figure.axes[0].get_title()
    plt.close("all")
    assert label == scaling[0] and scaling[1] in title
