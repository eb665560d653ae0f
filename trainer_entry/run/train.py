"""One training run: arguments, model, data, the backend's trainer, measurement, the result.

The same for every trainer backend (``trainer_entry.backends``): the backend
builds and runs the trainer, this module does everything around it. ``run``
reads as the steps of a run, in order; each step is a function below it.
"""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from orchestrator.contract.result import ChildResult, timestamp, write_result
from orchestrator.contract.spec import RunSpec
from trainer_entry.backends import backend_name, get_backend
from trainer_entry.backends.trainer_protocol import BuiltTrainer, TrainerBackend, TrainSettings
from trainer_entry.measure.engine import (
    EngineRecord,
    built_by_zero_init,
    check_devices,
    check_engine,
    configured_type,
    devices_per_process,
    engine_record,
    running_type,
    seed_before_load,
)
from trainer_entry.measure.hooks import StepHooks
from trainer_entry.measure.hostallocator import in_force, shared_heap_note
from trainer_entry.measure.memory import (
    MemoryCounters,
    memory_stages,
    peak_rss_bytes,
    reset_peak_rss,
)
from trainer_entry.measure.profile import (
    ProfileOutcome,
    StepProfiler,
    profile_outcome,
    step_profiler,
)
from trainer_entry.measure.progressfile import ProgressFile
from trainer_entry.measure.recompute import RecomputeWatch
from trainer_entry.measure.steadystop import SteadyStop, steady_stop, with_step_cap
from trainer_entry.measure.steps import RankStats, StepRecorder
from trainer_entry.models.acceleration import Acceleration, load_acceleration, requested
from trainer_entry.models.load import LoadedModel, config_placement, fsdp_loading, load_model
from trainer_entry.results.evaluate import evaluate
from trainer_entry.results.finished import Finished, build_result
from trainer_entry.results.memoryshape import read_memory_shape
from trainer_entry.results.ownership import may_write
from trainer_entry.run.parse import check_launch_env, parse_arguments
from trainer_entry.settings.parsed import ParsedArguments
from trainer_entry.spec_errors import SpecError
from trainer_entry.tasks import get_task, task_name
from trainer_entry.tasks.task_protocol import Task, TaskData


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
    return bool(torch.cuda.is_available())


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


def between_runs() -> list[str]:
    """Free what an earlier run of this launch left (its model, optimizer and data are
    unreferenced once it returned) and reset the peaks, so a run's memory is its own.

    Returns the notes of the run that follows on what stays of the earlier runs: a heap
    they used, where glibc's dynamic mmap threshold may have moved."""
    gc.collect()
    reset_peak_rss()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
        # this rank's device only: touching the others would give each a context
        torch.cuda.reset_peak_memory_stats()
    allocator, _ = in_force()
    note = shared_heap_note(allocator, os.environ)
    return [note] if note else []


def run(
    spec: RunSpec,
    timings: dict[str, float],
    process_start: float,
    backend: TrainerBackend | None = None,
    notes: Sequence[str] = (),
) -> ChildResult | None:
    """Train as the spec says; on rank 0, return the result (also written to disk).

    ``backend`` is the one the spec names (``load_backend``), given by a caller
    that imports it ahead to time the import. ``notes``: the result's notes known
    before it starts (a later run of a shared launch: ``between_runs``'s).
    """
    started_at = timestamp()
    # steady state: the trainer's max_steps is the cap, the hooks stop it earlier
    spec = with_step_cap(spec)
    job = configure(spec, backend or load_backend(spec))
    job.parsed.notes.extend(notes)
    loaded, zero_init = load(job, timings)
    data = prepare_data(job, loaded, timings)
    measuring = instrument(job)
    trainer, engine_note = build_trainer(job, loaded, data, measuring, timings)

    output = trainer.train()
    # the end of training: its last step's (the trainer's own wrap-up after it is not
    # training); where no step was timed (instrumentation off), now
    timings["train_end_unix"] = measuring.recorder.last_step_end_unix or time.time()
    engine = engine_record(
        loaded.model,
        devices_per_process=job.per_process,
        notes=(engine_note,) if engine_note else (),
    )
    stats = read_peaks(job, measuring.recorder.stats, engine)
    after_training = getattr(trainer, "after_training", None)
    if job.rank == 0 and after_training is not None:
        # measured after training's figures are read: none of it is training's
        job.parsed.notes.extend(after_training(stats, job.settings.gradient_accumulation_steps))
    # eval: true, on every rank, once training's figures are read (none of it is training's)
    evaluation = (
        evaluate(trainer, task=job.task, data=data, parsed=job.parsed, backend=job.backend)
        if job.parsed.evaluation.enabled
        else None
    )
    ranks, stage_memory, profile = gather_ranks(job, stats, measuring)
    if job.rank != 0:
        return None

    if stats.first_step_s is not None and stats.first_step_end_unix is not None:
        timings["first_step_s"] = stats.first_step_s
        timings["time_to_first_step_s"] = stats.first_step_end_unix - process_start
        timings["first_step_unix"] = stats.first_step_end_unix
    result = build_result(
        Finished(
            spec=spec,
            parsed=job.parsed,
            settings=job.settings,
            task=job.task,
            ranks=ranks,
            loaded_info=loaded.info,
            data_meta=data.meta,
            hf_metrics=output.metrics,
            log_history=output.log_history,
            model=loaded.model,
            on_gpu=job.on_gpu,
            timings=timings,
            started_at=started_at,
            stage_memory=stage_memory,
            engine=engine,
            zero_init=zero_init,
            evaluation=evaluation,
            profile=profile,
            steady=measuring.steady,
            backend=job.backend,
            recompute=measuring.recompute,
            # what shapes the run's memory, read from the trained objects
            memory_shape=read_memory_shape(trainer, job.backend, job.parsed, loaded.model),
        )
    )
    if may_write(spec, "result.json"):
        write_result(Path(spec.result_path), result)
    return result


@dataclass(frozen=True)
class Job:
    """What a run is set to do, settled before anything loads."""

    spec: RunSpec
    backend: TrainerBackend
    parsed: ParsedArguments
    settings: TrainSettings
    task: Task
    on_gpu: bool
    #: the devices each process drives (several under DataParallel)
    per_process: int
    #: counters at stage boundaries, on GPUs, unless measurement is off
    memory: MemoryCounters | None
    rank: int
    world: int
    local_rank: int
    #: fms-acceleration's framework, where the job's environment names a configuration
    acceleration: Acceleration | None = None


def configure(spec: RunSpec, backend: TrainerBackend) -> Job:
    """The run's settings, checked before loading anything: a bad argument, or a job
    given another number of GPUs than its cell, fails now."""
    rank, world, local_rank = distributed_env()
    parsed = parse_arguments(spec, backend.argument_fields())
    check_launch_env(os.environ)
    on_gpu = _on_gpu(spec)
    if on_gpu:
        torch.cuda.set_device(local_rank)
    settings = backend.configure(spec, parsed, on_gpu=on_gpu)
    per_process = devices_per_process(settings.native, on_gpu=on_gpu)
    check_devices(spec.num_gpus, world, per_process, on_gpu=on_gpu)
    # the plugins its framework names run, or the run fails here: never the baseline
    plugins = requested(spec.env) or requested(os.environ)
    acceleration = (
        replace(load_acceleration(plugins, on_gpu=on_gpu), training_args=settings.native)
        if plugins is not None
        else None
    )
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
    return Job(
        spec=spec,
        backend=backend,
        parsed=parsed,
        settings=settings,
        task=get_task(parsed.task),
        on_gpu=on_gpu,
        per_process=per_process,
        memory=memory,
        rank=rank,
        world=world,
        local_rank=local_rank,
        acceleration=acceleration,
    )


def load(job: Job, timings: dict[str, float]) -> tuple[LoadedModel, bool]:
    """The model (with its adapters) and its tokenizer, timed (``model_load_s``), and
    whether ZeRO-3 with zero3_init_flag built it already in shards (``deepspeed.zero.Init``).
    """
    fsdp, broadcast = fsdp_loading(os.environ, job.settings.fsdp)
    placement = config_placement(on_gpu=job.on_gpu, fsdp=fsdp, broadcast=broadcast, rank=job.rank)
    # the run's seed before the model is built, not only at the trainer's start: what
    # the framework's setup drew from the generator (DeepSpeed's does) must not change
    # a LoRA adapter's or a config: model's initial weights
    seed_before_load(job.settings.native)
    t = time.perf_counter()
    if job.memory is not None:
        job.memory.mark("load_begin")
    loaded = load_model(
        job.parsed.model,
        job.parsed.peft,
        task=job.task,
        task_kwargs=job.task.model_kwargs(job.parsed),
        search_path=job.spec.python_path,
        on_gpu=job.on_gpu,
        local_rank=job.local_rank,
        placement=placement,
        acceleration=job.acceleration,
    )
    timings["model_load_s"] = time.perf_counter() - t
    timings["model_end_unix"] = time.time()
    return loaded, built_by_zero_init(loaded.model)


def prepare_data(job: Job, loaded: LoadedModel, timings: dict[str, float]) -> TaskData:
    """The task's examples, prepared with the backend's data settings (TRL truncates
    and packs itself), timed (``data_prep_s``)."""
    t = time.perf_counter()
    data = job.task.prepare(
        replace(job.parsed, data=job.backend.data_settings(job.parsed)),
        loaded.tokenizer,
        Path(job.spec.data_dir),
        as_given=job.spec.no_data_processing,
        model_config=loaded.model.config,
    )
    timings["data_prep_s"] = time.perf_counter() - t
    timings["data_end_unix"] = time.time()
    return data


@dataclass(frozen=True)
class Measuring:
    """What measures the run while it trains; ``hooks`` None: instrumentation is off."""

    recorder: StepRecorder
    profiler: StepProfiler | None
    steady: SteadyStop | None
    hooks: StepHooks | None

    @property
    def recompute(self) -> tuple[Any, str | None]:
        """(what activation checkpointing ran again in the watched step, or None; why
        it was not seen)."""
        watch = self.hooks.recompute if self.hooks else None
        if watch is not None and watch.result is not None:
            return watch.result, None
        if self.hooks is None:
            return None, "instrumentation is off"
        if watch is not None and watch.unwatched:
            return None, watch.unwatched
        return None, self.unwatched or "no training step was taken"

    #: why the first step was not watched (``torch_compile``: compiled graphs run no
    #: module hooks)
    unwatched: str | None = None


def instrument(job: Job) -> Measuring:
    """The step clock, the opt-in profiler and steady-state stop, and the hooks the
    backend calls (with the progress file, rank 0's alone: it needs no collective)."""
    spec, parsed = job.spec, job.parsed
    recorder = StepRecorder(job.rank, sync=torch.cuda.synchronize if job.on_gpu else None)
    profiler = step_profiler(spec, parsed, rank=job.rank, world=job.world, on_gpu=job.on_gpu)
    steady = steady_stop(spec, parsed.measure.warmup_steps_excluded, profiler, on_gpu=job.on_gpu)
    progress = (
        ProgressFile(
            Path(spec.progress_path),
            world_size=job.world,
            warmup_steps=parsed.measure.warmup_steps_excluded,
            may_write=lambda: may_write(spec, "progress.json"),
        )
        if job.rank == 0 and spec.progress_path
        else None
    )
    # a compiled model's forward and recompute run in compiled graphs, past module hooks
    compiled = bool(getattr(job.settings.native, "torch_compile", False))
    hooks = (
        StepHooks(
            recorder,
            job.memory,
            # HF's tracker measures train() from its start; a reset inside would cut its peak
            reset_peak_at_begin=spec.memory_stages != "hf-tracker",
            progress=progress,
            profiler=profiler,
            steady=steady,
            recompute=None if compiled else RecomputeWatch(),
        )
        if parsed.measure.instrumentation
        else None
    )
    return Measuring(
        recorder,
        profiler,
        steady,
        hooks,
        unwatched="torch_compile is on: compiled graphs run no module hooks" if compiled else None,
    )


def build_trainer(
    job: Job,
    loaded: LoadedModel,
    data: TaskData,
    measuring: Measuring,
    timings: dict[str, float],
) -> tuple[BuiltTrainer, str | None]:
    """The backend's trainer, timed (``trainer_init_s``), and a note when the launch
    overrode the framework its accelerate config names."""
    model = loaded.model
    if job.settings.activation_checkpointing and job.parsed.peft.method is not None:
        # frozen embeddings: checkpointed blocks need an input that requires grad
        model.enable_input_require_grads()
    t = time.perf_counter()
    if job.memory is not None:
        job.memory.mark("init_begin")
    trainer = job.backend.build(
        job.settings,
        model=model,
        tokenizer=loaded.tokenizer,
        task=job.task,
        data=data,
        parsed=job.parsed,
        hooks=measuring.hooks,
    )
    if job.acceleration is not None:
        # fms-acceleration's patches and callbacks, on the built model and accelerator
        for callback in job.acceleration.callbacks(
            getattr(trainer, "model", model), getattr(trainer, "accelerator", None)
        ):
            trainer.add_callback(callback)  # type: ignore[attr-defined]
    if job.memory is not None:
        job.memory.mark("init_end")
    timings["trainer_init_s"] = time.perf_counter() - t
    # a config naming DeepSpeed or FSDP that the launch overrode would train as something else
    engine_note = check_engine(
        configured_type(job.spec.accelerate_config), running_type(), on_gpu=job.on_gpu
    )
    return trainer, engine_note


def read_peaks(job: Job, stats: RankStats, engine: EngineRecord) -> RankStats:
    """``stats`` with this process's peak RSS and, on GPUs, training's memory peaks."""
    stats.peak_rss_bytes = peak_rss_bytes()
    if job.memory is None:
        return stats
    # since the reset at the start of training: training's peak, not loading's (under
    # DataParallel, the fullest of the GPUs this process drove: GPU 0 holds the master
    # copy and gathers the outputs; the others hold replicas; one device per process:
    # this rank's own, set from LOCAL_RANK)
    devices = (
        range(engine.devices_per_process)
        if engine.devices_per_process > 1
        else [torch.cuda.current_device()]
    )
    stats.cuda_max_allocated_bytes = max(int(torch.cuda.max_memory_allocated(d)) for d in devices)
    stats.cuda_max_reserved_bytes = max(int(torch.cuda.max_memory_reserved(d)) for d in devices)
    return stats


def gather_ranks(
    job: Job, stats: RankStats, measuring: Measuring
) -> tuple[list[RankStats], list[dict[str, int | None]], ProfileOutcome]:
    """Every rank's step records and memory stages, and the profile's outcome.

    One collective for all: each rank's records, its memory stages and (profiled runs
    only) its figures from its own trace, read back after training.
    """
    memory, profiler = job.memory, measuring.profiler
    gathered = _gather_object(
        (
            stats.as_dict(),
            memory_stages(memory.readings) if memory else {},
            profiler.figures() if profiler else None,
        ),
        job.world,
    )
    ranks = [RankStats(**record) for record, _, _ in gathered]
    stage_memory = [stages for _, stages, _ in gathered]
    profile = profile_outcome(
        job.spec, profiler, [figures for _, _, figures in gathered] if profiler else []
    )
    return ranks, stage_memory, profile
