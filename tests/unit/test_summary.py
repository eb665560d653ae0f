"""raw_summary.csv rows: the plan, the parent's outcome and the child's figures joined;
summary.md's tables of trainers and tasks."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from fakeruns import write_run

from orchestrator.executors.console import Progress
from orchestrator.results.markdown import summary_markdown
from orchestrator.results.report import CostSettings, build_report
from orchestrator.results.rows import build_row, to_csv

TEXT = """
scenarios:
  - name: a
    arguments: {model_name_or_path: org/m, learning_rate: 1e-4, peft_method: lora, r: 8}
"""


def test_row_of_an_ok_run(plan) -> None:
    (e,) = plan(TEXT, num_gpus=(2,), effective_batch_size=(8,)).experiments
    result = {
        "status": "ok",
        "gpu_device_name": "NVIDIA H100 80GB HBM3",
        "world_size": 2,
        "metrics": {
            "tokens_per_second_global": 2000.0,
            "tokens_per_second_per_device": 1000.0,
            "mfu": 0.41,
            "steps": 20,
        },
        "model": {"trainable_params": 10, "total_params": 100},
        "timings": {"time_to_first_step_s": 30.5},
        "data": {"cache_hit": True},
    }
    outcome = {
        "status": "ok",
        "log": "runs/x/stderr.log",
        "wall_s": 80.0,
        "memory": {"mem_nvidia_mem_reserved": 1234.5},
    }
    row = build_row(e.spec(), outcome, result)
    assert (
        row["experiment_id"] == e.experiment_id and row["status"] == "ok" and row["error"] is None
    )
    assert row["num_gpus"] == 2 and row["per_device_train_batch_size"] == 4
    assert row["tokens_per_second_global"] == 2000.0 and row["mfu"] == 0.41
    assert row["mem_nvidia_mem_reserved"] == 1234.5
    assert row["gpu_device_name"] == "NVIDIA H100 80GB HBM3"
    assert row["learning_rate"] == 1e-4 and row["r"] == 8  # every scenario argument
    assert row["peft_method"] == "lora" and row["time_to_first_step_s"] == 30.5


def test_row_of_a_run_that_left_nothing(plan) -> None:
    (e,) = plan(TEXT, num_gpus=(1,), effective_batch_size=(4,)).experiments
    row = build_row(
        e.spec(), {"status": "interrupted", "error": "not run: the run was interrupted"}, None
    )
    assert row["status"] == "interrupted" and row["error"] == "not run: the run was interrupted"
    assert row["scenario"] == "a" and row["num_gpus"] == 1
    assert row.get("tokens_per_second_global") is None


def test_csv_has_the_design_columns_first(plan) -> None:
    experiments = plan(TEXT, num_gpus=(1, 2), effective_batch_size=(4,)).experiments
    text = to_csv(
        build_row(e.spec(), {"status": "failed", "error": "boom"}, None) for e in experiments
    )
    reader = csv.DictReader(io.StringIO(text))
    columns = reader.fieldnames or []
    for name in (
        "experiment_id",
        "scenario",
        "framework_config",
        "model_name_or_path",
        "num_gpus",
        "per_device_train_batch_size",
        "gradient_accumulation_steps",
        "effective_batch_size",
        "max_seq_len",
        "peft_method",
        "torch_dtype",
        "status",
        "error",
        "repeat",
        "train_runtime",
        "train_samples_per_second",
        "train_steps_per_second",
        "train_tokens_per_second",
        "tokens_per_second_global",
        "tokens_per_second_per_device",
        "step_time_median_s",
        "step_time_cv",
        "train_loss",
        "mem_nvidia_mem_reserved",
        "mem_peak_torch_mem_alloc_in_bytes",
        "mem_torch_mem_alloc_in_bytes",
        "mem_peak_rss_bytes",
        "flops_per_token",
        "mfu",
        "cost_per_1m_tokens_usd",
        "gpu_device_name",
        "learning_rate",
    ):
        assert name in columns, name
    assert (
        columns.index("status")
        < columns.index("tokens_per_second_global")
        < columns.index("learning_rate")
    )
    assert [r["status"] for r in reader] == ["failed", "failed"]


class _Stream(io.StringIO):
    def isatty(self) -> bool:
        return False


def test_progress_without_a_terminal_is_plain_lines() -> None:
    stream = _Stream()
    progress = Progress(2, stream)
    progress.begin("a")
    progress.tick()  # no live line to redraw
    progress.finish("a", "ok", 12.34)
    progress.finish("b", "skipped", 0.0, "already ok", counted=False)
    assert stream.getvalue().splitlines() == [
        "[1/2] start a",
        "[1/2] ok          a  12.3s",
        "[2/2] skipped     b  0.0s  already ok",
    ]
    assert "\r" not in stream.getvalue()


# ---------------------------------------------------------------------------
# summary.md: trainers side by side, samples/s for the classification tasks
# ---------------------------------------------------------------------------


def _table(markdown: str, scenario: str) -> list[dict[str, str]]:
    """The rows of ``scenario``'s table in summary.md, by header."""
    lines = markdown.splitlines()
    start = lines.index(f"## {scenario}") + 2
    table = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        table.append([cell.strip() for cell in line.strip("|").split("|")])
    headers, body = table[0], table[2:]
    return [dict(zip(headers, row, strict=True)) for row in body]


def _add_figures(run: Path, **figures: float) -> None:
    result = json.loads((run / "result.json").read_text())
    result["metrics"].update(figures)
    (run / "result.json").write_text(json.dumps(result))


def test_sft_and_hf_cells_are_side_by_side(tmp_path: Path) -> None:
    root = tmp_path / "results"
    throughput = {("sft", 1): 1000.0, ("sft", 2): 1800.0, ("hf", 1): 1500.0, ("hf", 2): 2400.0}
    for (trainer, gpus), tps in throughput.items():
        write_run(
            root,
            f"{trainer}.g{gpus}",
            scenario="t",
            num_gpus=gpus,
            tps=tps,
            extra_arguments={"task": "causal-lm", "trainer": trainer},
        )
    report = build_report(root, CostSettings())
    table = _table(summary_markdown(report, root, CostSettings()), "t")
    assert [(r["trainer"], r["GPUs"], r["tokens/s"]) for r in table] == [
        ("hf", "1", "1,500"),
        ("sft", "1", "1,000"),
        ("hf", "2", "2,400"),
        ("sft", "2", "1,800"),
    ]
    assert "samples/s" not in table[0]  # a causal LM's unit is the token
    # each trainer scales against itself, never against the other
    speedup = {r["trainer"]: r["speedup"] for r in report.scaling.to_dict("records")}
    assert speedup == {"sft": 1.8, "hf": 1.6}


def test_classification_tables_show_samples_per_second(tmp_path: Path) -> None:
    root = tmp_path / "results"
    for scenario, task, samples in (
        ("bert", "seq-classification", 40.0),
        ("vit", "image-classification", 25.0),
        ("llama", "causal-lm", 3.0),
    ):
        run = write_run(
            root,
            scenario,
            scenario=scenario,
            num_gpus=2,
            extra_arguments={"task": task, "trainer": "hf"},
        )
        _add_figures(
            run, samples_per_second_global=samples, samples_per_second_per_device=samples / 2
        )
    report = build_report(root, CostSettings())
    markdown = summary_markdown(report, root, CostSettings())
    (bert,), (vit,), (llama,) = (_table(markdown, s) for s in ("bert", "vit", "llama"))
    # each table names its task's sample: sequences, images
    assert list(bert)[4:7] == ["tokens/s", "tokens/s/GPU", "sequences/s"]
    assert bert["sequences/s"] == "40"
    assert list(vit)[4:7] == ["tokens/s", "tokens/s/GPU", "images/s"] and vit["images/s"] == "25"
    assert "samples/s" not in llama and "images/s" not in llama
    assert (
        "For image-classification, samples/s counts images, and a token is an image patch"
        in markdown
    )
    assert (
        "For causal-lm, samples/s counts sequences, and a token is a real (not padding) token"
        in markdown
    )


def test_packed_runs_are_said_in_one_paragraph() -> None:
    import pandas as pd

    from orchestrator.results.markdown import packed_note

    assert packed_note(pd.DataFrame({"run_mode": ["alone", "alone"]})) == []
    assert packed_note(pd.DataFrame({"status": ["ok"]})) == []  # older tables: no column
    (line, blank) = packed_note(pd.DataFrame({"run_mode": ["packed", "alone", "packed"]}))
    assert line.startswith("**Packed**: 2 of 3 experiment(s) ran beside other jobs")
    assert "not an exclusive machine's" in line and blank == ""


def test_a_folder_of_every_task_says_each_ones_token_sample_and_counts(tmp_path: Path) -> None:
    """One cell of each declared task in one folder: each table shows its task's samples/s
    where they come first, and its own counts; the reading guide says each task's token
    and sample once."""
    from orchestrator.contract import columns as registry
    from orchestrator.contract.trainers import TASK_LINES, count_column

    root = tmp_path / "results"
    for i, line in enumerate(TASK_LINES):
        run = write_run(
            root,
            f"s{i}",
            scenario=f"s{i}",
            num_gpus=1,
            extra_arguments={"task": line.name, "trainer": "hf"},
        )
        counts = {count_column(c): 100.0 + j for j, c in enumerate(line.counts)}
        _add_figures(
            run, samples_per_second_global=12.0, samples_per_second_per_device=12.0, **counts
        )
    report = build_report(root, CostSettings())
    markdown = summary_markdown(report, root, CostSettings())
    assert len(TASK_LINES) == 7
    for i, line in enumerate(TASK_LINES):
        said = f"- For {line.name}, samples/s counts {line.sample}, and a token is {line.token}."
        assert markdown.count(said) == 1
        (row,) = _table(markdown, f"s{i}")
        assert (row.get(f"{line.sample}/s") == "12") == line.samples_first, (line.name, row)
        for j, count in enumerate(line.counts):
            assert row[registry.get(count_column(count)).header] == f"{100 + j:,}", line.name
        others = {c for other in TASK_LINES if other is not line for c in other.counts}
        for count in others - set(line.counts):
            assert registry.get(count_column(count)).header not in row, (line.name, count)
