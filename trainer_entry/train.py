"""One training run: model, data, Trainer, measurement, and the result record."""

from __future__ import annotations

import os
import platform
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
from transformers import Trainer, TrainerCallback, TrainingArguments
from transformers.utils import logging as hf_logging

from orchestrator.result import write_result
from orchestrator.spec import RunSpec
from trainer_entry.arguments import ParsedArguments, parse_arguments
from trainer_entry.data import Collator, SequenceDataset, load_unprocessed, prepare
from trainer_entry.errors import SpecError
from trainer_entry.flops import estimate_flops, peak_tflops
from trainer_entry.measure import (
    RankStats,
    StepRecorder,
    hf_stage_memory,
    loss_summary,
    peak_rss_bytes,
    summarize,
)
from trainer_entry.models import load_model

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
    def __init__(self, recorder: StepRecorder) -> None:
        self.recorder = recorder

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.recorder.train_begin()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.recorder.step_end()


class BenchTrainer(Trainer):
    """A ``Trainer`` that counts the tokens of every micro-batch it trains on."""

    def __init__(self, *args: Any, recorder: StepRecorder | None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._recorder = recorder

    def training_step(
        self, model: Any, inputs: dict[str, Any], num_items_in_batch: Any = None
    ) -> Any:
        real, padded = inputs.pop("num_real_tokens", 0), inputs.pop("num_padded_tokens", 0)
        if self._recorder is not None:
            self._recorder.add_batch(real, padded)
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
        # HF's memory tracker polls RSS in a busy thread; on a CPU it competes
        # with training for the cores it measures, so it runs on GPUs only.
        "skip_memory_metrics": not (
            spec.hf_memory_metrics and on_gpu and parsed.measure.instrumentation
        ),
        "remove_unused_columns": False,
    }
    try:
        return TrainingArguments(**kwargs)
    except (ValueError, TypeError) as exc:
        raise SpecError(f"invalid trainer arguments: {exc}") from None


def _gather(stats: RankStats, world: int) -> list[RankStats]:
    if world == 1 or not torch.distributed.is_initialized():
        return [stats]
    gathered: list[Any] = [None] * world
    torch.distributed.all_gather_object(gathered, stats.as_dict())
    return [RankStats(**g) for g in gathered]


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
    on_gpu = _on_gpu(spec)
    if on_gpu:
        torch.cuda.set_device(local_rank)
    training_args = _training_arguments(spec, parsed, on_gpu)

    t = time.perf_counter()
    loaded = load_model(parsed.model, parsed.peft, on_gpu=on_gpu, local_rank=local_rank)
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
    t = time.perf_counter()
    trainer = BenchTrainer(
        model=model,
        args=training_args,
        train_dataset=SequenceDataset(data),
        data_collator=Collator(loaded.tokenizer.pad_token_id, parsed.pad_to_multiple_of),
        processing_class=loaded.tokenizer,
        callbacks=[_MeasureCallback(recorder)] if instrumented else [],
        recorder=recorder if instrumented else None,
    )
    timings["trainer_init_s"] = time.perf_counter() - t
    if on_gpu:
        torch.cuda.reset_peak_memory_stats()

    output = trainer.train()

    stats = recorder.stats
    stats.peak_rss_bytes = peak_rss_bytes()
    if on_gpu:
        stats.cuda_max_allocated_bytes = int(torch.cuda.max_memory_allocated())
        stats.cuda_max_reserved_bytes = int(torch.cuda.max_memory_reserved())
    ranks = _gather(stats, world)
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
    )
    write_result(Path(spec.result_path), result)
    return result


def _mean_padded_length(ranks: list[RankStats], batch_rows: int) -> float | None:
    """Mean padded sequence length fed (padded tokens per row)."""
    padded = sum(sum(r.step_padded_tokens) for r in ranks)
    rows = batch_rows * sum(len(r.step_padded_tokens) for r in ranks)
    return padded / rows if rows else None


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
) -> dict[str, Any]:
    world = len(ranks)
    pd = training_args.per_device_train_batch_size
    ga = training_args.gradient_accumulation_steps
    metrics = summarize(ranks, parsed.measure.warmup_steps_excluded)
    loss = loss_summary(log_history)

    seq_len = _mean_padded_length(ranks, pd * ga) or parsed.data.max_seq_len
    ckpt = bool(training_args.activation_checkpointing)
    flops = estimate_flops(model, seq_len, ckpt)
    device_name = torch.cuda.get_device_name() if on_gpu else None
    dtype = loaded_info.get("dtype")
    half = bool(training_args.bf16 or training_args.fp16 or dtype in ("bfloat16", "float16"))
    peak = parsed.measure.peak_tflops_per_device or peak_tflops(device_name, half)
    tps_dev = metrics.get("tokens_per_second_per_device")
    achieved = flops.model_flops_per_token * tps_dev / 1e12 if tps_dev else None
    hf_peak, hf_alloc = hf_stage_memory(hf_metrics)
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
        flops_per_token=flops.model_flops_per_token,
        hardware_flops_per_token=flops.hardware_flops_per_token,
        achieved_tflops_per_device=achieved,
        peak_tflops_per_device=peak,
        mfu=achieved / peak if achieved is not None and peak else None,
        mem_peak_torch_mem_alloc_in_bytes=hf_peak,
        mem_torch_mem_alloc_in_bytes=hf_alloc,
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
        flops={
            "seq_len": seq_len,
            "linear_forward": flops.linear_forward,
            "linear_input_grad": flops.linear_input_grad,
            "linear_weight_grad": flops.linear_weight_grad,
            "attention": flops.attention,
            "recompute": flops.recompute,
        },
        ranks=[r.as_dict() for r in ranks],
        hf_metrics=hf_metrics,
        loss_history=loss["loss_history"],
        versions=_versions(),
        notes=parsed.notes,
    )
    if spec.hf_memory_metrics and not on_gpu:
        result["notes"] = [*result["notes"], "HF memory metrics are skipped on the CPU"]
    return result


def _max(values: Any) -> int | None:
    present = [v for v in values if v is not None]
    return max(present) if present else None
