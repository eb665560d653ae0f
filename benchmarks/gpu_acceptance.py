"""The GPU acceptance run: every figure tunematrix publishes, checked against an independent one.

On one GPU with no network, it writes its own dataset, runs ``tunematrix run``
on a matrix of ``config:`` models (each trainer full and LoRA under DDP, FSDP,
a steady-state cell, a cell sized to run out of memory and a larger one behind
it, the default cell again under ``MEMORY_LOGGING=hf-tracker``) and,
independently, a plain PyTorch loop of the same model, batch, precision and
activation checkpointing, and torch's ``FlopCounterMode`` on the same model
(eager attention: it cannot count SDPA with grouped KV heads). It prints one
table, each check pass or fail:

- tokens/s of every trainer >= 0.95 x the plain loop's;
- flops_per_token within 2% of FlopCounterMode's count, and
  hardware_flops_per_token (recompute included) within 2% of its count with
  activation checkpointing;
- the NVML peak within 5% of torch's reserved peak plus the CUDA context;
- the oversized cell ``oom`` and the next one ``pruned``;
- the steady cell's tokens/s within 2% of the fixed-step cell's;
- what ``MEMORY_LOGGING=hf-tracker`` costs in tokens/s against the default;
- FSDP's time to first step at most 2x DDP's;
- the same matrix again with one launch per family (``--launch family``): the wall
  of running its cells against a launch per cell (reported), and per cell the
  tokens/s, torch's reserved peak and the NVML peak within 2% of its own launch's,
  and equal loss curves.

The table goes to ``benchmarks/results/gpu_acceptance-<date>.md`` (and a
``.json`` beside it) with the device, the driver and the versions. On a machine
without a GPU it says so in one line and exits 0 before importing torch.

Usage: python benchmarks/gpu_acceptance.py [--model config:llama-3.2-1b]
           [--batch 8] [--seq 2048] [--steps 20] [--keep DIR]
       python benchmarks/gpu_acceptance.py --cpu-smoke   (the plumbing on the CPU with the
           tiny model; GPU-only checks read n/a; nothing is written to benchmarks/results)

Exit code 0 when every check passed (or no GPU), 1 when one failed.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
SHIPPED_RECORDS = REPO / "trainer_entry" / "assets" / "instructions.jsonl"


# ---------------------------------------------------------------------------
# Is there a GPU? (no torch: NVML, else nvidia-smi)
# ---------------------------------------------------------------------------


def gpus() -> tuple[list[str], str | None]:
    """(the GPUs' names, the driver's version): the project's own readers, which import
    no torch (a count from NVML or the driver's /proc entries, names from NVML)."""
    sys.path.insert(0, str(REPO))
    from orchestrator.job.hardware import gpu_count
    from orchestrator.running.envinfo import nvml_gpus

    count = gpu_count()
    nvml = nvml_gpus()
    names = [d["name"] for d in nvml.get("devices", [])] or [f"GPU {i}" for i in range(count)]
    return names[:count], nvml.get("driver")


# ---------------------------------------------------------------------------
# The dataset and the matrices
# ---------------------------------------------------------------------------


def write_dataset(path: Path, records: int, seed: int = 0) -> None:
    """``records`` instruct records of 130-440 words drawn from the shipped records' words."""
    words: list[str] = []
    with SHIPPED_RECORDS.open() as f:
        for line in f:
            record = json.loads(line)
            words += " ".join(str(v) for v in record.values()).split()
    rng = random.Random(seed)
    with path.open("w") as f:
        for i in range(records):
            n = rng.randint(130, 440)
            text = rng.choices(words, k=n)
            cut = rng.randint(10, 40)
            record = {
                "instruction": f"Passage {i}: " + " ".join(text[:cut]),
                "input": "",
                "output": " ".join(text[cut:]),
            }
            f.write(json.dumps(record) + "\n")


def frameworks_yaml() -> str:
    return (
        "frameworks:\n"
        "  fsdp:\n"
        f"    accelerate_config: {json.dumps(str(REPO / 'accelerate.yaml'))}\n"
        "  ddp:\n"
        f"    accelerate_config: {json.dumps(str(REPO / 'accelerate-ddp.yaml'))}\n"
    )


def scenario(
    name: str, device: str, framework: str, arguments: dict[str, Any], extra: str = ""
) -> str:
    lines = [
        f"  - name: {name}",
        f"    device: {device}",
        f"    framework_config: [{framework}]",
        "    num_gpus: [1]",
        "    arguments:",
        *(f"      {k}: {json.dumps(v)}" for k, v in arguments.items()),
    ]
    return "\n".join(lines) + "\n" + extra


def main_matrix(args: argparse.Namespace, dataset: Path, device: str) -> str:
    """Each trainer full and LoRA under DDP, FSDP, and a steady-state cell."""
    base = {
        "model_name_or_path": args.model,
        "dataset": str(dataset),
        "max_steps": args.steps,
        "activation_checkpointing": True,
        "per_device_train_batch_size": args.batch,
    }
    if device == "cpu":
        base["torch_dtype"] = "float32"
    lora = {"peft_method": "lora", "r": 16, "lora_alpha": 32}
    cells = [
        scenario("hf-full", device, "ddp", {**base, "trainer": "hf"}),
        scenario("sft-full", device, "ddp", {**base, "trainer": "sft"}),
        scenario("hf-lora", device, "ddp", {**base, "trainer": "hf", **lora}),
        scenario("sft-lora", device, "ddp", {**base, "trainer": "sft", **lora}),
        scenario(
            "steady", device, "ddp", {**base, "trainer": "hf"}, "    measure: {until: steady}\n"
        ),
    ]
    if device == "gpu":
        cells.append(scenario("fsdp-full", device, "fsdp", {**base, "trainer": "hf"}))
    return (
        frameworks_yaml()
        + "matrix:\n"
        + f"  effective_batch_size: [{args.batch}]\n"
        + f"  max_seq_len: [{args.seq}]\n"
        + "  packing: [true]\n"
        + "scenarios:\n"
        + "".join(cells)
    )


def oom_matrix(args: argparse.Namespace, dataset: Path) -> str:
    """A cell sized to run out of memory (no checkpointing), and a larger one behind it."""
    arguments = {
        "model_name_or_path": args.model,
        "dataset": str(dataset),
        "max_steps": 3,
        "activation_checkpointing": False,
        "trainer": "hf",
    }
    big, bigger = args.oom_batch, 2 * args.oom_batch
    return (
        frameworks_yaml()
        + "matrix:\n"
        + f"  effective_batch_size: [{big}, {bigger}]\n"
        + f"  max_seq_len: [{args.oom_seq}]\n"
        + "  packing: [true]\n"
        + "scenarios:\n"
        + scenario("oversized", "gpu", "ddp", arguments)
    )


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["HF_HUB_OFFLINE"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    return env


def tunematrix(work: Path, scenarios: Path, results: Path, *extra: str) -> list[dict[str, str]]:
    """One ``tunematrix run``; its rows (raw_summary.csv)."""
    argv = [
        sys.executable,
        "-m",
        "orchestrator",
        "run",
        "--scenarios",
        str(scenarios),
        "--results",
        str(results),
        "--no-report",
        *extra,
    ]
    print("$", " ".join(argv[1:]), flush=True)
    subprocess.run(argv, cwd=work, env=child_env(), check=False)
    table = results / "raw_summary.csv"
    if not table.exists():
        return []
    with table.open() as f:
        return list(csv.DictReader(f))


# ---------------------------------------------------------------------------
# The independent figures, in a child process (torch imported there only)
# ---------------------------------------------------------------------------


def independent(args: argparse.Namespace, device: str, out: Path) -> dict[str, Any]:
    argv = [
        sys.executable,
        __file__,
        "--independent",
        str(out),
        "--model",
        args.model,
        "--batch",
        str(args.batch),
        "--seq",
        str(args.seq),
        "--steps",
        str(args.steps),
        "--device",
        device,
    ]
    print("$ plain PyTorch loop and FlopCounterMode", flush=True)
    proc = subprocess.run(argv, env=child_env(), check=False)
    if proc.returncode != 0 or not out.exists():
        return {"error": f"the independent measurement failed (exit {proc.returncode})"}
    figures: dict[str, Any] = json.loads(out.read_text())
    return figures


def measure_independently(args: argparse.Namespace) -> None:
    """The plain loop and FlopCounterMode (run by ``independent`` in its own process)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import AutoConfig, AutoModelForCausalLM

    from trainer_entry.models.load import TINY_NAME, tiny_model_path
    from trainer_entry.models.resolve import architecture_config

    on_gpu = args.device == "gpu"
    device = torch.device("cuda" if on_gpu else "cpu")
    dtype = torch.bfloat16 if on_gpu else torch.float32
    if args.model == TINY_NAME:
        config = AutoConfig.from_pretrained(tiny_model_path(TINY_NAME))
    else:
        config = AutoConfig.for_model(**architecture_config(args.model))
    figures: dict[str, Any] = {}

    def checkpointing(model: Any) -> None:
        # the installed name: activation_checkpointing_enable after transformers 5.22
        enable = getattr(model, "activation_checkpointing_enable", None)
        if enable is not None:
            enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False}
            )

    def nvml_used() -> int | None:
        try:
            import pynvml

            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            return int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)
        except Exception:
            return None

    before = nvml_used() if on_gpu else None
    if on_gpu:
        torch.zeros(1, device=device)
        torch.cuda.synchronize()
        after = nvml_used()
        if before is not None and after is not None:
            figures["cuda_context_bytes"] = after - before - torch.cuda.memory_reserved()

    # FLOPs per token, counted on one sequence with eager attention
    def count(recompute: bool) -> float:
        model = AutoModelForCausalLM.from_config(config, attn_implementation="eager").to(
            device, dtype
        )
        model.config.use_cache = False
        if recompute:
            checkpointing(model)
        model.train()
        ids = torch.randint(0, config.vocab_size, (1, args.seq), device=device)
        with FlopCounterMode(display=False) as counter:
            model(input_ids=ids, labels=ids).loss.backward()
        del model
        return counter.get_total_flops() / args.seq

    figures["flop_counter_per_token"] = count(recompute=False)
    figures["flop_counter_per_token_recompute"] = count(recompute=True)
    if on_gpu:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()

    # the plain loop: same model, batch, precision and checkpointing; fused AdamW, clipping
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").to(device, dtype)
    model.config.use_cache = False
    checkpointing(model)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5, fused=on_gpu)
    batch = torch.randint(0, config.vocab_size, (args.batch, args.seq), device=device)
    times = []
    for _ in range(args.steps):
        if on_gpu:
            torch.cuda.synchronize()
        t = time.perf_counter()
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if on_gpu:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    measured = sorted(times[2:])  # the same two warm-up steps the trainers leave out
    median = measured[len(measured) // 2]
    figures["plain_tokens_per_second"] = args.batch * args.seq / median
    if on_gpu:
        figures["plain_reserved_peak_bytes"] = int(torch.cuda.max_memory_reserved())
    figures["versions"] = {"torch": torch.__version__}
    Path(args.independent).write_text(json.dumps(figures))


# ---------------------------------------------------------------------------
# The checks
# ---------------------------------------------------------------------------


def num(row: dict[str, str] | None, key: str) -> float | None:
    if row is None or not row.get(key):
        return None
    try:
        return float(row[key])
    except ValueError:
        return None


def within(value: float | None, reference: float | None, tolerance: float) -> bool | None:
    if value is None or reference is None or reference == 0:
        return None
    return abs(value / reference - 1) <= tolerance


def checks(
    rows: dict[str, dict[str, str]],
    oom_rows: list[dict[str, str]],
    tracker: dict[str, str] | None,
    plain: dict[str, Any],
    on_gpu: bool,
) -> list[tuple[str, str, str, bool | None]]:
    """(check, measured, expected, passed: None when it could not be checked)."""
    out: list[tuple[str, str, str, bool | None]] = []
    loop = plain.get("plain_tokens_per_second")
    for name in ("hf-full", "sft-full", "hf-lora", "sft-lora"):
        row = rows.get(name)
        tps = num(row, "tokens_per_second_per_device")
        status = row.get("status") if row else "missing"
        ok = None if tps is None or loop is None else tps >= 0.95 * loop
        if name.endswith("lora") and ok is not None:
            # LoRA trains fewer weights than the full plain loop: shown, not checked
            ok = None
        shown = f"{tps:,.0f} tok/s ({status})" if tps else f"({status})"
        ref = f">= 0.95 x plain loop {loop:,.0f}" if loop else "plain loop missing"
        if name.endswith("lora"):
            ref = f"shown beside the full plain loop {loop:,.0f}" if loop else ref
        out.append((f"{name}: tokens/s", shown, ref, ok))
    hf, sft = rows.get("hf-full"), rows.get("sft-full")
    same = None
    if hf and sft:
        same = all(hf.get(k) == sft.get(k) for k in ("tokens_measured", "flops_per_token"))
    out.append(
        (
            "sft and hf: same tokens and FLOPs/token",
            f"{hf.get('tokens_measured') if hf else '-'} / {sft.get('tokens_measured') if sft else '-'}",
            "equal",
            same,
        )
    )
    fpt, counted = num(hf, "flops_per_token"), plain.get("flop_counter_per_token")
    out.append(
        (
            "flops_per_token vs FlopCounterMode",
            f"{fpt:.4e} vs {counted:.4e}" if fpt and counted else "-",
            "within 2%",
            within(fpt, counted, 0.02),
        )
    )
    hw, counted_hw = (
        num(hf, "hardware_flops_per_token"),
        plain.get("flop_counter_per_token_recompute"),
    )
    out.append(
        (
            "hardware_flops_per_token vs FlopCounterMode (recompute)",
            f"{hw:.4e} vs {counted_hw:.4e}" if hw and counted_hw else "-",
            "within 2%",
            within(hw, counted_hw, 0.02),
        )
    )
    if on_gpu:
        nvml, reserved = (
            num(hf, "mem_nvidia_peak_bytes_max"),
            num(hf, "torch_max_memory_reserved_bytes"),
        )
        context = plain.get("cuda_context_bytes")
        ref = reserved + context if reserved is not None and context is not None else None
        out.append(
            (
                "NVML peak vs torch reserved peak + CUDA context",
                f"{nvml / 2**30:.2f} vs {ref / 2**30:.2f} GiB" if nvml and ref else "-",
                "within 5%",
                within(nvml, ref, 0.05),
            )
        )
        statuses = [
            r.get("status") for r in sorted(oom_rows, key=lambda r: int(r["effective_batch_size"]))
        ]
        out.append(
            (
                "oversized cell, then the larger",
                " then ".join(map(str, statuses)) or "-",
                "oom then pruned",
                statuses == ["oom", "pruned"],
            )
        )
        fsdp = num(rows.get("fsdp-full"), "time_to_first_step_s")
        ddp = num(hf, "time_to_first_step_s")
        out.append(
            (
                "FSDP time to first step vs DDP's",
                f"{fsdp:.1f} vs {ddp:.1f} s" if fsdp and ddp else "-",
                "at most 2x",
                None if fsdp is None or ddp is None else fsdp <= 2 * ddp,
            )
        )
    steady, fixed = (
        num(rows.get("steady"), "tokens_per_second_per_device"),
        num(hf, "tokens_per_second_per_device"),
    )
    steps = rows.get("steady", {}).get("steps_measured", "-")
    out.append(
        (
            "steady cell vs fixed steps: tokens/s",
            f"{steady:,.0f} vs {fixed:,.0f} ({steps} steps measured)" if steady and fixed else "-",
            "within 2%",
            within(steady, fixed, 0.02),
        )
    )
    from orchestrator.contract.wording import fewer

    tracked = num(tracker, "tokens_per_second_per_device")
    out.append(
        (
            "MEMORY_LOGGING=hf-tracker: tokens/s cost",
            f"{fewer(fixed, tracked)} with it ({tracked:,.0f} vs {fixed:,.0f})"
            if tracked and fixed
            else "-",
            "reported",
            None,
        )
    )
    return out


def shared_checks(
    cell: dict[str, dict[str, Any]],
    family: dict[str, dict[str, Any]],
    cell_wall: float | None,
    family_wall: float | None,
) -> list[tuple[str, str, str, bool | None]]:
    """One launch per family against a launch per cell, the same matrix: per experiment
    (``bench_launch.read_runs`` records, with ``nvml_peak``) its figures within 2%."""
    out: list[tuple[str, str, str, bool | None]] = [
        (
            "the matrix: running its cells, one launch per family vs one per cell",
            f"{family_wall:.0f} vs {cell_wall:.0f} s ({family_wall / cell_wall:.2f}x)"
            if family_wall and cell_wall
            else "-",
            "reported",
            None,
        )
    ]
    for eid, fresh in sorted(cell.items()):
        shared = family.get(eid)
        name = fresh.get("scenario") or eid
        if shared is None:
            out.append((f"{name}: shared launch", "missing", "a row", False))
            continue
        for key, label in (
            ("tokens_per_second", "tokens/s"),
            ("peak", f"peak ({fresh.get('peak_name')})"),
            ("nvml_peak", "NVML peak"),
        ):
            a, b = shared.get(key), fresh.get(key)
            out.append(
                (
                    f"{name}: {label}, shared vs own launch",
                    f"{a / b:.3f}x ({a:,.0f} vs {b:,.0f})" if a and b else "-",
                    "within 2%",
                    within(a, b, 0.02),
                )
            )
        equal = fresh.get("loss_history") == shared.get("loss_history")
        out.append(
            (
                f"{name}: loss curve, shared vs own launch",
                f"{'equal' if equal else 'differ'} "
                f"(status {shared.get('status')} / {fresh.get('status')})",
                "equal",
                equal and bool(fresh.get("loss_history")),
            )
        )
    return out


def launch_records(results: Path) -> dict[str, dict[str, Any]]:
    """Per experiment of a run: ``bench_launch.read_runs``'s record, its scenario and
    NVML peak; empty when the run left no table."""
    if not (results / "raw_summary.csv").exists():
        return {}
    records: dict[str, dict[str, Any]] = _bench_launch().read_runs(results)
    with (results / "raw_summary.csv").open() as f:
        for row in csv.DictReader(f):
            record = records.get(row["experiment_id"])
            if record is not None:
                record["scenario"] = row.get("scenario")
                record["nvml_peak"] = num(row, "mem_nvidia_peak_bytes_max")
    return records


def cells_wall(results: Path) -> float | None:
    """``bench_launch.cells_wall``, None when nothing ran."""
    try:
        wall: float = _bench_launch().cells_wall(results)
    except ValueError:  # no outcomes
        return None
    return wall


def _bench_launch() -> Any:
    """``benchmarks/bench_launch.py``, whose readers of a run's folder these share."""
    import importlib

    here = str(Path(__file__).resolve().parent)
    if here not in sys.path:
        sys.path.insert(0, here)
    return importlib.import_module("bench_launch")


def render(table: list[tuple[str, str, str, bool | None]], header: dict[str, Any]) -> str:
    lines = [f"# GPU acceptance run, {header['date']}", ""]
    lines += [f"- {k}: {v}" for k, v in header.items() if k != "date"]
    lines += ["", "| check | measured | expected | result |", "|---|---|---|---|"]
    for check, measured, expected, ok in table:
        result = "n/a" if ok is None else ("pass" if ok else "FAIL")
        lines.append(f"| {check} | {measured} | {expected} | {result} |")
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> int:
    on_gpu = not args.cpu_smoke
    devices, driver = gpus() if on_gpu else (["cpu"], None)
    if not devices:
        print(
            "gpu_acceptance: no GPU on this machine (NVML and the driver found none); nothing run"
        )
        return 0
    if args.cpu_smoke:
        args.model, args.batch, args.seq, args.steps = "tiny-llama", 2, 256, 6
    device = "gpu" if on_gpu else "cpu"
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="gpu-acceptance-"))
    work.mkdir(parents=True, exist_ok=True)
    if not args.keep:
        # kept after the run: the umask decides who reads it, not mkdtemp's 0o700
        from orchestrator.contract.layout import file_mode

        work.chmod(file_mode(executable=True))
    dataset = work / "records.jsonl"
    write_dataset(dataset, 400 if args.cpu_smoke else 4000)
    started = time.perf_counter()

    (work / "main.yaml").write_text(main_matrix(args, dataset, device))
    main_rows = tunematrix(work, work / "main.yaml", work / "main", "--device", device)
    rows = {r["scenario"]: r for r in main_rows}
    tracker_rows = tunematrix(
        work,
        work / "main.yaml",
        work / "tracker",
        "--device",
        device,
        "--filter",
        "hf-full",
        "--memory-logging",
        "hf-tracker",
    )
    oom_rows: list[dict[str, str]] = []
    if on_gpu:
        (work / "oom.yaml").write_text(oom_matrix(args, dataset))
        oom_rows = tunematrix(work, work / "oom.yaml", work / "oom", "--device", device)
    # the same matrix, one launch per family: what it saves, and that it measures the same
    tunematrix(work, work / "main.yaml", work / "shared", "--device", device, "--launch", "family")
    plain = independent(args, device, work / "independent.json")

    table = checks(rows, oom_rows, tracker_rows[0] if tracker_rows else None, plain, on_gpu)
    table += shared_checks(
        launch_records(work / "main"),
        launch_records(work / "shared"),
        cells_wall(work / "main"),
        cells_wall(work / "shared"),
    )
    versions: dict[str, Any] = {}
    for result in sorted((work / "main" / "runs").glob("*/result.json")):
        versions = json.loads(result.read_text()).get("versions") or {}
        break
    header = {
        "date": datetime.date.today().isoformat(),
        "device": ", ".join(devices),
        "driver": driver,
        "model": args.model,
        "batch": f"{args.batch} x {args.seq} tokens, packed, activation checkpointing, {args.steps} steps",
        "versions": ", ".join(f"{k} {v}" for k, v in sorted(versions.items()))
        or plain.get("versions"),
        "wall": f"{time.perf_counter() - started:.0f} s",
        "work folder": str(work),
    }
    if "error" in plain:
        header["independent"] = plain["error"]
    text = render(table, header)
    print(text)
    if on_gpu:
        RESULTS.mkdir(parents=True, exist_ok=True)
        stem = RESULTS / f"gpu_acceptance-{header['date']}"
        stem.with_suffix(".md").write_text(text)
        stem.with_suffix(".json").write_text(
            json.dumps(
                {"header": header, "checks": table, "independent": plain}, indent=2, default=str
            )
        )
        print(f"written: {stem}.md")
    return 1 if any(ok is False for *_, ok in table) else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="example: python benchmarks/gpu_acceptance.py --keep /tmp/acceptance",
    )
    parser.add_argument("--model", default="config:llama-3.2-1b")
    parser.add_argument("--batch", type=int, default=8, help="per-device batch (sequences)")
    parser.add_argument("--seq", type=int, default=2048, help="tokens per packed sequence")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--oom-batch", type=int, default=64, help="the oversized cell's batch")
    parser.add_argument("--oom-seq", type=int, default=4096, help="the oversized cell's length")
    parser.add_argument("--keep", metavar="DIR", help="work folder (default: a new temporary one)")
    parser.add_argument("--cpu-smoke", action="store_true", help="the plumbing on the CPU")
    parser.add_argument("--independent", metavar="OUT", help=argparse.SUPPRESS)
    parser.add_argument("--device", default="gpu", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.independent:
        sys.path.insert(0, str(REPO))
        measure_independently(args)
        return 0
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
