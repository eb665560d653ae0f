"""One training run: arguments, model, data, the backend's trainer, measurement, the result.

The same for every trainer backend (``trainer_entry.backends``): the backend
builds and runs the trainer, this module does everything around it.
"""

from __future__ import annotations

import gc
import os
import time
from pathlib import Path
from typing import Any

import torch

from orchestrator.contract.result import ChildResult, timestamp, write_result
from orchestrator.contract.spec import RunSpec
from trainer_entry.backends import backend_name, get_backend
from trainer_entry.backends.base import TrainerBackend
from trainer_entry.errors import SpecError
from trainer_entry.measure.hooks import StepHooks
from trainer_entry.measure.memory import MemoryCounters, memory_stages, peak_rss_bytes
from trainer_entry.measure.profile import profile_outcome, step_profiler
from trainer_entry.measure.progressfile import ProgressFile
from trainer_entry.measure.steadystop import steady_stop, with_step_cap
from trainer_entry.measure.steps import RankStats, StepRecorder
from trainer_entry.models.load import config_placement, fsdp_loading, load_model
from trainer_entry.results.finished import build_result
from trainer_entry.run.engine import (
    built_by_zero_init,
    check_devices,
    check_engine,
    configured_type,
    devices_per_process,
    engine_record,
    running_type,
    seed_before_load,
)
from trainer_entry.run.evaluate import evaluate
from trainer_entry.settings.parse import check_launch_env, parse_arguments
from trainer_entry.tasks import get_task, task_name


def distributed_env() -> tuple[int, int, int]:
    """(rank, world size, local rank) as set by ``accelerate launch``; (0, 1, 0) alone."""
    return (
        int(os.environ.get("RANK", "0")),
        int(os.environ.get("WORLD_SIZE", "1")),
        int(os.environ.get("LOCAL_RANK", "0")),
    )


def _on_gpu(spec: RunSpec) -> bool:
    if spec.device == "cpu":
        return False
    if spec.device == "gpu":
        if not torch.cuda.is_available():
            raise SpecError(
                "the spec asks for a GPU but none is visible "
                f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')!r})"
            )
        return True
    return torch.cuda.is_available()


def _gather_object(value: Any, world: int) -> list[Any]:
    """``value`` of every rank, in rank order (``[value]`` alone)."""
    if world == 1 or not torch.distributed.is_initialized():
        return [value]
    gathered: list[Any] = [None] * world
    torch.distributed.all_gather_object(gathered, value)
    return gathered


def load_backend(spec: RunSpec) -> TrainerBackend:
    """The trainer backend the spec asks for, its training stack imported."""
    return get_backend(backend_name(spec.arguments, task_name(spec.arguments)))


def run(
    spec: RunSpec,
    timings: dict[str, float],
    process_start: float,
    backend: TrainerBackend | None = None,
) -> ChildResult | None:
    """Train as the spec says; on rank 0, return the result (also written to disk).

    ``backend`` is the one the spec names (``load_backend``), given by a caller
    that imports it ahead to time the import.
    """
    rank, world, local_rank = distributed_env()
    started_at = timestamp()
    # steady state: the trainer's max_steps is the cap, the hooks stop it earlier
    spec = with_step_cap(spec)
    backend = backend or load_backend(spec)
    parsed = parse_arguments(spec, backend.argument_fields())
    check_launch_env(os.environ)
    on_gpu = _on_gpu(spec)
    if on_gpu:
        torch.cuda.set_device(local_rank)
    settings = backend.configure(spec, parsed, on_gpu=on_gpu)
    # before loading anything: a job given another number of GPUs than its cell fails now
    per_process = devices_per_process(settings.native, on_gpu=on_gpu)
    check_devices(spec.num_gpus, world, per_process, on_gpu=on_gpu)
    task = get_task(parsed.task)
    # counters at stage boundaries, on GPUs, unless measurement is off
    memory = (
        MemoryCounters(
            torch.cuda.memory_allocated,
            torch.cuda.max_memory_allocated,
            torch.cuda.reset_peak_memory_stats,
            collect=gc.collect,
        )
        if on_gpu and parsed.measure.instrumentation
        else None
    )
    fsdp, broadcast = fsdp_loading(os.environ, settings.fsdp)
    placement = config_placement(on_gpu=on_gpu, fsdp=fsdp, broadcast=broadcast, rank=rank)

    # the run's seed before the model is built, not only at the trainer's start: what
    # the framework's setup drew from the generator (DeepSpeed's does) must not change
    # a LoRA adapter's or a config: model's initial weights
    seed_before_load(settings.native)
    t = time.perf_counter()
    if memory is not None:
        memory.mark("load_begin")
    loaded = load_model(
        parsed.model,
        parsed.peft,
        task=task,
        task_kwargs=task.model_kwargs(parsed),
        search_path=spec.python_path,
        on_gpu=on_gpu,
        local_rank=local_rank,
        placement=placement,
    )
    timings["model_load_s"] = time.perf_counter() - t
    # ZeRO-3 with zero3_init_flag builds the model already in shards (deepspeed.zero.Init)
    zero_init = built_by_zero_init(loaded.model)

    t = time.perf_counter()
    data = task.prepare(
        parsed,
        loaded.tokenizer,
        Path(spec.data_dir),
        as_given=spec.no_data_processing,
        model_config=loaded.model.config,
    )
    timings["data_prep_s"] = time.perf_counter() - t

    model = loaded.model
    if settings.activation_checkpointing and parsed.peft.method is not None:
        # frozen embeddings: checkpointed blocks need an input that requires grad
        model.enable_input_require_grads()

    recorder = StepRecorder(rank, sync=torch.cuda.synchronize if on_gpu else None)
    profiler = step_profiler(spec, parsed, rank=rank, world=world, on_gpu=on_gpu)
    steady = steady_stop(spec, parsed.measure.warmup_steps_excluded, profiler, on_gpu=on_gpu)
    hooks = (
        StepHooks(
            recorder,
            memory,
            # HF's tracker measures train() from its start; a reset inside would cut its peak
            reset_peak_at_begin=spec.memory_stages != "hf-tracker",
            # rank 0 alone: the parent's progress line needs no collective
            progress=ProgressFile(
                Path(spec.progress_path),
                world_size=world,
                warmup_steps=parsed.measure.warmup_steps_excluded,
            )
            if rank == 0 and spec.progress_path
            else None,
            profiler=profiler,
            steady=steady,
        )
        if parsed.measure.instrumentation
        else None
    )
    t = time.perf_counter()
    if memory is not None:
        memory.mark("init_begin")
    trainer = backend.build(
        settings,
        model=model,
        tokenizer=loaded.tokenizer,
        task=task,
        data=data,
        parsed=parsed,
        hooks=hooks,
    )
    if memory is not None:
        memory.mark("init_end")
    timings["trainer_init_s"] = time.perf_counter() - t
    # a config naming DeepSpeed or FSDP that the launch overrode would train as something else
    engine_note = check_engine(
        configured_type(spec.accelerate_config), running_type(), on_gpu=on_gpu
    )

    output = trainer.train()
    engine = engine_record(
        model,
        devices_per_process=per_process,
        notes=(engine_note,) if engine_note else (),
    )

    stats = recorder.stats
    stats.peak_rss_bytes = peak_rss_bytes()
    if memory is not None:
        # since the reset at the start of training: training's peak, not loading's
        # (under DataParallel, the fullest of the GPUs this process drove: GPU 0 holds
        # the master copy and gathers the outputs; the others hold replicas)
        # (one device per process: this rank's own, set from LOCAL_RANK above)
        devices = (
            range(engine.devices_per_process)
            if engine.devices_per_process > 1
            else [torch.cuda.current_device()]
        )
        stats.cuda_max_allocated_bytes = max(
            int(torch.cuda.max_memory_allocated(d)) for d in devices
        )
        stats.cuda_max_reserved_bytes = max(int(torch.cuda.max_memory_reserved(d)) for d in devices)
    after_training = getattr(trainer, "after_training", None)
    if rank == 0 and after_training is not None:
        # measured after training's figures are read: none of it is training's
        parsed.notes.extend(after_training(stats, settings.gradient_accumulation_steps))
    # eval: true, on every rank, once training's figures are read (none of it is training's)
    evaluation = (
        evaluate(trainer, task=task, data=data, parsed=parsed)
        if parsed.evaluation.enabled
        else None
    )
    # one collective for all: each rank's step records, its memory stages and (profiled
    # runs only) its figures from its own trace, read back after training
    gathered = _gather_object(
        (
            stats.as_dict(),
            memory_stages(memory.readings) if memory else {},
            profiler.figures() if profiler else None,
        ),
        world,
    )
    ranks = [RankStats(**record) for record, _, _ in gathered]
    stage_memory = [stages for _, stages, _ in gathered]
    profile = profile_outcome(
        spec, profiler, [figures for _, _, figures in gathered] if profiler else []
    )
    if rank != 0:
        return None

    if stats.first_step_s is not None and stats.first_step_end_unix is not None:
        timings["first_step_s"] = stats.first_step_s
        timings["time_to_first_step_s"] = stats.first_step_end_unix - process_start
    result = build_result(
        spec=spec,
        parsed=parsed,
        settings=settings,
        task=task,
        ranks=ranks,
        loaded_info=loaded.info,
        data_meta=data.meta,
        hf_metrics=output.metrics,
        log_history=output.log_history,
        model=model,
        on_gpu=on_gpu,
        timings=timings,
        started_at=started_at,
        stage_memory=stage_memory,
        engine=engine,
        zero_init=zero_init,
        evaluation=evaluation,
        profile=profile,
        steady=steady,
    )
    write_result(Path(spec.result_path), result)
    return result
