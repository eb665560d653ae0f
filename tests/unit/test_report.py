"""The report over results folders built on disk: every table value against hand-computed figures."""

from __future__ import annotations

import csv
import io
import json
import struct
from pathlib import Path

import pandas as pd
import pytest
from fakeruns import write_run

from orchestrator.cli.app import main
from orchestrator.results.report import CostSettings, build_report, write_report

GIB = 2**30


def _folder(tmp_path: Path) -> Path:
    root = tmp_path / "results"
    # a cell run three times
    for i, (tps, step) in enumerate(((900.0, 0.50), (1000.0, 0.45), (1200.0, 0.40))):
        write_run(
            root,
            f"a.g1.r{i}",
            cell_id="a.g1",
            repeat=i,
            tps=tps,
            step_time=step,
            memory=(10 + i) * GIB,
        )
    # the same scaling series on 2 and 4 GPUs
    write_run(root, "a.g2", num_gpus=2, tps=1800.0, memory=6 * GIB)
    write_run(root, "a.g4", num_gpus=4, tps=3000.0, memory=4 * GIB)
    # another framework, one that ran out of memory, one that failed
    write_run(root, "b.g1", framework="ddp", tps=1100.0)
    write_run(
        root,
        "b.g2",
        framework="ddp",
        num_gpus=2,
        status="oom",
        error="CUDA out of memory. Tried to allocate 2 GiB",
    )
    write_run(
        root,
        "c.g1",
        scenario="lora",
        peft_method="lora",
        status="failed",
        error="target_modules ['x'] match no module",
    )
    return root


def test_cells_aggregate_repeats(tmp_path) -> None:
    report = build_report(_folder(tmp_path), CostSettings())
    assert len(report.rows) == 8 and len(report.cells) == 6
    a = report.cells.set_index("cell_id").loc["a.g1"]
    assert a["repeats"] == 3 and a["repeats_ok"] == 3 and a["status"] == "ok"
    assert a["tokens_per_second_global"] == 1000.0  # the median
    assert (
        a["tokens_per_second_global_min"] == 900.0 and a["tokens_per_second_global_max"] == 1200.0
    )
    mean = (900 + 1000 + 1200) / 3
    # the sample standard deviation (ddof=1)
    std = (((900 - mean) ** 2 + (1000 - mean) ** 2 + (1200 - mean) ** 2) / 2) ** 0.5
    assert a["tokens_per_second_global_cv"] == pytest.approx(std / mean)
    assert a["step_time_median_s"] == 0.45
    assert a["peak_memory_bytes"] == 11 * GIB  # NVML peak, median of 10, 11, 12 GiB
    oom = report.cells.set_index("cell_id").loc["b.g2"]
    assert oom["status"] == "oom" and oom["error"].startswith("CUDA out of memory")
    assert pd.isna(oom["tokens_per_second_global"])


def test_mixed_repeats_show_the_mix(tmp_path) -> None:
    root = tmp_path / "r"
    write_run(root, "x.r0", cell_id="x", repeat=0, tps=100.0)
    write_run(root, "x.r1", cell_id="x", repeat=1, status="oom", error="OOM")
    write_run(root, "x.r2", cell_id="x", repeat=2, tps=300.0)
    cell = build_report(root, CostSettings()).cells.iloc[0]
    assert cell["status"] == "ok×2 oom×1"
    assert cell["tokens_per_second_global"] == 200.0 and cell["repeats_ok"] == 2


def test_scaling_against_the_smallest_count(tmp_path) -> None:
    table = build_report(_folder(tmp_path), CostSettings()).scaling
    fsdp = table[table["framework_config"] == "fsdp"].set_index("num_gpus")
    assert fsdp.loc[1, "speedup"] == 1.0
    assert fsdp.loc[2, "speedup"] == pytest.approx(1.8)  # 1800 / 1000 (the median of the repeats)
    assert fsdp.loc[2, "scaling_efficiency"] == pytest.approx(0.9)
    assert fsdp.loc[4, "scaling_efficiency"] == pytest.approx(3.0 / 4)
    assert set(table["framework_config"]) == {"fsdp"}  # ddp has one ok count only


def test_cost_and_time_to_train(tmp_path) -> None:
    report = build_report(_folder(tmp_path), CostSettings(usd_per_gpu_hour=3.6, tokens=3.6e9))
    g2 = report.cells.set_index("cell_id").loc["a.g2"]
    # 3.6 $/GPU-h × 2 GPUs = 0.002 $/s; 1e6 tokens at 1800 tokens/s = 555.6 s
    assert g2["cost_per_1m_tokens_usd"] == pytest.approx(0.002 * 1e6 / 1800)
    assert g2["cost_per_run_usd"] == pytest.approx(0.002 * 100)  # job of 100 s
    assert g2["time_per_epoch_s"] == pytest.approx(1e6 / 1800)  # 1M tokens of data
    assert g2["cost_per_epoch_usd"] == pytest.approx(0.002 * 1e6 / 1800)
    assert g2["time_to_train_s"] == pytest.approx(3.6e9 / 1800)
    assert g2["cost_to_train_usd"] == pytest.approx(0.002 * 3.6e9 / 1800)


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def test_written_files(tmp_path) -> None:
    root = _folder(tmp_path)
    report = write_report(root, root, CostSettings(usd_per_gpu_hour=2.0))
    names = {p.relative_to(root).as_posix() for p in report.written}
    assert {"raw_summary.csv", "benchmarks.csv", "summary.md", "scaling.csv"} <= names
    for plot in ("plots/throughput.png", "plots/memory.png", "plots/scaling.png", "plots/loss.png"):
        assert plot in names
        width, height = _png_size(root / plot)
        assert width > 500 and height > 200

    bench = list(csv.DictReader((root / "benchmarks.csv").open()))
    assert len(bench) == 6
    # constant columns are dropped, keys stay even when constant
    assert "learning_rate" not in bench[0] and "model_name_or_path" in bench[0]
    assert [(r["scenario"], r["framework_config"], r["num_gpus"]) for r in bench][:4] == [
        ("lora", "fsdp", "1"),
        ("s", "ddp", "1"),
        ("s", "ddp", "2"),
        ("s", "fsdp", "1"),
    ]

    raw = list(csv.DictReader((root / "raw_summary.csv").open()))
    assert len(raw) == 8
    assert {r["status"] for r in raw} == {"ok", "oom", "failed"}

    md = (root / "summary.md").read_text()
    assert "8 experiment(s) in 6 cell(s)" in md
    # CV of 900, 1000, 1200: sample standard deviation (ddof=1) 152.8 over mean 1033.3
    assert "| org/model | fsdp | 1 | 8 × 1 | 1,000 ±14.8% | 1,000 ±14.8% | 11.00 |" in md
    assert (
        "- oom: org/model, ddp, 2 GPUs: CUDA out of memory. Tried to allocate 2 GiB (log: `runs/b.g2/stderr.log`)"
        in md
    )
    assert "- failed: org/model, fsdp, 1 GPU: target_modules ['x'] match no module" in md
    assert "| 2 | 1.80 (90%) |" in md and "| 4 | 3.00 (75%) |" in md
    assert "## Cost and time to train" in md and "At $2 per GPU-hour" in md


def test_predecessor_table_reads(tmp_path) -> None:
    path = tmp_path / "a100_80gb.csv"
    path.write_text(
        "acceleration_framework_config_file,framework_config,index,model_name_or_path,num_gpus,"
        "nvidia_mem_reserved,peak_torch_mem_alloc_in_bytes,peft_method,per_device_train_batch_size,"
        "torch_mem_alloc_in_bytes,train_loss,train_runtime,train_tokens_per_second,target_modules\n"
        ",none,0,mistralai/Mistral-7B-v0.1,1,77705.0,72971724288.0,,4,44004763136.0,0.92,177.1,2775.2,\n"
        ",none,1,mistralai/Mixtral-8x7B-Instruct-v0.1,1,81043.0,,,4,,,,,\n"
        ",none,2,mistralai/Mistral-7B-v0.1,1,29731.0,26108963328.0,lora,4,15119590912.0,0.90,136.6,3597.6,q_proj k_proj\n"
    )
    report = write_report(path, tmp_path / "out", CostSettings(), plots=False)
    rows = report.rows
    assert list(rows["status"]) == ["ok", "failed", "ok"]
    assert rows.loc[1, "error"].startswith("no metrics in the predecessor's table")
    assert rows.loc[0, "mem_nvidia_mem_reserved"] == 77705.0  # MiB, its unit kept
    assert rows.loc[0, "peak_memory_bytes"] == 72971724288.0  # HF peak, before the MiB figure
    assert list(rows["peft_method"]) == ["none", "none", "lora"]
    assert (tmp_path / "out" / "summary.md").exists()


def test_cli_report(tmp_path, capsys) -> None:
    root = _folder(tmp_path)
    assert main(["report", str(root), "--no-plots", "--tokens", "1e9"]) == 0
    out = capsys.readouterr().out
    assert "tunematrix report: 8 experiments, 6 cells — failed 1, ok 6, oom 1" in out
    assert not (root / "plots").exists()
    assert main(["report", str(tmp_path / "nope")]) == 2
    assert "not found" in capsys.readouterr().err
    assert main(["report", str(root), "--usd-per-gpu-hour", "-1"]) == 2


def test_report_does_not_import_the_training_stack(tmp_path) -> None:
    import subprocess
    import sys

    root = _folder(tmp_path)
    code = (
        "import sys\n"
        "from orchestrator.cli.app import main\n"
        f"assert main(['report', {str(root)!r}]) == 0\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers', 'peft', 'accelerate')]\n"
        "assert not bad, bad\n"
    )
    repo = Path(__file__).resolve().parents[2]
    subprocess.run([sys.executable, "-c", code], check=True, cwd=repo, capture_output=True)


def test_plan_status_for_experiments_without_folders(tmp_path) -> None:
    root = tmp_path / "r"
    write_run(root, "done")
    (root / "plan.csv").write_text(
        "experiment_id,scenario,status\ndone,s,planned\nlater,s,planned\n"
    )
    rows = build_report(root, CostSettings()).rows.set_index("experiment_id")
    assert rows.loc["done", "status"] == "ok" and rows.loc["later", "status"] == "planned"


def test_raw_summary_is_json_safe(tmp_path) -> None:
    root = tmp_path / "r"
    write_run(root, "x", extra_arguments={"target_modules": ["q_proj", "v_proj"]})
    write_report(root, root, CostSettings(), plots=False)
    row = next(csv.DictReader(io.StringIO((root / "raw_summary.csv").read_text())))
    assert json.loads(row["target_modules"]) == ["q_proj", "v_proj"]


# ---------------------------------------------------------------------------
# The predecessor's published A100 table (fms-acceleration scripts/benchmarks/refs/)
# ---------------------------------------------------------------------------

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
REFS = FIXTURES / "fms_refs_a100_80gb.csv"
REFS_MOE = FIXTURES / "fms_refs_a100_80gb_moe.csv"


def _table(md: str, heading: str) -> tuple[list[str], list[list[str]]]:
    """The header and rows of the markdown table under ``## heading``."""
    lines = md.split(f"## {heading}\n", 1)[1].lstrip("\n").split("\n\n", 1)[0].splitlines()
    cells = [[c.strip() for c in line.strip("|").split(" | ")] for line in lines]
    return cells[0], cells[2:]


def _refs_row(rows: list[list[str]], header: list[str], **match: str) -> list[str]:
    found = [r for r in rows if all(r[header.index(k)] == v for k, v in match.items())]
    assert len(found) == 1, found
    return found[0]


def test_the_hf_estimate_is_shown_apart_from_measured_throughput(tmp_path) -> None:
    report = write_report(REFS, tmp_path, CostSettings(), plots=False)
    # 124 rows, 85 of them with HF Trainer's train_tokens_per_second
    assert len(report.rows) == 124
    assert report.cells["train_tokens_per_second"].notna().sum() == 85
    # never taken for a measured figure
    assert report.cells["tokens_per_second_global"].isna().all()
    assert report.cells["tokens_per_second_per_device"].isna().all()
    bench = pd.read_csv(tmp_path / "benchmarks.csv")
    assert "tokens_per_second_global" not in bench or bench["tokens_per_second_global"].isna().all()

    md = (tmp_path / "summary.md").read_text()
    header, rows = _table(md, "(no scenario)")
    assert "HF est. tokens/s/GPU" in header
    assert "tokens/s" not in header and "tokens/s/GPU" not in header
    assert "left out: tokens/s, tokens/s/GPU, MFU %, $/1M tokens" in md
    assert "per device, padding included, estimated by HF Trainer from the first batch" in md
    # the CSV's first row: santacoder, no framework, 1 GPU, batch 4, 17188.262 tokens/s
    row = _refs_row(
        rows,
        header,
        model="bigcode/gpt_bigcode-santacoder",
        framework="none",
        GPUs="1",
        **{"batch/dev × accum": "4 × –", "learning_rate": "2e-05"},
    )
    assert row[header.index("HF est. tokens/s/GPU")] == "17,188"
    assert row[header.index("status")] == "ok"


def test_our_rows_keep_the_measured_figures_and_no_hf_column(tmp_path) -> None:
    root = _folder(tmp_path)
    write_report(root, root, CostSettings(), plots=False)
    md = (root / "summary.md").read_text()
    header, _ = _table(md, "s")
    # our fake runs carry HF's figure too (1.1 × ours); the measured one is what shows
    assert header[4:6] == ["tokens/s", "tokens/s/GPU"]
    assert "HF est." not in md


def test_epoch_is_no_configuration_column(tmp_path) -> None:
    from orchestrator.results.aggregate import scaling_keys
    from orchestrator.results.tablecolumns import config_columns

    report = write_report(REFS, tmp_path, CostSettings(), plots=False)
    assert "epoch" in report.rows.columns  # read, and kept as an output
    assert "epoch" not in config_columns(report.cells)
    assert "epoch" not in scaling_keys(report.cells)
    header, _ = _table((tmp_path / "summary.md").read_text(), "(no scenario)")
    assert "epoch" not in header
    # what does vary between the predecessor's configurations is shown
    assert {"peft_method", "learning_rate", "target_modules"} <= set(header)
    # an output of the table is aggregated as an output: the median of the finished runs
    cells = report.cells.set_index("cell_id")
    assert cells.loc["row-0", "epoch"] == 0.07


def test_failed_rows_near_the_device_memory_are_likely_oom(tmp_path, capsys) -> None:
    assert main(["report", str(REFS), "--output", str(tmp_path), "--no-plots"]) == 0
    assert "failed 39 (39 likely OOM), ok 85" in capsys.readouterr().out
    md = (tmp_path / "summary.md").read_text()
    assert "Device memory: 80 GiB, nominal for the A100 80GB (from the file name" in md
    header, rows = _table(md, "(no scenario)")
    # Mixtral, full fine-tuning on 2 GPUs at batch 2: no metrics, 80,284 MiB of 81,920
    row = _refs_row(
        rows,
        header,
        model="mistralai/Mixtral-8x7B-Instruct-v0.1",
        framework="none",
        GPUs="2",
        peft_method="none",
        **{"batch/dev × accum": "2 × –"},
    )
    assert row[header.index("status")] == "no metrics (likely OOM: 78.4 of 80 GiB)"
    assert not any(r[header.index("status")] == "oom" for r in rows)  # likely, not confirmed
    raw = pd.read_csv(tmp_path / "raw_summary.csv")
    assert set(raw["status"]) == {"ok", "failed"}
    failed = raw[raw["status"] == "failed"]
    assert failed["error"].str.endswith("(≥ 90%): likely out of memory").all()


def test_likely_oom_needs_the_device_memory(tmp_path, capsys) -> None:
    plain = tmp_path / "refs.csv"  # no device in the name
    plain.write_bytes(REFS.read_bytes())
    assert main(["report", str(plain), "--output", str(tmp_path / "a"), "--no-plots"]) == 0
    assert "failed 39, ok 85" in capsys.readouterr().out
    md = (tmp_path / "a" / "summary.md").read_text()
    assert "pass `--gpu-memory-gib`" in md
    header, rows = _table(md, "(no scenario)")
    statuses = [r[header.index("status")] for r in rows]
    assert "no metrics (memory reached 79.3 GiB; device capacity unknown)" in statuses
    assert not any("likely OOM" in s for s in statuses)

    for gib, likely in (("80", 39), ("100", 0)):
        out = tmp_path / gib
        args = ["report", str(plain), "--output", str(out), "--no-plots", "--gpu-memory-gib", gib]
        assert main(args) == 0
        assert "failed 39" + (f" ({likely} likely OOM)" if likely else ",") in (
            capsys.readouterr().out
        )
        md = (out / "summary.md").read_text()
        assert f"Device memory: {gib} GiB, given with --gpu-memory-gib" in md
    # 79.3 GiB is 79% of 100 GiB: below the threshold, a plain failure
    assert "| failed |" in (tmp_path / "100" / "summary.md").read_text()
    assert main(["report", str(plain), "--gpu-memory-gib", "0"]) == 2


def test_known_device_names() -> None:
    from orchestrator.results.capacity import known_gpu_memory

    assert known_gpu_memory("a100_80gb.csv") == (80 * GIB, "A100 80GB")
    assert known_gpu_memory("NVIDIA A100-SXM4-80GB") == (80 * GIB, "A100 80GB")
    assert known_gpu_memory("refs/a100_40gb_moe.csv") == (40 * GIB, "A100 40GB")
    assert known_gpu_memory("NVIDIA H100 80GB HBM3") == (80 * GIB, "H100 80GB")
    assert known_gpu_memory("h200-runs") == (141 * GIB, "H200")
    assert known_gpu_memory("NVIDIA H100 NVL") is None  # 94 GB: not the H100 80GB
    assert known_gpu_memory("a100.csv") is None  # 40 or 80 GB: unknown


def test_the_moe_table_reads(tmp_path) -> None:
    report = write_report(REFS_MOE, tmp_path, CostSettings(), plots=False)
    assert len(report.rows) == 41 and set(report.rows["status"]) == {"ok"}
    header, rows = _table((tmp_path / "summary.md").read_text(), "(no scenario)")
    assert "HF est. tokens/s/GPU" in header and "epoch" not in header
    # its first row: granite 3b, ep1, 1 GPU, batch 8 × 16 accumulation, 5441.37 tokens/s
    row = _refs_row(
        rows,
        header,
        model="ibm-granite/granite-3.0-3b-a800m-instruct",
        framework="moe-scattermoe-granite-ep1",
        **{"batch/dev × accum": "8 × 16"},
    )
    assert row[header.index("HF est. tokens/s/GPU")] == "5,441"


def test_a_scaling_series_is_one_table(tmp_path) -> None:
    root = _folder(tmp_path)
    write_report(root, root, CostSettings(), plots=False)
    md = (root / "summary.md").read_text()
    scaling = md.split("## Scaling", 1)[1]
    # the series' counts in one table, not one table per speedup
    assert (
        "| GPUs | fsdp |\n|---|---|\n| 1 | 1.00 (100%) |\n| 2 | 1.80 (90%) |\n| 4 | 3.00 (75%) |"
        in scaling
    )
    assert "speedup=" not in scaling and "scaling_efficiency" not in scaling


def test_benchmarks_table_keeps_the_figures_of_a_single_cell() -> None:
    """One cell has every column constant; its measured figures must not be dropped."""
    import pandas as pd

    from orchestrator.results.aggregate import benchmarks_table

    cells = pd.DataFrame(
        [
            {
                "cell_id": "c1",
                "scenario": "s",
                "status": "ok",
                "repeats": 1,
                "learning_rate": 1e-3,
                "tokens_per_second_global": 1234.5,
                "peak_memory_bytes": 2.0**30,
                "mfu": None,
            }
        ]
    )
    table = benchmarks_table(cells)
    assert table.loc[0, "tokens_per_second_global"] == 1234.5
    assert table.loc[0, "peak_memory_bytes"] == 2.0**30
    # a constant setting and a figure no cell has are still left out
    assert "learning_rate" not in table.columns and "mfu" not in table.columns


def test_price_and_device_memory_come_from_the_runs_env_json(tmp_path) -> None:
    from orchestrator.results.envfile import cost_from_env, read_env

    root = tmp_path / "results"
    write_run(root, "a", status="failed", error="boom", memory=75 * 2**30)
    assert read_env(root) is None and cost_from_env(root) is None
    (root / "env.json").write_text("{not json")
    assert read_env(root) is None and build_report(root, CostSettings()).capacity is None
    env = {
        "cost": {"usd_per_gpu_hour": 2.5},
        "gpus": {"devices": [{"name": "NVIDIA H100 80GB HBM3", "memory_bytes": 80 * 2**30}]},
    }
    (root / "env.json").write_text(json.dumps(env))
    assert cost_from_env(root) == 2.5
    report = build_report(root, CostSettings())
    assert report.capacity is not None and report.capacity.bytes == 80 * 2**30
    assert report.capacity.source == "NVIDIA H100 80GB HBM3, from env.json"
    # 75 of 80 GiB, no metrics: likely out of memory
    assert report.cells["likely_oom"].tolist() == [True]
