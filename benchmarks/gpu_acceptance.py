"""The GPU acceptance run: every figure tunematrix publishes, checked against an independent one.

On one GPU with no network, in a window of minutes, in six parts, most needed first;
the table is written as each part ends, so a run cut off keeps every check that finished:

1. **Independent figures**, in a process of their own: a plain PyTorch loop of the same
   model, batch, precision and activation checkpointing (fused AdamW, clipping), the same
   loop over a plain PEFT LoRA model, and torch's ``FlopCounterMode`` on the model with
   and without non-reentrant checkpointing (eager attention: the counter cannot count
   SDPA with grouped KV heads), and the CUDA context's size.
2. **The matrix**, in one ``tunematrix run --launch family``: each trainer full and LoRA
   under DDP, FSDP, a steady-state cell, a cell sized to run out of memory and a larger
   one behind it.
3. **Fresh launches** of the cells that a shared launch ran after another
   (``--launch cell``), to hold each to its own launch.
4. **MEMORY_LOGGING=hf-tracker** on the full fine-tuning cell: what it costs.
5. **The task families** (``FAMILIES``): one cell each of seq2seq-lm (``config:t5-large``),
   masked-lm (``config:bert-base-uncased``), speech-recognition (``config:whisper-small``)
   and vision-language (``config:llava-1.5-7b``, LoRA under TRL's trainer), random weights
   on the shipped or generated data.
6. **fms-acceleration's plugins**: a LoRA cell of the predecessor's ``foak-fast-kernels``
   configuration, which either trains with the plugin active (its row names
   ``FastKernelsAccelerationPlugin``, read from the framework) or is refused before
   launch in one line (fms-acceleration not installed, its kernels not loadable); an
   ``ok`` row without the plugin fails.

Every check fails on a missing row, a status other than ``ok`` or a missing figure;
only the rows marked ``reported`` may read n/a. With ``--cpu-smoke`` (a few steps of the
tiny model on a shared CPU) the speed comparisons are shown as reported, not judged, and
the GPU-only checks are left out; everything else is judged. The checks (``checks``):

- tokens/s: full fine-tuning against the plain loop, LoRA against the plain PEFT loop
  (each >= 0.95x); sft and hf with the same tokens and FLOPs per token;
- flops_per_token and hardware_flops_per_token (recompute included, in the mode the
  counter ran) within 2% of FlopCounterMode; MFU within 5% of the counted FLOPs x the
  plain loop's tokens/s / the device's peak;
- memory: NVML's peak within 5% of torch's reserved peak plus the CUDA context (DDP and
  FSDP), torch's reserved peak within 5% of the plain loop's;
- GPU utilisation of the DDP cell >= 80%; its energy over the measured steps by NVML's
  counter within 10% of the sidecar's power samples integrated over the same window, its
  mean power per GPU above 0 and at most its enforced power limit + 5%;
- the oversized cell and the larger ``pruned`` before launch, each by its memory
  prediction (``orchestrator.running.memoryfit``), and every trained cell's torch
  peak allocated within 15% of its prediction (the folder's ``plan.csv``);
- the steady cell within 2% of the fixed-step one; FSDP's time to first step <= 2x DDP's;
- a shared launch against each cell's own: tokens/s, torch's reserved peak and NVML's
  peak within 2%, equal loss curves;
- each task family's cell ok, with tokens/s, its own count (source tokens/s, audio
  seconds/s, image tokens/s), counted FLOPs per token and per sample, a finite loss, memory and an MFU
  under 1 (their FLOPs are held to FlopCounterMode by the unit tests);
- where the wall time went: each row's phases all recorded, its training phase (the
  child's instants) equal to its step clock's steps (2% or 50 ms); a fresh cell's
  wall <= 2x its training; the family matrix's <= 1.3x its training; the whole run in
  ``--limit-s`` (360 s).

The table (``gpu_acceptance-<date>.md`` and ``.json``) goes to ``--out`` (default
``benchmarks/results``), with the device, driver, versions and the parts done. On a
machine without a GPU it says so in one line and exits 0 before importing torch.

Usage: python benchmarks/gpu_acceptance.py [--model config:llama-3.2-1b] [--batch 8]
           [--seq 2048] [--steps 20] [--keep DIR] [--out DIR] [--limit-s 360]
       python benchmarks/gpu_acceptance.py --cpu-smoke   (the plumbing on the CPU with the
           tiny model; the GPU-only checks are left out; the table goes to the work folder)

Exit code 0 when every check passed (or no GPU), 1 when one failed or could not be made.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
SHIPPED_RECORDS = REPO / "trainer_entry" / "assets" / "instructions.jsonl"
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

#: LoRA as the matrix's LoRA cells and the plain PEFT loop train it
LORA = {"r": 16, "lora_alpha": 32}
#: the parts, in the order they run
PARTS = (
    "independent figures",
    "the matrix (family launches)",
    "fresh launches",
    "hf-tracker",
    "the task families",
    "fms-acceleration plugins",
)
#: the predecessor's fused-kernels configuration (fms-acceleration's sample), for the last part
FOAK_CONFIG = (
    REPO
    / "tests"
    / "fixtures"
    / "fms_sample_configurations"
    / "foak-fast-kernels-sample-configuration.yaml"
)
#: what its framework names the plugin when it runs
FOAK_PLUGIN = "FastKernelsAccelerationPlugin"
#: one cell per task family besides causal-lm, sized for one GPU (on the CPU smoke, its
#: tiny model): name -> (model, tiny model, arguments, the count column it must have)
FAMILIES: dict[str, tuple[str, str, dict[str, Any], str | None]] = {
    "seq2seq-t5": (
        "config:t5-large",
        "tiny-t5",
        {"task": "seq2seq-lm", "max_seq_len": 512, "per_device_train_batch_size": 16},
        "source_tokens_per_second_global",
    ),
    "masked-lm-bert": (
        "config:bert-base-uncased",
        "tiny-bert",
        {"task": "masked-lm", "max_seq_len": 128, "per_device_train_batch_size": 64},
        None,
    ),
    "speech-whisper": (
        "config:whisper-small",
        "tiny-whisper",
        {"task": "speech-recognition", "max_seq_len": 128, "per_device_train_batch_size": 16},
        "audio_seconds_per_second_global",
    ),
    # TRL's trainer, LoRA: a 7B model's full fine-tuning (AdamW) needs more than one GPU
    "vision-llava": (
        "config:llava-1.5-7b",
        "tiny-vlm",
        {
            "task": "vision-language",
            "trainer": "sft",
            "peft_method": "lora",
            "target_modules": ["q_proj", "v_proj"],
            "max_seq_len": 1024,
            "per_device_train_batch_size": 8,
        },
        "image_tokens_per_second_global",
    ),
}


# ---------------------------------------------------------------------------
# Is there a GPU? (no torch: NVML, else the driver)
# ---------------------------------------------------------------------------


def gpus() -> tuple[list[str], str | None]:
    """(the GPUs' names, the driver's version): the project's own readers, which import
    no torch (a count from NVML or the driver's /proc entries, names from NVML)."""
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


def matrix_yaml(args: argparse.Namespace, dataset: Path, device: str) -> str:
    """Each trainer full and LoRA under DDP, FSDP, a steady-state cell and, on a GPU, a
    cell sized to run out of memory (no checkpointing, its own batch and length) with a
    larger one behind it: one file, one check, family launches."""
    base = {
        "model_name_or_path": args.model,
        "dataset": str(dataset),
        "max_steps": args.steps,
        "activation_checkpointing": True,
        "per_device_train_batch_size": args.batch,
        "effective_batch_size": args.batch,
        "max_seq_len": args.seq,
    }
    if device == "cpu":
        base["torch_dtype"] = "float32"
    lora = {"peft_method": "lora", **LORA}
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
        oversized = {
            "model_name_or_path": args.model,
            "dataset": str(dataset),
            "max_steps": 3,
            "activation_checkpointing": False,
            "trainer": "hf",
            "max_seq_len": args.oom_seq,
        }
        cells.append(
            scenario(
                "oversized",
                device,
                "ddp",
                oversized,
                f"    sweep:\n      effective_batch_size: [{args.oom_batch}, {2 * args.oom_batch}]\n",
            )
        )
    return frameworks_yaml() + "matrix:\n  packing: [true]\nscenarios:\n" + "".join(cells)


def families_yaml(args: argparse.Namespace, device: str) -> str:
    """One cell per task family (``FAMILIES``), under DDP, shipped or generated data,
    activation checkpointing on; full fine-tuning by ``hf`` unless the family says."""
    cells = []
    for name, (model, tiny, arguments, _) in FAMILIES.items():
        settings = {
            "model_name_or_path": tiny if device == "cpu" else model,
            "trainer": "hf",
            "max_steps": args.steps,
            "activation_checkpointing": True,
            **arguments,
        }
        if device == "cpu":
            settings.update(torch_dtype="float32", per_device_train_batch_size=2)
        settings["effective_batch_size"] = settings["per_device_train_batch_size"]
        cells.append(scenario(name, device, "ddp", settings))
    return frameworks_yaml() + "scenarios:\n" + "".join(cells)


def plugins_yaml(args: argparse.Namespace, device: str) -> str:
    """The matrix's LoRA cell under the predecessor's foak-fast-kernels configuration."""
    settings: dict[str, Any] = {
        "model_name_or_path": args.model,
        "trainer": "sft",
        "peft_method": "lora",
        **LORA,
        "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"],
        "max_steps": args.steps,
        "max_seq_len": args.seq,
        "per_device_train_batch_size": args.batch,
        "effective_batch_size": args.batch,
        "activation_checkpointing": True,
        **({"bf16": True, "torch_dtype": "bfloat16"} if device == "gpu" else {}),
    }
    return (
        "frameworks:\n  foak-fast-kernels:\n    env:\n"
        f"      ACCELERATION_FRAMEWORK_CONFIG_FILE: {json.dumps(str(FOAK_CONFIG))}\n"
        "scenarios:\n" + scenario("foak-lora", device, "foak-fast-kernels", settings)
    )


def _plugin_checks(plugins: Runs, refusal: str = "") -> list[Check]:
    """The plugin cell runs its plugin (named in an ok row) or is refused before launch,
    in a line (``refusal``: the run's last line on stderr) about its plugins."""
    name = "fms-acceleration foak-fast-kernels: its plugin runs, or the cell is refused"
    expected = f"ok with {FOAK_PLUGIN} active, or refused before launch naming fms-acceleration"
    row = plugins.one("foak-lora")
    if row is None:
        refused = plugins.returncode == 2 and not plugins.rows
        about = "fms-acceleration" in refusal
        measured = (
            f"refused before launch: {refusal[-300:]}"
            if refused
            else f"no row (exit {plugins.returncode})"
        )
        return [judged(name, measured, expected, refused and about)]
    active = str(row.get("acceleration_plugins") or "")
    status = status_of(row)
    measured = f"{status}, active plugins: {active or 'none'}"
    if status != "ok" and row.get("error"):
        measured += f" ({str(row.get('error'))[:160]})"
    out = [judged(name, measured, expected, status == "ok" and FOAK_PLUGIN in active)]
    speed = num(row, "tokens_per_second_per_device")
    if status == "ok" and speed:
        out.append(
            Check("fms-acceleration foak LoRA: tokens/s", f"{speed:,.0f}", "reported", "reported")
        )
    return out


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["HF_HUB_OFFLINE"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    return env


def tunematrix(
    work: Path, scenarios: Path, results: Path, *extra: str, stderr: Path | None = None
) -> int:
    """One ``tunematrix run`` (its tables left out: the checks read its run folders);
    ``stderr``: a file its stderr goes to as well as to this one's."""
    argv = [
        sys.executable,
        *("-m", "orchestrator", "run", "--scenarios", str(scenarios)),
        *("--results", str(results), "--no-report", *extra),
    ]
    print("$", " ".join(argv[1:]), flush=True)
    if stderr is None:
        return subprocess.run(argv, cwd=work, env=child_env(), check=False).returncode
    done = subprocess.run(
        argv, cwd=work, env=child_env(), check=False, stderr=subprocess.PIPE, text=True
    )
    sys.stderr.write(done.stderr)
    stderr.write_text(done.stderr)
    return done.returncode


# ---------------------------------------------------------------------------
# The independent figures, in a child process (torch imported there only)
# ---------------------------------------------------------------------------


def independent(args: argparse.Namespace, device: str, out: Path) -> dict[str, Any]:
    """The independent figures, measured in a process of their own; what it wrote before
    it ended (each figure is written as it is measured), with ``error`` where it failed."""
    argv = [
        sys.executable,
        __file__,
        *("--independent", str(out), "--model", args.model, "--batch", str(args.batch)),
        *("--seq", str(args.seq), "--steps", str(args.steps), "--device", device),
    ]
    print("$ plain PyTorch loops and FlopCounterMode", flush=True)
    proc = subprocess.run(argv, env=child_env(), check=False)
    figures: dict[str, Any] = json.loads(out.read_text()) if out.exists() else {}
    if proc.returncode != 0:
        figures["error"] = f"the independent measurement failed (exit {proc.returncode})"
    return figures


def measure_independently(args: argparse.Namespace) -> None:
    """The plain loops and FlopCounterMode (run by ``independent`` in its own process)."""
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
    figures: dict[str, Any] = {"versions": {"torch": torch.__version__}}
    out = Path(args.independent)

    def save(**more: Any) -> None:
        figures.update(more)
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(figures))
        os.replace(tmp, out)

    def checkpointing(model: Any) -> None:
        # the installed name: activation_checkpointing_enable after transformers 5.22;
        # non-reentrant, as both trainers set it
        enable = getattr(model, "activation_checkpointing_enable", None)
        if enable is not None:
            enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False}
            )
        model.enable_input_require_grads()

    def nvml_used() -> int | None:
        try:
            import pynvml

            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            return int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)
        except Exception:
            return None

    if on_gpu:
        before = nvml_used()
        torch.zeros(1, device=device)
        torch.cuda.synchronize()
        after = nvml_used()
        if before is not None and after is not None:
            save(cuda_context_bytes=after - before - torch.cuda.memory_reserved())

    def plain_loop(lora: bool) -> tuple[float, int | None]:
        """(tokens/s over the steps after the two warm-up ones, torch's reserved peak)."""
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").to(
            device, dtype
        )
        model.config.use_cache = False
        if lora:
            from peft import LoraConfig, get_peft_model

            # target_modules None: peft's own choice for the architecture, as the cells'
            model = get_peft_model(model, LoraConfig(**LORA, task_type="CAUSAL_LM"))
        checkpointing(model.get_base_model() if lora else model)
        model.train()
        trained = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(trained, lr=2e-5, fused=on_gpu)
        batch = torch.randint(0, config.vocab_size, (args.batch, args.seq), device=device)
        if on_gpu:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        times = []
        for _ in range(args.steps):
            if on_gpu:
                torch.cuda.synchronize()
            t = time.perf_counter()
            loss = model(input_ids=batch, labels=batch).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(trained, 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if on_gpu:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t)
        measured = sorted(times[2:])  # the same two warm-up steps the trainers leave out
        reserved = int(torch.cuda.max_memory_reserved()) if on_gpu else None
        del model, optimizer, loss
        if on_gpu:
            torch.cuda.empty_cache()
        return args.batch * args.seq / measured[len(measured) // 2], reserved

    tps, reserved = plain_loop(lora=False)
    save(plain_tokens_per_second=tps, plain_reserved_peak_bytes=reserved)
    tps, _ = plain_loop(lora=True)
    save(plain_lora_tokens_per_second=tps)

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

    save(flop_counter_per_token=count(recompute=False))
    save(flop_counter_per_token_recompute=count(recompute=True), counter_mode="non-reentrant")


# ---------------------------------------------------------------------------
# What the parts left, read through the project's own readers
# ---------------------------------------------------------------------------


@dataclass
class Runs:
    """A ``tunematrix run``'s rows (from its run folders) and each run's loss curve."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    losses: dict[str, Any] = field(default_factory=dict)
    returncode: int | None = None
    #: experiment id -> rank 0's step times (the step clock, apart from the phases' instants)
    step_times: dict[str, list[float]] = field(default_factory=dict)
    #: the scenarios the run was asked for (a missing one is a failed check)
    asked: tuple[str, ...] = ()
    #: cell id -> the peak of torch's allocation predicted before launch (plan.csv)
    predicted: dict[str, float] = field(default_factory=dict)
    #: experiment id -> each GPU's energy over the measured steps, by NVML's counter and
    #: by the sidecar's power samples integrated (the outcome's gpu_conditions_per_device)
    energies: dict[str, list[tuple[float | None, float | None]]] = field(default_factory=dict)

    @classmethod
    def read(cls, results: Path, returncode: int, asked: Iterable[str] = ()) -> Runs:
        from orchestrator.contract.outcome import read_outcome
        from orchestrator.contract.result import read_result
        from orchestrator.results.collect import rows_from_folder

        rows = rows_from_folder(results) if (results / "runs").is_dir() else []
        losses, step_times, energies = {}, {}, {}
        for row in rows:
            eid = str(row["experiment_id"])
            outcome = read_outcome(results / "runs" / eid / "outcome.json")
            per_device = (outcome.memory if outcome else {}).get("gpu_conditions_per_device")
            energies[eid] = [
                (num(d, "energy_j"), num(d, "power_samples_j")) for d in (per_device or {}).values()
            ]
            result = read_result(results / "runs" / eid / "result.json") or {}
            losses[eid] = result.get("loss_history")
            ranks = result.get("ranks") or [{}]
            step_times[eid] = list(ranks[0].get("step_times_s") or [])
        predicted: dict[str, float] = {}
        if (results / "plan.csv").is_file():
            with open(results / "plan.csv", newline="", encoding="utf-8") as f:
                for planned in csv.DictReader(f):
                    value = num(planned, "predicted_peak_bytes")
                    if value is not None:
                        predicted[str(planned.get("cell_id"))] = value
        return cls(rows, losses, returncode, step_times, tuple(asked), predicted, energies)

    def of(self, scenario: str) -> list[dict[str, Any]]:
        return [r for r in self.rows if r.get("scenario") == scenario]

    def one(self, scenario: str) -> dict[str, Any] | None:
        found = self.of(scenario)
        return found[0] if len(found) == 1 else None


def status_of(row: Mapping[str, Any] | None) -> str:
    """A row's status as the tables show it (``pruned``, ``spared``), or ``missing``."""
    from orchestrator.contract.outcome import shown

    return "missing" if row is None else shown(row.get("status"), row.get("error"))


def num(row: Mapping[str, Any] | None, key: str) -> float | None:
    if row is None or row.get(key) in (None, ""):
        return None
    try:
        return float(row[key])
    except (TypeError, ValueError):
        return None


# ---------------------------------------------------------------------------
# The checks
# ---------------------------------------------------------------------------


@dataclass
class Check:
    name: str
    measured: str
    expected: str
    #: ``pass``, ``FAIL``, or ``reported`` (shown, not judged)
    result: str


def judged(name: str, measured: str, expected: str, ok: bool | None, why: str = "") -> Check:
    """A judged check: ``ok`` None (an input missing) is a FAIL, saying what was missing."""
    if ok is None:
        return Check(name, why or measured or "missing", expected, "FAIL")
    return Check(name, measured, expected, "pass" if ok else "FAIL")


def _needs(rows: Mapping[str, Mapping[str, Any] | None], *keys: str) -> str:
    """What is missing of ``rows`` (by name) and their ``keys``: a row, an ok status or a
    figure; empty when nothing is."""
    for name, row in rows.items():
        status = status_of(row)
        if status != "ok":
            error = f": {str(row.get('error'))[:120]}" if row and row.get("error") else ""
            return f"{name}: {status}{error}"
        missing = [k for k in keys if num(row, k) is None]
        if missing:
            return f"{name}: no {', '.join(missing)}"
    return ""


def within(value: float, reference: float, tolerance: float) -> bool:
    return reference != 0 and abs(value / reference - 1) <= tolerance


def ratio_check(
    name: str,
    row_name: str,
    row: Mapping[str, Any] | None,
    key: str,
    reference: float | None,
    reference_name: str,
    tolerance: float,
    *,
    at_least: bool = False,
    unit: Callable[[float], str] = lambda v: f"{v:,.0f}",
    judge: bool = True,
) -> Check:
    """``row``'s ``key`` against ``reference``: within ``tolerance`` (``at_least``: no more
    than ``tolerance`` below it). ``judge`` False: shown as ``reported`` where both are
    there (a missing one still fails)."""
    expected = (
        f">= {1 - tolerance:.2f} x {reference_name}" if at_least else f"within {tolerance:.0%}"
    )
    missing = _needs({row_name: row}, key)
    if missing or reference is None:
        return judged(name, "", expected, None, missing or f"{reference_name}: missing")
    value = num(row, key)
    assert value is not None
    ok = value >= (1 - tolerance) * reference if at_least else within(value, reference, tolerance)
    measured = f"{unit(value)} vs {unit(reference)} ({value / reference:.3f}x)"
    if not judge:
        return Check(name, measured, f"reported ({expected} on a GPU)", "reported")
    return judged(name, measured, expected, ok)


def gib(value: float) -> str:
    return f"{value / 2**30:.2f} GiB"


def checks(
    independent: Mapping[str, Any] | None,
    matrix: Runs | None,
    fresh: Runs | None,
    tracker: Runs | None,
    families: Runs | None = None,
    plugins: tuple[Runs, str] | None = None,
    *,
    on_gpu: bool,
    wall_s: float | None = None,
    limit_s: float = 360.0,
) -> list[Check]:
    """Every check the parts done so far allow (None: a part not run yet)."""
    out: list[Check] = []
    if independent is not None:
        out += _independent_checks(independent, matrix, on_gpu)
    if matrix is not None:
        out += _matrix_checks(matrix, on_gpu, (independent or {}).get("cuda_context_bytes"))
    if fresh is not None and matrix is not None:
        out += _shared_checks(matrix, fresh, on_gpu)
    if families is not None:
        out += _family_checks(families, on_gpu)
    if plugins is not None:
        out += _plugin_checks(*plugins)
    if tracker is not None and matrix is not None:
        fixed = matrix.one("hf-full")
        tracked = tracker.one("hf-full")
        key = "tokens_per_second_per_device"
        a, b = num(tracked, key), num(fixed, key)
        out.append(
            Check(
                "MEMORY_LOGGING=hf-tracker: tokens/s cost",
                f"{1 - a / b:.1%} fewer tokens/s with it ({a:,.0f} vs {b:,.0f})"
                if a and b
                else f"n/a ({_needs({'tracked': tracked, 'hf-full': fixed}, key)})",
                "reported",
                "reported",
            )
        )
    if wall_s is not None and on_gpu:
        out.append(
            judged(
                "the whole acceptance run: wall time",
                f"{wall_s:.0f} s",
                f"<= {limit_s:.0f} s",
                wall_s <= limit_s,
            )
        )
    return out


def _family_checks(families: Runs, on_gpu: bool) -> list[Check]:
    """Each family's cell: ok, with tokens/s, its own count, FLOPs per token and per sample
    (counted), a finite loss and, on a GPU, memory and an MFU between 0 and 1."""
    out: list[Check] = []
    for name, (_, _, _, count) in FAMILIES.items():
        row = families.one(name)
        keys = [
            "tokens_per_second_per_device",
            "flops_per_token",
            "flops_per_sample",
            "loss_last",
            *([count] if count else []),
            *(["mfu", "torch_max_memory_allocated_bytes"] if on_gpu else []),
        ]
        missing = _needs({name: row}, *keys)
        ok = not missing
        if ok:
            values = {k: num(row, k) for k in keys}
            ok = all(v is not None and math.isfinite(v) and v > 0 for v in values.values())
            if on_gpu:
                ok = ok and (values["mfu"] or 0) < 1
        shown = (
            f"{status_of(row)}; {num(row, 'tokens_per_second_per_device') or 0:,.0f} tokens/s, "
            f"{num(row, 'flops_per_token') or 0:.3g} FLOPs/token"
            + (f", MFU {num(row, 'mfu') or 0:.1%}" if on_gpu else "")
        )
        out.append(
            judged(
                f"{name}: trains, counts and FLOPs",
                shown,
                "ok, every figure > 0" + (", MFU < 1" if on_gpu else ""),
                None if missing else ok,
                missing,
            )
        )
    return out


def _independent_checks(plain: Mapping[str, Any], matrix: Runs | None, on_gpu: bool) -> list[Check]:
    """The rows against the independent figures (the rows may not be there yet: then the
    independent figures are shown, as they survive a cut-off)."""
    loop, lora_loop = (
        plain.get("plain_tokens_per_second"),
        plain.get("plain_lora_tokens_per_second"),
    )
    counted, counted_hw = (
        plain.get("flop_counter_per_token"),
        plain.get("flop_counter_per_token_recompute"),
    )
    error = f" ({plain['error']})" if plain.get("error") else ""
    out = [
        judged(
            "independent: plain loop, plain PEFT loop, FlopCounterMode",
            f"{loop:,.0f} / {lora_loop:,.0f} tok/s; {counted:.4e} / {counted_hw:.4e} FLOPs/token"
            if loop and lora_loop and counted and counted_hw
            else "",
            "all four measured",
            None if not (loop and lora_loop and counted and counted_hw) else True,
            f"missing{error}: "
            + ", ".join(
                k
                for k in (
                    "plain_tokens_per_second",
                    "plain_lora_tokens_per_second",
                    "flop_counter_per_token",
                    "flop_counter_per_token_recompute",
                )
                if not plain.get(k)
            ),
        )
    ]
    if matrix is None:
        return out
    # full fine-tuning against the plain loop, LoRA against the plain PEFT loop
    for name in ("hf-full", "sft-full", "hf-lora", "sft-lora"):
        lora = name.endswith("lora")
        out.append(
            ratio_check(
                f"{name}: tokens/s",
                name,
                matrix.one(name),
                "tokens_per_second_per_device",
                lora_loop if lora else loop,
                "the plain PEFT loop" if lora else "the plain loop",
                0.05,
                at_least=True,
                judge=on_gpu,
            )
        )
    hf = matrix.one("hf-full")
    out.append(
        ratio_check(
            "flops_per_token vs FlopCounterMode",
            "hf-full",
            hf,
            "flops_per_token",
            counted,
            "FlopCounterMode",
            0.02,
            unit=lambda v: f"{v:.4e}",
        )
    )
    hardware = ratio_check(
        "hardware_flops_per_token vs FlopCounterMode (recompute)",
        "hf-full",
        hf,
        "hardware_flops_per_token",
        counted_hw,
        "FlopCounterMode",
        0.02,
        unit=lambda v: f"{v:.4e}",
    )
    mode = str((hf or {}).get("activation_checkpointing_mode") or "")
    if hardware.result == "pass" and mode != plain.get("counter_mode"):
        hardware = Check(
            hardware.name,
            f"{hardware.measured}, but the cell checkpointed {mode or 'in no recorded mode'} "
            f"and the counter {plain.get('counter_mode')}",
            hardware.expected,
            "FAIL",
        )
    out.append(hardware)
    if on_gpu:
        out += _gpu_independent_checks(plain, hf, loop, counted)
    return out


def _gpu_independent_checks(
    plain: Mapping[str, Any],
    hf: Mapping[str, Any] | None,
    loop: float | None,
    counted: float | None,
) -> list[Check]:
    from orchestrator.contract.devices import PEAK_TFLOPS

    out = []
    device = str((hf or {}).get("gpu_device_name") or "")
    peaks = PEAK_TFLOPS.get(device)
    precision = str((hf or {}).get("mfu_precision") or "bf16")
    peak = peaks.for_mode(precision) if peaks is not None else None  # type: ignore[arg-type]
    expected_mfu = counted * loop / 1e12 / peak if counted and loop and peak else None
    out.append(
        ratio_check(
            "MFU vs counted FLOPs x plain loop tokens/s / peak",
            "hf-full",
            hf,
            "mfu",
            expected_mfu,
            f"the independent MFU (peak {peak} TFLOP/s, {precision})",
            0.05,
            unit=lambda v: f"{v:.1%}",
        )
    )
    out.append(
        ratio_check(
            "torch reserved peak vs the plain loop's",
            "hf-full",
            hf,
            "torch_max_memory_reserved_bytes",
            plain.get("plain_reserved_peak_bytes"),
            "the plain loop's",
            0.05,
            unit=gib,
        )
    )
    return out


def _matrix_checks(matrix: Runs, on_gpu: bool, context: float | None) -> list[Check]:
    """The matrix's rows on their own, and against each other (``context``: the CUDA
    context's bytes, from the independent part)."""
    out: list[Check] = []
    hf, sft = matrix.one("hf-full"), matrix.one("sft-full")
    keys = ("tokens_measured", "flops_per_token")
    missing = _needs({"hf-full": hf, "sft-full": sft}, *keys)
    out.append(
        judged(
            "sft and hf: same tokens and FLOPs/token",
            "" if missing else " / ".join(f"{num(hf, k):.6g} vs {num(sft, k):.6g}" for k in keys),
            "equal",
            None if missing else all(num(hf, k) == num(sft, k) for k in keys),
            missing,
        )
    )
    out.append(
        ratio_check(
            "steady cell vs fixed steps: tokens/s",
            "steady",
            matrix.one("steady"),
            "tokens_per_second_per_device",
            num(hf, "tokens_per_second_per_device"),
            "hf-full",
            0.02,
            judge=on_gpu,
        )
    )
    for row in matrix.rows:
        if status_of(row) == "ok":
            out.append(_training_phase(row, matrix.step_times.get(str(row["experiment_id"]))))
    if not on_gpu:
        return out
    for name in ("hf-full", "fsdp-full"):
        row = matrix.one(name)
        missing = _needs(
            {name: row}, "mem_nvidia_peak_bytes_max", "torch_max_memory_reserved_bytes"
        )
        nvml, reserved = (
            num(row, "mem_nvidia_peak_bytes_max"),
            num(row, "torch_max_memory_reserved_bytes"),
        )
        out.append(
            judged(
                f"{name}: NVML peak vs torch reserved peak + CUDA context",
                f"{gib(nvml)} vs {gib(reserved + context)}"
                if nvml and reserved and context is not None
                else "",
                "within 5%",
                None
                if missing or nvml is None or reserved is None or context is None
                else within(nvml, reserved + context, 0.05),
                missing or "the CUDA context: missing",
            )
        )
    out.append(_energy_check(matrix, "hf-full"))
    missing = _needs({"hf-full": hf}, "power_mean_w", "gpu_power_limit_w")
    watts, limit = num(hf, "power_mean_w"), num(hf, "gpu_power_limit_w")
    out.append(
        judged(
            "hf-full: mean power per GPU against its enforced limit",
            f"{watts:.0f} W of {limit:.0f} W" if watts is not None and limit else "",
            "above 0, at most the limit + 5%",
            None if missing or watts is None or limit is None else 0 < watts <= 1.05 * limit,
            missing,
        )
    )
    out.append(
        ratio_check(
            "hf-full: GPU utilisation",
            "hf-full",
            hf,
            "gpu_util_mean_pct",
            80.0,
            "80%",
            0.0,
            at_least=True,
            unit=lambda v: f"{v:.0f}%",
        )
    )
    oversized = sorted(matrix.of("oversized"), key=lambda r: num(r, "effective_batch_size") or 0)
    statuses = [status_of(r) for r in oversized]
    predicted_over = all("predicted to need" in str(r.get("error") or "") for r in oversized)
    out.append(
        judged(
            "oversized cell, then the larger: pruned before launch",
            " then ".join(statuses) or "missing",
            "pruned then pruned, each by its prediction",
            statuses == ["pruned", "pruned"] and predicted_over,
        )
    )
    out += _prediction_checks(matrix)
    fsdp_row = matrix.one("fsdp-full")
    missing = _needs({"fsdp-full": fsdp_row, "hf-full": hf}, "time_to_first_step_s")
    fsdp, ddp = num(fsdp_row, "time_to_first_step_s"), num(hf, "time_to_first_step_s")
    out.append(
        judged(
            "FSDP time to first step vs DDP's",
            f"{fsdp:.1f} vs {ddp:.1f} s" if fsdp is not None and ddp is not None else "",
            "at most 2 x DDP's",
            None if missing or fsdp is None or ddp is None else fsdp <= 2 * ddp,
            missing,
        )
    )
    trained = [r for r in matrix.rows if r.get("scenario") != "oversized"]
    out.append(_wall_target("the family matrix: its wall vs its training", trained, 1.3))
    return out


def _energy_check(matrix: Runs, name: str) -> Check:
    """The energy over the measured steps by NVML's counter against the sidecar's power
    samples integrated over the same window, summed over the cell's GPUs: within 10%
    (the power reading is a 1 s average on Ampere and later, so the edges smear)."""
    row = matrix.one(name)
    title = f"{name}: energy counter vs power samples integrated"
    missing = _needs({name: row}, "energy_j")
    per_device = matrix.energies.get(str(row["experiment_id"]), []) if row else []
    if not missing and (not per_device or any(c is None or p is None for c, p in per_device)):
        missing = f"{name}: a GPU without both the counter's and the power samples' energy"
    if missing:
        return judged(title, "", "within 10%", None, missing)
    counter = sum(c or 0.0 for c, _ in per_device)
    power = sum(p or 0.0 for _, p in per_device)
    return judged(
        title,
        f"{counter:,.0f} J vs {power:,.0f} J ({counter / power:.3f}x, {len(per_device)} GPU(s))",
        "within 10%",
        within(counter, power, 0.10),
    )


def _prediction_checks(matrix: Runs) -> list[Check]:
    """Every trained cell's torch peak allocated against its prediction before launch
    (plan.csv), within 15% (the issue's bound; orchestrator.contract.gpumemory.TOLERANCE)."""
    out = []
    for row in matrix.rows:
        if row.get("scenario") == "oversized":
            continue
        name = f"{row.get('scenario')}: predicted torch peak vs measured"
        predicted = matrix.predicted.get(str(row.get("cell_id")))
        missing = _needs({str(row.get("scenario")): row}, "torch_max_memory_allocated_bytes")
        allocated = num(row, "torch_max_memory_allocated_bytes")
        out.append(
            judged(
                name,
                f"{gib(predicted)} vs {gib(allocated)} ({predicted / allocated:.3f}x)"
                if predicted and allocated
                else "",
                "within 15%",
                None
                if missing or predicted is None or allocated is None
                else within(predicted, allocated, 0.15),
                missing or "no prediction in plan.csv",
            )
        )
    return out


def _training_phase(row: Mapping[str, Any], step_times: list[float] | None) -> Check:
    """Every phase of the row's wall recorded, and its training phase (the child's
    instants at the first and last step's end, on the host's clock) equal to the step
    clock's own steps after the first (rank 0's), within 2% or 50 ms."""
    name = f"{row['scenario']}: training phase vs its step times"
    missing = _needs({str(row["scenario"]): row}, "wall_s", *_phase_columns())
    if missing or not step_times:
        return judged(name, "", "within 2% or 50 ms", None, missing or "no step times")
    phase, steps = num(row, "phase_training_s") or 0.0, sum(step_times[1:])
    return judged(
        name,
        f"{phase:.3f} vs {steps:.3f} s",
        "within 2% or 50 ms",
        abs(phase - steps) <= max(0.05, 0.02 * steps),
    )


def _phase_columns() -> tuple[str, ...]:
    from orchestrator.contract.columns import PHASE_COLUMNS

    return tuple(PHASE_COLUMNS.values())


def _wall_target(name: str, rows: Iterable[Mapping[str, Any]], most: float) -> Check:
    """Σ wall over Σ training of ``rows``: at most ``most``; every row must be ok."""
    rows = list(rows)
    missing = _needs({str(r.get("scenario")): r for r in rows}, "wall_s", "phase_training_s")
    if missing or not rows:
        return judged(name, "", f"at most {most:g}x", None, missing or "no rows")
    wall = sum(num(r, "wall_s") or 0 for r in rows)
    training = sum(num(r, "phase_training_s") or 0 for r in rows)
    return judged(
        name,
        f"{wall:.0f} s for {training:.0f} s of training ({wall / training:.2f}x)",
        f"at most {most:g}x",
        wall <= most * training,
    )


def _shared_checks(matrix: Runs, fresh: Runs, on_gpu: bool) -> list[Check]:
    """Each fresh launch against the same cell in its family's launch: within 2%. On the
    CPU (a few steps of the tiny model on a shared machine) tokens/s are shown, not judged;
    the process's peak RSS is judged."""
    out = []
    by_id = {str(r["experiment_id"]): r for r in matrix.rows}
    if on_gpu:
        judged_keys = [
            "tokens_per_second_global",
            "torch_max_memory_reserved_bytes",
            "mem_nvidia_peak_bytes_max",
        ]
    else:
        judged_keys = ["mem_peak_rss_bytes"]
    ran = {str(r.get("scenario")) for r in fresh.rows}
    for name in sorted(set(fresh.asked) - ran):
        out.append(judged(f"{name}: its own launch", "", "a row", None, f"{name}: missing"))
    if not fresh.rows and not fresh.asked:
        out.append(judged("fresh launches", "", "a row per fresh cell", None, "no rows"))
    for own in fresh.rows:
        eid = str(own["experiment_id"])
        name = str(own.get("scenario") or eid)
        shared = by_id.get(eid)
        for key in judged_keys:
            missing = _needs({f"{name} (own)": own}, key)
            out.append(
                ratio_check(
                    f"{name}: {key}, shared vs own launch",
                    f"{name} (shared)",
                    shared,
                    key,
                    None if missing else num(own, key),
                    f"its own launch{f' ({missing})' if missing else ''}",
                    0.02,
                    unit=gib if "bytes" in key else (lambda v: f"{v:,.0f}"),
                )
            )
        equal = fresh.losses.get(eid) == matrix.losses.get(eid)
        missing = _needs({f"{name} (own)": own, f"{name} (shared)": shared})
        out.append(
            judged(
                f"{name}: loss curve, shared vs own launch",
                "equal" if equal else "differ",
                "equal",
                None if missing or not fresh.losses.get(eid) else equal,
                missing or "no loss curve",
            )
        )
        shown = ["host_page_faults_per_step"] + ([] if on_gpu else ["tokens_per_second_global"])
        for key in shown:
            a, b = num(shared, key), num(own, key)
            out.append(
                Check(
                    f"{name}: {key}, shared vs own launch",
                    f"{a:,.0f} vs {b:,.0f}" if a is not None and b is not None else "n/a",
                    "reported",
                    "reported",
                )
            )
        if on_gpu:
            out.append(_wall_target(f"{name}: a fresh cell's wall vs its training", [own], 2.0))
    return out


def render(table: list[Check], header: Mapping[str, Any]) -> str:
    lines = [f"# GPU acceptance run, {header['date']}", ""]
    lines += [f"- {k}: {v}" for k, v in header.items() if k != "date"]
    lines += ["", "| check | measured | expected | result |", "|---|---|---|---|"]
    for c in table:
        lines.append(f"| {c.name} | {c.measured} | {c.expected} | {c.result} |")
    failed = sum(c.result == "FAIL" for c in table)
    lines += [
        "",
        f"{len(table)} checks: {failed} failed"
        if failed
        else f"{len(table)} checks: all passed or reported",
    ]
    return "\n".join(lines) + "\n"


def write_table(
    out: Path, stem: str, table: list[Check], header: Mapping[str, Any], extra: Any
) -> Path:
    """The table as markdown and JSON, each replaced whole (a cut-off leaves the last)."""
    out.mkdir(parents=True, exist_ok=True)
    md = out / f"{stem}.md"
    for path, text in (
        (md, render(table, header)),
        (
            out / f"{stem}.json",
            json.dumps(
                {"header": dict(header), "checks": [asdict(c) for c in table], **extra},
                indent=2,
                default=str,
            ),
        ),
    ):
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
    return md


# ---------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    on_gpu = not args.cpu_smoke
    devices, driver = gpus() if on_gpu else (["cpu"], None)
    if not devices:
        print(
            "gpu_acceptance: no GPU on this machine (NVML and the driver found none); nothing run"
        )
        return 0
    if args.cpu_smoke:
        smoke = {"model": "tiny-llama", "batch": 2, "seq": 256, "steps": 6}
        for key, value in smoke.items():
            if getattr(args, key) == DEFAULTS[key]:
                setattr(args, key, value)
    device = "gpu" if on_gpu else "cpu"
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="gpu-acceptance-"))
    work.mkdir(parents=True, exist_ok=True)
    if not args.keep:
        # kept after the run: the umask decides who reads it, not mkdtemp's 0o700
        from orchestrator.contract.layout import file_mode

        work.chmod(file_mode(executable=True))
    out = Path(args.out) if args.out else (RESULTS if on_gpu else work)
    started = time.monotonic()
    date = datetime.date.today().isoformat()
    stem = f"gpu_acceptance-{date}"
    header: dict[str, Any] = {
        "date": date,
        "device": ", ".join(devices),
        "driver": driver,
        "model": args.model,
        "batch": f"{args.batch} x {args.seq} tokens, packed, activation checkpointing, "
        f"{args.steps} steps",
        "work folder": str(work),
    }
    parts: dict[str, Any] = {}

    def done(part: str) -> None:
        index = PARTS.index(part) + 1
        header["parts done"] = f"{index} of {len(PARTS)} ({', '.join(PARTS[:index])})"
        header["wall"] = f"{time.monotonic() - started:.0f} s"
        versions = _versions(work / "matrix")
        if versions:
            header["versions"] = versions
        table = checks(
            parts.get("independent"),
            parts.get("matrix"),
            parts.get("fresh"),
            parts.get("tracker"),
            parts.get("families"),
            parts.get("plugins"),
            on_gpu=on_gpu,
            wall_s=time.monotonic() - started if index == len(PARTS) else None,
            limit_s=args.limit_s,
        )
        written = write_table(out, stem, table, header, {"independent": parts.get("independent")})
        print(f"[{index}/{len(PARTS)}] {part}: {written}", flush=True)
        parts["table"] = table

    dataset = work / "records.jsonl"
    write_dataset(dataset, 400 if args.cpu_smoke else 4000)
    (work / "matrix.yaml").write_text(matrix_yaml(args, dataset, device))

    parts["independent"] = independent(args, device, work / "independent.json")
    done(PARTS[0])

    code = tunematrix(
        work, work / "matrix.yaml", work / "matrix", "--device", device, "--launch", "family"
    )
    parts["matrix"] = Runs.read(work / "matrix", code)
    done(PARTS[1])

    # the cells a shared launch ran after another: each in a launch of its own
    later = [
        str(r["scenario"])
        for r in parts["matrix"].rows
        if (num(r, "launch_position") or 1) > 1 and r.get("scenario") not in ("steady", "oversized")
    ]
    fresh = later or ["hf-lora", "sft-lora"]
    code = tunematrix(
        work,
        work / "matrix.yaml",
        work / "fresh",
        "--device",
        device,
        "--launch",
        "cell",
        "--filter",
        ",".join(sorted(set(fresh))),
    )
    parts["fresh"] = Runs.read(work / "fresh", code, asked=sorted(set(fresh)))
    done(PARTS[2])

    code = tunematrix(
        work,
        work / "matrix.yaml",
        work / "tracker",
        "--device",
        device,
        "--launch",
        "cell",
        "--filter",
        "hf-full",
        "--memory-logging",
        "hf-tracker",
    )
    parts["tracker"] = Runs.read(work / "tracker", code)
    done(PARTS[3])

    (work / "families.yaml").write_text(families_yaml(args, device))
    code = tunematrix(work, work / "families.yaml", work / "families", "--device", device)
    parts["families"] = Runs.read(work / "families", code, asked=sorted(FAMILIES))
    done(PARTS[4])

    (work / "plugins.yaml").write_text(plugins_yaml(args, device))
    stderr = work / "plugins.stderr"
    code = tunematrix(
        work, work / "plugins.yaml", work / "plugins", "--device", device, stderr=stderr
    )
    lines = stderr.read_text(errors="replace").strip().splitlines() if stderr.is_file() else []
    parts["plugins"] = (
        Runs.read(work / "plugins", code, asked=["foak-lora"]),
        lines[-1] if lines else "",
    )
    done(PARTS[5])

    print(render(parts["table"], header))
    return 1 if any(c.result == "FAIL" for c in parts["table"]) else 0


def _versions(results: Path) -> str:
    from orchestrator.contract.result import read_result

    for path in sorted((results / "runs").glob("*/result.json")):
        versions = (read_result(path) or {}).get("versions") or {}
        if versions:
            return ", ".join(f"{k} {v}" for k, v in sorted(versions.items()))
    return ""


DEFAULTS = {"model": "config:llama-3.2-1b", "batch": 8, "seq": 2048, "steps": 20}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="example: python benchmarks/gpu_acceptance.py --keep /tmp/acceptance --out $OUT",
    )
    parser.add_argument("--model", default=DEFAULTS["model"])
    parser.add_argument(
        "--batch", type=int, default=DEFAULTS["batch"], help="per-device batch (sequences)"
    )
    parser.add_argument(
        "--seq", type=int, default=DEFAULTS["seq"], help="tokens per packed sequence"
    )
    parser.add_argument("--steps", type=int, default=DEFAULTS["steps"])
    parser.add_argument("--oom-batch", type=int, default=64, help="the oversized cell's batch")
    parser.add_argument("--oom-seq", type=int, default=4096, help="the oversized cell's length")
    parser.add_argument("--keep", metavar="DIR", help="work folder (default: a new temporary one)")
    parser.add_argument(
        "--out",
        metavar="DIR",
        help="where the table goes (default: benchmarks/results; "
        "with --cpu-smoke, the work folder)",
    )
    parser.add_argument(
        "--limit-s", type=float, default=360.0, help="the whole run's time budget (default 360)"
    )
    parser.add_argument("--cpu-smoke", action="store_true", help="the plumbing on the CPU")
    parser.add_argument("--independent", metavar="OUT", help=argparse.SUPPRESS)
    parser.add_argument("--device", default="gpu", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.independent:
        measure_independently(args)
        return 0
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
