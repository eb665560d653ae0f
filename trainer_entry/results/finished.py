"""The result of a finished run: every rank's records made into one ``ChildResult``."""

from __future__ import annotations

import dataclasses
import os
import platform
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch

from orchestrator.contract.result import (
    LAUNCH_ID_ENV,
    ChildMetrics,
    ChildResult,
    DataRecord,
    FlopsRecord,
    ModelRecord,
    RankRecord,
    RunTimings,
    Versions,
    timestamp,
)
from orchestrator.contract.spec import RunSpec
from orchestrator.contract.trainers import COUNT_UNITS, count_column
from trainer_entry.backends import get_backend
from trainer_entry.backends.trainer_protocol import TrainerBackend, TrainSettings
from trainer_entry.measure.counted import CountedFlops, count_flops, per_row_mean
from trainer_entry.measure.engine import EngineRecord, partitioned_flops_problem, zero3_build_note
from trainer_entry.measure.flops import (
    FlopsEstimate,
    FlopsUnavailable,
    compute_mode,
    estimate_flops,
    peak_note,
    peak_tflops,
    sequences_or_uniform,
    utilization,
)
from trainer_entry.measure.hostallocator import in_force
from trainer_entry.measure.memory import stage_memory_figures
from trainer_entry.measure.profile import ProfileOutcome
from trainer_entry.measure.recompute import Recomputed, checkpointing_mode
from trainer_entry.measure.steadystop import SteadyStop, measure_figures
from trainer_entry.measure.steps import (
    RankStats,
    fed_sequences,
    first_measured_step,
    loss_summary,
    summarize,
)
from trainer_entry.results.evaluate import EVAL_FIGURES, EvalResult, loss_trend
from trainer_entry.results.memoryshape import MemoryShape
from trainer_entry.settings import installed
from trainer_entry.settings.parsed import ParsedArguments
from trainer_entry.tasks.task_protocol import Task


def _versions() -> dict[str, str | None]:
    import accelerate
    import peft
    import transformers

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": transformers.__version__,
        "peft": peft.__version__,
        "accelerate": accelerate.__version__,
        "trl": _installed_version("trl"),
    }


def _installed_version(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None


def flops_figures(
    *,
    model: Any,
    ranks: list[RankStats],
    metrics: Mapping[str, Any],
    parsed: ParsedArguments,
    settings: TrainSettings,
    dtype: str | None,
    device_name: str | None,
    task: Task | None = None,
    backend: TrainerBackend | None = None,
    recompute: tuple[Recomputed | None, str | None] = (None, None),
) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """(metrics, the result's ``flops`` record, notes) of FLOPs per token and MFU.

    FLOPs per token come from the sequence lengths fed in the measured steps
    (the rows each rank actually fed, a short last micro-batch included); a
    figure that cannot be trusted is None, with a note saying why. ``backend``: the
    run's (default: the one ``parsed`` names), for what its FLOPs figure overstates.
    ``recompute``: what activation checkpointing ran again in the watched step, or
    None and why it was not watched; then a run without checkpointing reruns nothing,
    and one with it gets no hardware figure. ``task``: its modules that work per
    sample, not per token, are counted as such.
    """
    backend = backend or get_backend(parsed.backend)
    recomputed, unseen = recompute
    per_sample: set[int] | frozenset[int] = (
        task.per_sample_modules(model) if task is not None else frozenset()
    )
    if (
        recomputed is None
        and not settings.activation_checkpointing
        and not checkpointing_mode(model)
    ):
        # not watched, but nothing is set to recompute (neither the trainer's setting nor
        # a block of the model as it is set up)
        recomputed = Recomputed()
    if recomputed is not None:
        recomputed = recomputed.with_reruns(backend.reruns(model))
    steps = metrics.get("steps", 0)
    # the measured window's first step: after the warm-up and any profiled steps
    start = first_measured_step(metrics)
    if start is None:
        start = metrics.get("warmup_steps_excluded", 0)
    if task is not None and task.flop_dims:
        per_token, hardware, sample_flops, record, notes = counted_flops_figures(
            model, task, ranks, start, steps, asked=settings.activation_checkpointing
        )
        if hardware is not None and backend.reruns(model):
            # the count runs the model's own head; the backend's (TRL's fused LM head) runs
            # again in the backward, on the positions it learns from
            hardware = None
            notes.append(
                "no hardware_flops_per_token: the trainer's LM head runs its product again "
                "in the backward on the positions it learns from, which the count does not run"
            )
    else:
        per_token, hardware, record, notes, estimate = formula_flops_figures(
            model, ranks, parsed, start, steps, recomputed, per_sample, unseen
        )
        sample_flops = None
        if estimate is not None:
            notes += backend.flops_notes(model, estimate.model_flops_per_token, parsed)
    mode = compute_mode(dtype=dtype, mixed_precision=settings.mixed_precision, tf32=settings.tf32)
    peak = parsed.measure.peak_tflops_per_device or peak_tflops(device_name, mode)
    missing_peak = peak_note(device_name, mode, peak)
    notes += [missing_peak] if missing_peak else []
    achieved, mfu, mfu_notes = utilization(
        per_token, metrics.get("tokens_per_second_per_device"), peak
    )
    figures = {
        "flops_per_token": per_token,
        "flops_per_sample": sample_flops,
        "hardware_flops_per_token": hardware,
        "achieved_tflops_per_device": achieved,
        "peak_tflops_per_device": peak,
        "mfu": mfu,
        # which of the device's peaks MFU is against: fp8, bf16 (or fp16), tf32 or fp32
        "mfu_precision": mode,
    }
    return figures, record, notes + mfu_notes


def formula_flops_figures(
    model: Any,
    ranks: list[RankStats],
    parsed: ParsedArguments,
    start: int,
    steps: int,
    recomputed: Recomputed | None,
    per_sample: set[int] | frozenset[int],
    unseen: str | None,
) -> tuple[float | None, float | None, dict[str, Any], list[str], FlopsEstimate | None]:
    """(model and hardware FLOPs per token, the ``flops`` record, notes, the estimate) of
    the analytic formula (``trainer_entry.measure.flops``) over steps ``start`` to ``steps``."""
    fed, notes = sequences_or_uniform(
        fed_sequences(ranks, start, steps),
        packing=parsed.data.packing,
        max_seq_len=parsed.data.max_seq_len,
    )
    flops = None
    if fed is not None:
        try:
            flops = estimate_flops(model, fed, recomputed, per_sample)
        except FlopsUnavailable as exc:
            notes.append(f"no FLOPs figure: {exc}")
    if flops is not None and flops.hardware_note:
        why = f" ({unseen})" if recomputed is None and unseen else ""
        notes.append(f"no hardware_flops_per_token: {flops.hardware_note}{why}")
    record: dict[str, Any] = {
        "rows": fed.rows if fed else None,
        "real_tokens": fed.tokens if fed else None,
        # Σ r² / Σ r: keys per real token's score row, before any sliding window
        "attention_length": fed.attention_length(None) if fed else None,
    }
    if flops is None:
        return None, None, record, notes, None
    record.update(
        linear_forward=flops.linear_forward,
        linear_input_grad=flops.linear_input_grad,
        linear_weight_grad=flops.linear_weight_grad,
        attention=flops.attention,
        recompute=flops.recompute,
    )
    return flops.model_flops_per_token, flops.hardware_flops_per_token, record, notes, flops


def counted_flops_figures(
    model: Any, task: Task, ranks: list[RankStats], start: int, steps: int, *, asked: bool = False
) -> tuple[float | None, float | None, float | None, dict[str, Any], list[str]]:
    """(model and hardware FLOPs per token, model FLOPs per sample, the ``flops`` record,
    notes) of a task whose FLOPs are counted (``trainer_entry.measure.counted``), over
    the real lengths of the rows fed in steps ``start`` to ``steps``. ``asked``: the run
    asked for activation checkpointing; where no block is set up the way the count
    reproduces (transformers'), what it reran is not known: no hardware figure."""
    rows = sum(sum(r.step_rows[start:steps]) for r in ranks)
    tokens = sum(sum(r.step_tokens[start:steps]) for r in ranks)
    keys = {k for r in ranks for k in r.step_moments}
    moments = {k: sum(sum(r.step_moments.get(k, [])[start:steps]) for r in ranks) for k in keys}
    record: dict[str, Any] = {"rows": rows or None, "real_tokens": tokens or None}
    record["attention_length"] = None
    if not rows or not tokens or not set(task.flop_dims) <= keys:
        return (
            None,
            None,
            None,
            record,
            ["no FLOPs figure: the rows' lengths were not recorded (instrumentation off)"],
        )
    typical = per_row_mean(rows, moments, task.flop_dims)
    recomputes = checkpointing_mode(model)
    try:
        counted = count_flops(
            model,
            lambda lengths: task.probe_batch(model.config, lengths),
            typical,
            checkpointing=recomputes is not None,
            reentrant=recomputes == "reentrant",
            overrides=task.probe_config,
        )
    except FlopsUnavailable as exc:
        return None, None, None, record, [f"no FLOPs figure: {exc}"]
    total = CountedFlops.total(counted.model, rows, moments)
    hardware = (
        CountedFlops.total(counted.hardware, rows, moments) / tokens
        if counted.hardware is not None
        else None
    )
    notes = [f"no hardware_flops_per_token: {counted.hardware_note}"] if hardware is None else []
    if asked and recomputes is None:
        hardware = None
        notes.append(
            "no hardware_flops_per_token: activation checkpointing was asked for, but no block "
            "of the model is set up as transformers sets it (a recompute of its own, "
            "DeepSpeed's): what it ran again is not counted"
        )
    record.update(
        method="counted",
        mean_lengths=typical,
        coefficients=dict(counted.model),
        components={
            name: {
                "forward_per_sample": CountedFlops.total(coef, rows, moments) / rows,
                "forward_per_token": CountedFlops.total(coef, rows, moments) / tokens,
            }
            for name, coef in counted.components.items()
            if any(coef.values())
        },
    )
    return total / tokens, hardware, total / rows, record, notes


def checkpointing_read_back(model: Any, settings: TrainSettings) -> tuple[TrainSettings, list[str]]:
    """``settings`` with activation checkpointing as the trained model reports it.

    The setting's name changed between releases (``trainer_entry.settings.installed``), and
    the FLOPs per token count the recompute: what the row says is what the model did
    (``is_activation_checkpointing``), with a note where that is not what was asked.
    A model that does not say (a ``python:`` model's own class) keeps the setting.
    """
    did = installed.read(model, "is_activation_checkpointing")
    if not isinstance(did, bool) or did == settings.activation_checkpointing:
        return settings, []
    asked = "asked for" if settings.activation_checkpointing else "not asked for"
    done = "recomputed its activations" if did else "did not recompute its activations"
    return dataclasses.replace(settings, activation_checkpointing=did), [
        f"activation checkpointing was {asked}, but the model {done}: the row (and its "
        "FLOPs) say what the model did"
    ]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Finished:
    """What a finished run hands over to make its result: the run as set, every rank's
    records (``ranks``, ``stage_memory``), what the model, data and trainer reported.

    ``engine``: what trained (``trainer_entry.measure.engine``); its devices per process
    make the device count (``DataParallel``: one process, several GPUs), which the
    batch and the per-device figures count, not the processes. ``backend``: the
    run's (default: the one ``parsed`` names). ``recompute``: what activation
    checkpointing ran again in the watched step (``trainer_entry.measure.recompute``),
    or None and why it was not seen. ``memory_shape``: what shapes the run's memory, read
    from its trained objects (``trainer_entry.results.memoryshape``); None: not read.
    """

    spec: RunSpec
    parsed: ParsedArguments
    settings: TrainSettings
    task: Task
    ranks: list[RankStats]
    loaded_info: dict[str, Any]
    data_meta: dict[str, Any]
    hf_metrics: dict[str, Any]
    log_history: list[dict[str, Any]]
    model: Any
    on_gpu: bool
    timings: dict[str, float]
    started_at: str
    stage_memory: Sequence[Mapping[str, Any]] = ()
    engine: EngineRecord | None = None
    zero_init: bool = False
    evaluation: EvalResult | None = None
    profile: ProfileOutcome | None = None
    steady: SteadyStop | None = None
    backend: TrainerBackend | None = None
    recompute: tuple[Recomputed | None, str | None] = (None, None)
    memory_shape: MemoryShape | None = None


def build_result(run: Finished) -> ChildResult:
    """The result of a finished run (see ``Finished``)."""
    spec, parsed, settings, task, ranks = run.spec, run.parsed, run.settings, run.task, run.ranks
    model, on_gpu, engine, profile = run.model, run.on_gpu, run.engine, run.profile

    world = len(ranks)
    devices = world * (engine.devices_per_process if engine else 1)
    settings, checkpointing_notes = checkpointing_read_back(model, settings)
    profile = profile or ProfileOutcome()
    metrics, loss, measure_notes = window_figures(
        spec,
        parsed,
        ranks,
        devices=devices,
        profile=profile,
        steady=run.steady,
        log_history=run.log_history,
        evaluation=run.evaluation,
    )
    device_name = torch.cuda.get_device_name() if on_gpu else None
    dtype = run.loaded_info.get("dtype")
    flop_figures, flops_record, flops_notes = _run_flops(run, settings, metrics, device_name)
    # stage_memory: every rank's memory_stages(); the stage figures are rank 0's, as HF's were
    mem = stage_memory_figures(
        spec.memory_stages, run.hf_metrics, run.stage_memory[0] if run.stage_memory else {}
    )
    metrics.update(
        **trainer_figures(run.hf_metrics, ranks, loss),
        **flop_figures,
        **memory_figures(mem, run.stage_memory, ranks),
    )
    notes = [
        *parsed.notes,
        *checkpointing_notes,
        *flops_notes,
        *(run.evaluation.notes if run.evaluation else []),
        *profile.notes,
        *measure_notes,
        *run_notes(spec, parsed, engine, zero_init=run.zero_init, on_gpu=on_gpu),
        *(run.memory_shape.notes if run.memory_shape else ()),
    ]
    pd = settings.per_device_train_batch_size
    ga = settings.gradient_accumulation_steps
    # rank 0's process: every rank is started with the same environment
    allocator, allocator_settings = in_force()
    return ChildResult(
        experiment_id=spec.experiment_id,
        cell_id=spec.cell_id,
        scenario=spec.scenario,
        framework_config=spec.framework_config,
        repeat=spec.repeat,
        swept=spec.swept,
        status="ok",
        error=None,
        # the launch that wrote it: the parent's outcome of this launch must name it too
        launch_id=os.environ.get(LAUNCH_ID_ENV) or None,
        error_type=None,
        task=task.name,
        trainer=parsed.backend,
        sample_unit=task.sample_unit,
        model_name_or_path=parsed.model.name,
        device="gpu" if on_gpu else "cpu",
        num_gpus=devices,
        world_size=world,
        processes=world,
        distributed_type=engine.distributed_type if engine else None,
        zero_stage=engine.zero_stage if engine else None,
        params_partitioned=engine.params_partitioned if engine else None,
        per_device_train_batch_size=pd,
        gradient_accumulation_steps=ga,
        # under DataParallel each micro-batch is per_device × the GPUs of the process
        effective_batch_size=pd * ga * devices,
        # the text settings mean nothing where the task has no text (or no packing)
        max_seq_len=parsed.data.max_seq_len if task.modality != "image" else None,
        packing=parsed.data.packing if task.name == "causal-lm" else None,
        peft_method=parsed.peft.method,
        torch_dtype=dtype,
        activation_checkpointing=settings.activation_checkpointing,
        activation_checkpointing_mode=checkpointing_mode(model),
        **(run.memory_shape.fields() if run.memory_shape else {}),
        gpu_device_name=device_name,
        allocator=allocator,
        allocator_settings=allocator_settings,
        started_at=run.started_at,
        finished_at=timestamp(),
        metrics=ChildMetrics.model_validate(metrics),
        timings=RunTimings.model_validate(run.timings),
        model=ModelRecord.model_validate(run.loaded_info),
        data=DataRecord.model_validate(run.data_meta),
        flops=FlopsRecord.model_validate(flops_record),
        ranks=[RankRecord.model_validate(r.as_dict()) for r in ranks],
        hf_metrics=run.hf_metrics,
        loss_history=loss["loss_history"],
        versions=Versions.model_validate(_versions()),
        notes=notes,
        memory_stages=mem["stages"],
    )


def _run_flops(
    run: Finished, settings: TrainSettings, metrics: Mapping[str, Any], device_name: str | None
) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """The run's FLOPs figures, record and notes (``flops_figures``), with none where
    ZeRO-3 left the weights empty on this rank."""
    flop_figures, flops_record, flops_notes = flops_figures(
        model=run.model,
        ranks=run.ranks,
        metrics=metrics,
        parsed=run.parsed,
        settings=settings,
        dtype=run.loaded_info.get("dtype"),
        device_name=device_name,
        task=run.task,
        backend=run.backend,
        recompute=run.recompute,
    )
    # a counted task's FLOPs come from its config on the meta device, not the shards
    engine = run.engine
    shape_problem = (
        partitioned_flops_problem(run.model)
        if engine and engine.params_partitioned and not run.task.flop_dims
        else None
    )
    if shape_problem:
        # ZeRO-3 left these weights empty on this rank: their FLOPs would read as 0
        flop_figures.update(flops_per_token=None, hardware_flops_per_token=None, mfu=None)
        flop_figures.update(achieved_tflops_per_device=None)
        flops_notes.append(f"no FLOPs figure: {shape_problem}")
    return flop_figures, flops_record, flops_notes


def window_figures(
    spec: RunSpec,
    parsed: ParsedArguments,
    ranks: list[RankStats],
    *,
    devices: int,
    profile: ProfileOutcome,
    steady: SteadyStop | None,
    log_history: list[dict[str, Any]],
    evaluation: EvalResult | None,
) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """(metrics, the loss summary, notes) of the measured window: throughput and step
    times, how long it measured and how it stopped, the loss trend and eval's figures."""
    # the profiled steps (profile_steps) are left out of the window, like the warm-up
    metrics = summarize(
        ranks, parsed.measure.warmup_steps_excluded, devices=devices, profiled=profile.profiled
    )
    metrics.update(profile.columns())
    # the counts a task reports beside tokens: every row has each column, None where its
    # task counts no such thing
    for count in COUNT_UNITS:
        metrics.setdefault(count_column(count), None)
    # how long it measured (a fixed max_steps or steady state) and how it stopped
    measure_columns, measure_notes = measure_figures(spec, steady, metrics)
    metrics.update(measure_columns)
    loss = loss_summary(log_history)
    # the loss trend over the measured steps, and eval's figures (eval: true)
    metrics.update(loss_trend(log_history, metrics, losses=loss["loss_history"]))
    metrics.update(dict.fromkeys(EVAL_FIGURES))
    if evaluation is not None:
        metrics.update(evaluation.figures)
    return metrics, loss, measure_notes


def trainer_figures(
    hf_metrics: Mapping[str, Any], ranks: list[RankStats], loss: Mapping[str, Any]
) -> dict[str, Any]:
    """The trainer's own figures over the whole run, and the loss's first and last."""
    runtime = hf_metrics.get("train_runtime")
    rank0_padded = sum(ranks[0].step_padded_tokens)
    return {
        "train_runtime": runtime,
        "train_samples_per_second": hf_metrics.get("train_samples_per_second"),
        "train_steps_per_second": hf_metrics.get("train_steps_per_second"),
        # HF's old definition: one device's tokens, padding included, over the whole run
        "train_tokens_per_second": rank0_padded / runtime if runtime else None,
        "train_loss": hf_metrics.get("train_loss"),
        "loss_first": loss["loss_first"],
        "loss_last": loss["loss_last"],
        "loss_mean_last10pct": loss["loss_mean_last10pct"],
    }


def memory_figures(
    mem: Mapping[str, Any], stage_memory: Sequence[Mapping[str, Any]], ranks: list[RankStats]
) -> dict[str, Any]:
    """The memory figures: rank 0's stages (``mem``), and every rank's peaks, the fullest."""
    return {
        "mem_peak_torch_mem_alloc_in_bytes": mem["mem_peak_torch_mem_alloc_in_bytes"],
        "mem_torch_mem_alloc_in_bytes": mem["mem_torch_mem_alloc_in_bytes"],
        "mem_stage_source": mem["mem_stage_source"],
        "mem_load_peak_bytes": _max(m.get("mem_load_peak_bytes") for m in stage_memory),
        "torch_max_memory_allocated_bytes": _max(r.cuda_max_allocated_bytes for r in ranks),
        "torch_max_memory_reserved_bytes": _max(r.cuda_max_reserved_bytes for r in ranks),
        "mem_peak_rss_bytes": _max(r.peak_rss_bytes for r in ranks),
    }


def run_notes(
    spec: RunSpec,
    parsed: ParsedArguments,
    engine: EngineRecord | None,
    *,
    zero_init: bool,
    on_gpu: bool,
) -> list[str]:
    """The notes on what trained (the engine's) and on how memory was measured."""
    notes: list[str] = []
    if engine is not None:
        notes.extend(engine.notes)
        if engine.zero_stage == 3:
            notes.append(zero3_build_note(zero_init))
    if spec.memory_stages == "hf-tracker" and not on_gpu:
        notes.append(
            "HF's memory tracker is not run on the CPU: its polling thread would compete "
            "with training for the cores it measures"
        )
    elif spec.memory_stages == "hf-tracker" and parsed.measure.instrumentation:
        notes.append(
            "hf-tracker: torch_max_memory_* cover all of train(), model wrapping included, "
            "so HF's train stage is left as HF measures it"
        )
    return notes


def _max(values: Iterable[int | None]) -> int | None:
    present = [v for v in values if v is not None]
    return max(present) if present else None
