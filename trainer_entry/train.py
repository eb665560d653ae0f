"""One training run: model, data, Trainer, measurement, and the result record."""

from __future__ import annotations

import gc
import os
import platform
import time
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
from transformers import Trainer, TrainerCallback, TrainingArguments
from transformers.utils import logging as hf_logging

from orchestrator.contract.result import write_result
from orchestrator.contract.spec import RunSpec
from trainer_entry.arguments import ParsedArguments, check_launch_env, parse_arguments
from trainer_entry.data.prepare import Collator, SequenceDataset, load_unprocessed, prepare
from trainer_entry.errors import SpecError
from trainer_entry.flops import (
    FlopsUnavailable,
    compute_mode,
    estimate_flops,
    peak_note,
    peak_tflops,
    sequences_or_uniform,
    sliding_windows,
    utilization,
)
from trainer_entry.measure import (
    MemoryCounters,
    RankStats,
    StepRecorder,
    fed_sequences,
    loss_summary,
    memory_stages,
    peak_rss_bytes,
    stage_memory_figures,
    summarize,
)
from trainer_entry.models.load import config_placement, fsdp_loading, load_model
from trainer_entry.progress import ProgressFile

# Loading bars would fill stderr.log with carriage-return noise.
hf_logging.disable_progress_bar()

#: Spec fields copied into the result, so a result describes its cell alone.
SPEC_FIELDS = (
    "experiment_id",
    "cell_id",
    "scenario",
    "framework_config",
    "repeat",
    "swept",
)


class _MeasureCallback(TrainerCallback):
    def __init__(
        self,
        recorder: StepRecorder,
        memory: MemoryCounters | None = None,
        *,
        reset_peak_at_begin: bool = True,
        progress: ProgressFile | None = None,
    ) -> None:
        self.recorder = recorder
        self.memory = memory
        self.reset_peak_at_begin = reset_peak_at_begin
        self.progress = progress

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.memory is not None:
            # ends the loading interval; the reset makes torch's peak after training
            # training's own, without the load and wrapping spike
            self.memory.mark("train_begin", reset=self.reset_peak_at_begin)
        if self.progress is not None:
            # before the first step's clock starts
            self.progress.begin(state.max_steps)
        self.recorder.train_begin()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.recorder.step_end()
        if self.progress is not None:
            # inside the next step's time, like everything between step ends; a write
            # (about once a second) is a small file replaced, see trainer_entry.progress
            stats = self.recorder.stats
            self.progress.step(state.global_step, stats.step_tokens[-1], stats.step_times_s[-1])

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.memory is not None:
            # no reset: run() reads the training peak after train() returns
            self.memory.mark("train_end", reset=False)
        if self.progress is not None:
            self.progress.end(state.global_step)


class BenchTrainer(Trainer):
    """A ``Trainer`` that counts the tokens of every micro-batch it trains on."""

    def __init__(self, *args: Any, recorder: StepRecorder | None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._recorder = recorder

    def training_step(
        self, model: Any, inputs: dict[str, Any], num_items_in_batch: Any = None
    ) -> Any:
        real, padded = inputs.pop("num_real_tokens", 0), inputs.pop("num_padded_tokens", 0)
        lengths = inputs.pop("real_lengths", None)
        if self._recorder is not None:
            if self._recorder.windows is None:
                # before the first batch: which sliding windows to sum r·min(r, w) for
                try:
                    self._recorder.windows = sliding_windows(self.model)
                except FlopsUnavailable:
                    self._recorder.windows = ()
            self._recorder.add_batch(real, padded, lengths)
        return super().training_step(model, inputs, num_items_in_batch)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


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


def _training_arguments(spec: RunSpec, parsed: ParsedArguments, on_gpu: bool) -> TrainingArguments:
    kwargs: dict[str, Any] = {
        "report_to": "none",
        "save_strategy": "no",
        "disable_tqdm": True,
        **parsed.training,
        "output_dir": spec.output_dir,
        "use_cpu": not on_gpu,
        # HF's memory tracker polls RSS in a busy thread for all of train(), on every
        # rank, competing with training for the GIL and a core: it runs only when
        # asked for by name, and on GPUs only (MemoryCounters give the same figures).
        "skip_memory_metrics": not (
            spec.memory_stages == "hf-tracker" and on_gpu and parsed.measure.instrumentation
        ),
        "remove_unused_columns": False,
    }
    try:
        return TrainingArguments(**kwargs)
    except (ValueError, TypeError) as exc:
        raise SpecError(f"invalid trainer arguments: {exc}") from None


def _gather_object(value: Any, world: int) -> list[Any]:
    """``value`` of every rank, in rank order (``[value]`` alone)."""
    if world == 1 or not torch.distributed.is_initialized():
        return [value]
    gathered: list[Any] = [None] * world
    torch.distributed.all_gather_object(gathered, value)
    return gathered


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
    }


def run(spec: RunSpec, timings: dict[str, float], process_start: float) -> dict[str, Any]:
    """Train as the spec says; on rank 0, return the result (also written to disk)."""
    rank, world, local_rank = distributed_env()
    started_at = _now()
    parsed = parse_arguments(spec)
    check_launch_env(os.environ)
    on_gpu = _on_gpu(spec)
    if on_gpu:
        torch.cuda.set_device(local_rank)
    training_args = _training_arguments(spec, parsed, on_gpu)
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
    fsdp, broadcast = fsdp_loading(os.environ, training_args.fsdp)
    placement = config_placement(on_gpu=on_gpu, fsdp=fsdp, broadcast=broadcast, rank=rank)

    t = time.perf_counter()
    if memory is not None:
        memory.mark("load_begin")
    loaded = load_model(
        parsed.model, parsed.peft, on_gpu=on_gpu, local_rank=local_rank, placement=placement
    )
    timings["model_load_s"] = time.perf_counter() - t

    t = time.perf_counter()
    if spec.no_data_processing:
        data = load_unprocessed(parsed.data, loaded.tokenizer)
    else:
        data = prepare(parsed.data, loaded.tokenizer, Path(spec.data_dir))
    timings["data_prep_s"] = time.perf_counter() - t

    model = loaded.model
    ckpt = bool(training_args.activation_checkpointing)
    if ckpt and parsed.peft.method is not None:
        # frozen embeddings: checkpointed blocks need an input that requires grad
        model.enable_input_require_grads()

    recorder = StepRecorder(rank, sync=torch.cuda.synchronize if on_gpu else None)
    instrumented = parsed.measure.instrumentation
    callback = _MeasureCallback(
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
    )
    t = time.perf_counter()
    if memory is not None:
        memory.mark("init_begin")
    trainer = BenchTrainer(
        model=model,
        args=training_args,
        train_dataset=SequenceDataset(data),
        data_collator=Collator(loaded.tokenizer.pad_token_id, parsed.pad_to_multiple_of),
        processing_class=loaded.tokenizer,
        callbacks=[callback] if instrumented else [],
        recorder=recorder if instrumented else None,
    )
    if memory is not None:
        memory.mark("init_end")
    timings["trainer_init_s"] = time.perf_counter() - t

    output = trainer.train()

    stats = recorder.stats
    stats.peak_rss_bytes = peak_rss_bytes()
    if memory is not None:
        # since on_train_begin's reset: training's peak, not loading's
        stats.cuda_max_allocated_bytes = int(torch.cuda.max_memory_allocated())
        stats.cuda_max_reserved_bytes = int(torch.cuda.max_memory_reserved())
    # one collective for both: each rank's step records and its memory stages
    gathered = _gather_object(
        (stats.as_dict(), memory_stages(memory.readings) if memory else {}), world
    )
    ranks = [RankStats(**record) for record, _ in gathered]
    stage_memory = [stages for _, stages in gathered]
    if rank != 0:
        return {}

    if stats.first_step_s is not None and stats.first_step_end_unix is not None:
        timings["first_step_s"] = stats.first_step_s
        timings["time_to_first_step_s"] = stats.first_step_end_unix - process_start
    result = build_result(
        spec=spec,
        parsed=parsed,
        training_args=training_args,
        ranks=ranks,
        loaded_info=loaded.info,
        data_meta=data.meta,
        hf_metrics=dict(output.metrics),
        log_history=trainer.state.log_history,
        model=model,
        on_gpu=on_gpu,
        timings=timings,
        started_at=started_at,
        stage_memory=stage_memory,
    )
    write_result(Path(spec.result_path), result)
    return result


def _flops_figures(
    *,
    model: Any,
    ranks: list[RankStats],
    metrics: Mapping[str, Any],
    parsed: ParsedArguments,
    training_args: TrainingArguments,
    activation_checkpointing: bool,
    dtype: str | None,
    device_name: str | None,
) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """(metrics, the result's ``flops`` record, notes) of FLOPs per token and MFU.

    FLOPs per token come from the sequence lengths fed in the measured steps
    (the rows each rank actually fed, a short last micro-batch included); a
    figure that cannot be trusted is None, with a note saying why.
    """
    warmup, steps = metrics.get("warmup_steps_excluded", 0), metrics.get("steps", 0)
    fed, notes = sequences_or_uniform(
        fed_sequences(ranks, warmup, steps),
        packing=parsed.data.packing,
        max_seq_len=parsed.data.max_seq_len,
    )
    flops = None
    if fed is not None:
        try:
            flops = estimate_flops(model, fed, activation_checkpointing)
        except FlopsUnavailable as exc:
            notes.append(f"no FLOPs figure: {exc}")
    mode = compute_mode(
        dtype=dtype,
        mixed_precision=getattr(training_args, "mixed_precision", None),
        tf32=training_args.tf32,
    )
    peak = parsed.measure.peak_tflops_per_device or peak_tflops(device_name, mode)
    missing_peak = peak_note(device_name, mode, peak)
    notes += [missing_peak] if missing_peak else []
    achieved, mfu, mfu_notes = utilization(
        flops.model_flops_per_token if flops else None,
        metrics.get("tokens_per_second_per_device"),
        peak,
    )
    figures = {
        "flops_per_token": flops.model_flops_per_token if flops else None,
        "hardware_flops_per_token": flops.hardware_flops_per_token if flops else None,
        "achieved_tflops_per_device": achieved,
        "peak_tflops_per_device": peak,
        "mfu": mfu,
        # which of the device's peaks MFU is against: fp8, bf16 (or fp16), tf32 or fp32
        "mfu_precision": mode,
    }
    record: dict[str, Any] = {
        "rows": fed.rows if fed else None,
        "real_tokens": fed.tokens if fed else None,
        # Σ r² / Σ r: keys per real token's score row, before any sliding window
        "attention_length": fed.attention_length(None) if fed else None,
    }
    if flops is not None:
        record.update(
            linear_forward=flops.linear_forward,
            linear_input_grad=flops.linear_input_grad,
            linear_weight_grad=flops.linear_weight_grad,
            attention=flops.attention,
            recompute=flops.recompute,
        )
    return figures, record, notes + mfu_notes


def build_result(
    *,
    spec: RunSpec,
    parsed: ParsedArguments,
    training_args: TrainingArguments,
    ranks: list[RankStats],
    loaded_info: dict[str, Any],
    data_meta: dict[str, Any],
    hf_metrics: dict[str, Any],
    log_history: list[dict[str, Any]],
    model: Any,
    on_gpu: bool,
    timings: dict[str, float],
    started_at: str,
    stage_memory: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    world = len(ranks)
    pd = training_args.per_device_train_batch_size
    ga = training_args.gradient_accumulation_steps
    metrics = summarize(ranks, parsed.measure.warmup_steps_excluded)
    loss = loss_summary(log_history)

    ckpt = bool(training_args.activation_checkpointing)
    device_name = torch.cuda.get_device_name() if on_gpu else None
    dtype = loaded_info.get("dtype")
    flop_figures, flops_record, flops_notes = _flops_figures(
        model=model,
        ranks=ranks,
        metrics=metrics,
        parsed=parsed,
        training_args=training_args,
        activation_checkpointing=ckpt,
        dtype=dtype,
        device_name=device_name,
    )
    # stage_memory: every rank's memory_stages(); the stage figures are rank 0's, as HF's were
    mem = stage_memory_figures(
        spec.memory_stages, hf_metrics, stage_memory[0] if stage_memory else {}
    )
    runtime = hf_metrics.get("train_runtime")
    rank0_padded = sum(ranks[0].step_padded_tokens)

    metrics.update(
        train_runtime=runtime,
        train_samples_per_second=hf_metrics.get("train_samples_per_second"),
        train_steps_per_second=hf_metrics.get("train_steps_per_second"),
        # HF's old definition: one device's tokens, padding included, over the whole run
        train_tokens_per_second=rank0_padded / runtime if runtime else None,
        train_loss=hf_metrics.get("train_loss"),
        loss_first=loss["loss_first"],
        loss_last=loss["loss_last"],
        loss_mean_last10pct=loss["loss_mean_last10pct"],
        **flop_figures,
        mem_peak_torch_mem_alloc_in_bytes=mem["mem_peak_torch_mem_alloc_in_bytes"],
        mem_torch_mem_alloc_in_bytes=mem["mem_torch_mem_alloc_in_bytes"],
        mem_stage_source=mem["mem_stage_source"],
        mem_load_peak_bytes=_max(m.get("mem_load_peak_bytes") for m in stage_memory),
        torch_max_memory_allocated_bytes=_max(r.cuda_max_allocated_bytes for r in ranks),
        torch_max_memory_reserved_bytes=_max(r.cuda_max_reserved_bytes for r in ranks),
        mem_peak_rss_bytes=_max(r.peak_rss_bytes for r in ranks),
    )
    result: dict[str, Any] = {name: getattr(spec, name) for name in SPEC_FIELDS}
    result.update(
        status="ok",
        error=None,
        error_type=None,
        model_name_or_path=parsed.model.name,
        device="gpu" if on_gpu else "cpu",
        num_gpus=world,
        world_size=world,
        per_device_train_batch_size=pd,
        gradient_accumulation_steps=ga,
        effective_batch_size=pd * ga * world,
        max_seq_len=parsed.data.max_seq_len,
        packing=parsed.data.packing,
        peft_method=parsed.peft.method,
        torch_dtype=dtype,
        activation_checkpointing=ckpt,
        gpu_device_name=device_name,
        started_at=started_at,
        finished_at=_now(),
        metrics=metrics,
        timings=timings,
        model=loaded_info,
        data=data_meta,
        flops=flops_record,
        ranks=[r.as_dict() for r in ranks],
        hf_metrics=hf_metrics,
        loss_history=loss["loss_history"],
        versions=_versions(),
        notes=[*parsed.notes, *flops_notes],
    )
    result["memory_stages"] = mem["stages"]
    if spec.memory_stages == "hf-tracker" and not on_gpu:
        result["notes"] = [
            *result["notes"],
            "HF's memory tracker is not run on the CPU: its polling thread would compete "
            "with training for the cores it measures",
        ]
    elif spec.memory_stages == "hf-tracker" and parsed.measure.instrumentation:
        result["notes"] = [
            *result["notes"],
            "hf-tracker: torch_max_memory_* cover all of train(), model wrapping included, "
            "so HF's train stage is left as HF measures it",
        ]
    return result


def _max(values: Any) -> int | None:
    present = [v for v in values if v is not None]
    return max(present) if present else None
