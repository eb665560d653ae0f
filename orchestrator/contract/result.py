"""``result.json``: the typed record a run leaves behind.

Written by the training child (rank 0 on success, the failing rank on an
error), read by the parent and the report. The parent never scrapes numbers
from a child's output: what it knows of a run comes from here.

``ChildResult`` declares every field the child writes. A field is written
when the child set it, ``None`` included, and left out when it did not: a
failed run has no ``metrics``, a run without instrumentation no step-time
figures, a packed dataset no ``examples_truncated``. Reading a file back and
writing it again gives the same keys. Unknown keys are refused, so a field
the child writes but this file does not declare fails the child's own tests.
"""

from __future__ import annotations

import json
import math
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from orchestrator.contract.jsonio import read_json_object
from orchestrator.contract.layout import write_atomic
from orchestrator.contract.outcome import Status

RESULT_SCHEMA_VERSION = 1

#: Set by the parent for one launch of a job, the same on every node and rank
#: of it: a rank stopped because a peer failed recognises the peer's report.
LAUNCH_ID_ENV = "TUNEMATRIX_LAUNCH_ID"

#: A JSON number as the child computed it: an int stays an int, a float a float.
Number = int | float


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RunTimings(_Record):
    """Where a run's wall time went before and around training, in seconds."""

    #: from the process's start to the first line of the child
    interpreter_start_s: float | None = None
    #: importing the training stack
    import_s: float | None = None
    model_load_s: float | None = None
    #: loading, tokenizing and packing the data, or reading it from the cache
    data_prep_s: float | None = None
    #: building the trainer
    trainer_init_s: float | None = None
    #: from the start of training to the end of the first optimizer step
    first_step_s: float | None = None
    #: from the process's start to the end of the first optimizer step
    time_to_first_step_s: float | None = None
    #: when the first optimizer step ended (Unix time): the parent times its launch to it
    first_step_unix: float | None = None
    # the instants that end the phases of a run's wall time (orchestrator/job/phases.py),
    # Unix time: the run's start (the process's, for a launch's first run), the imports
    # done, the model loaded, the data prepared, (the first step: first_step_unix), the
    # last optimizer step
    run_start_unix: float | None = None
    imports_end_unix: float | None = None
    model_end_unix: float | None = None
    data_end_unix: float | None = None
    train_end_unix: float | None = None


class ChildMetrics(_Record):
    """The measured figures of a finished run (``trainer_entry.measure.steps``, ``trainer_entry.measure.flops``).

    The step and token figures are absent when no step was recorded
    (``instrumentation: false``); the rest are always written, None where unknown.
    """

    #: optimizer steps every rank recorded
    steps: int
    #: the first steps, left out of throughput and step time
    warmup_steps_excluded: int | None = None
    steps_measured: int | None = None
    #: the slowest rank's time over the measured steps
    measured_time_s: float | None = None
    #: real tokens of the measured steps, all ranks
    tokens_measured: int | None = None
    #: real tokens of every step, all ranks
    tokens_total: int | None = None
    #: padded batch tokens of every step, all ranks
    padded_tokens_total: int | None = None
    padding_fraction: float | None = None
    tokens_per_second_global: float | None = None
    tokens_per_second_per_device: float | None = None
    #: samples (sequences, packed rows, images) of the measured steps, all ranks
    samples_measured: int | None = None
    samples_per_second_global: float | None = None
    samples_per_second_per_device: float | None = None
    #: the counts a task reports beside tokens (``orchestrator.contract.trainers.COUNT_UNITS``),
    #: per second over the measured steps, all ranks; None where the task has no such count
    source_tokens_per_second_global: float | None = None
    target_tokens_per_second_global: float | None = None
    audio_seconds_per_second_global: float | None = None
    image_tokens_per_second_global: float | None = None
    text_tokens_per_second_global: float | None = None
    step_time_median_s: float | None = None
    step_time_mean_s: float | None = None
    #: standard deviation over mean of the step times
    step_time_cv: float | None = None
    # -- how long it measured (orchestrator/contract/steady.py) ----------------------------
    #: ``steps`` (the fixed max_steps) or ``steady`` (until the mean step time is known)
    measure_until: str | None = None
    #: ``steady`` (within the precision) or ``max_steps`` (the cap); None: ended otherwise
    measure_stopped: str | None = None
    #: the achieved precision: the half-width of the batch-means 95% interval of the mean
    #: step time over the measured steps, in percent of the mean; None under 9 steps
    step_time_ci_pct: float | None = None
    step_time_min_s: float | None = None
    step_time_max_s: float | None = None
    #: minor page faults per measured step, the busiest rank's: how much the host
    #: allocator hands memory back and faults it in again (its settings: ``allocator``)
    host_page_faults_per_step: float | None = None
    #: the trainer's own figures
    train_runtime: Number | None
    train_samples_per_second: Number | None
    train_steps_per_second: Number | None
    #: the predecessor's definition: rank 0's tokens, padding included, over the whole run
    train_tokens_per_second: Number | None
    train_loss: Number | None
    loss_first: float | None
    loss_last: float | None
    loss_mean_last10pct: float | None
    #: least-squares slope of the logged training loss over the measured steps, in loss
    #: per optimizer step: negative, the loss falls (``trainer_entry.results.evaluate``)
    loss_slope_per_step: float | None = None
    #: logged steps whose loss or gradient norm is NaN or infinite
    loss_nonfinite_steps: int | None = None
    #: ``eval: true``: the Trainer's eval loss on the held-out split (each batch's mean
    #: loss, per label token for causal-lm, averaged with batches weighted by their rows;
    #: see ``trainer_entry.results.evaluate``)
    eval_loss: float | None = None
    #: exp(eval_loss), causal-lm only
    perplexity: float | None = None
    #: classification: the share of held-out samples classified right, 0 to 1
    eval_accuracy: float | None = None
    #: the wall time of the eval after training, in seconds (dataset preparation included)
    eval_runtime: float | None = None
    #: held-out examples given to the trainer's evaluate(): rows (packed rows under trainer
    #: hf with packing; under trainer sft the sequences before TRL packs them)
    eval_samples: int | None = None
    #: model FLOPs per real token of a training step
    flops_per_token: Number | None
    #: model FLOPs per sample of a training step (tasks whose FLOPs are counted)
    flops_per_sample: Number | None = None
    #: the same with the forward recomputed by activation checkpointing
    hardware_flops_per_token: Number | None
    achieved_tflops_per_device: Number | None
    peak_tflops_per_device: Number | None
    #: model FLOPs utilisation, 0 to 1
    mfu: Number | None
    #: which of the device's peaks MFU is against: fp8, bf16, tf32 or fp32
    mfu_precision: str | None
    mem_peak_torch_mem_alloc_in_bytes: int | None
    mem_torch_mem_alloc_in_bytes: int | None
    #: what the GPU memory stage figures come from (None: nothing)
    mem_stage_source: str | None
    #: the most GPU memory allocated while loading and wrapping the model
    mem_load_peak_bytes: int | None
    torch_max_memory_allocated_bytes: int | None
    torch_max_memory_reserved_bytes: int | None
    mem_peak_rss_bytes: int | None
    # -- a profile (profile: true; trainer_entry.measure.profile), empty otherwise ------------------
    #: steps recorded with torch.profiler after the warm-up, left out of the window
    profiled_steps: int | None = None
    #: communication (collective kernels; on the CPU gloo's collectives) over the
    #: profiled steps' time, in percent, the mean over the ranks
    comm_time_pct: float | None = None
    #: compute (other kernels; on the CPU other operators) over that time, in percent
    compute_time_pct: float | None = None
    #: communication while no compute ran, in percent of that time
    comm_exposed_time_pct: float | None = None
    comm_time_per_step_ms: float | None = None
    #: a profiled step's time (the profiler's overhead included)
    profiled_step_time_ms: float | None = None
    #: the slowest rank's stop and trace export, inside the last profiled step
    profile_export_s: float | None = None
    #: the top operators by self time: ``aten::mm 31%, ...``
    top_ops: str | None = None


class FlopsRecord(_Record):
    """What the FLOPs figures were computed from; the parts are absent without a figure."""

    #: sequences fed in the measured steps, all ranks
    rows: int | None
    real_tokens: int | None
    #: Σ r² / Σ r: keys per real token's score row, before any sliding window
    attention_length: Number | None
    linear_forward: Number | None = None
    linear_input_grad: Number | None = None
    linear_weight_grad: Number | None = None
    attention: Number | None = None
    recompute: Number | None = None
    #: ``counted``: the step counted by PyTorch's FLOP counter on the meta device and fitted
    #: to the rows' lengths (``trainer_entry.measure.counted``); absent: the formula
    method: str | None = None
    #: counted: each FLOPs dimension's mean real length over the rows fed
    mean_lengths: dict[str, float] | None = None
    #: counted: one sample's training FLOPs per term of its lengths (``1``, ``source``,
    #: ``source*target``, …)
    coefficients: dict[str, float] | None = None
    #: counted: each part of the model (encoder, decoder, a tower, the head) -> its forward
    #: FLOPs per sample and per token
    components: dict[str, dict[str, float]] | None = None


class ModelRecord(_Record):
    """The model as loaded (``trainer_entry.models.load``)."""

    #: ``tiny``, ``config`` or ``pretrained``
    kind: str
    dtype: str | None
    attn_implementation: str | None
    architecture: str
    #: ``nf4`` under QLoRA, else None
    quantization: str | None
    #: where a ``config:`` model was built (``cpu``, ``cuda``); None for other kinds
    built_on: str | None
    #: whether this rank drew a ``config:`` model's weights; None for other kinds
    weights_drawn: bool | None
    trainable_params: int
    total_params: int
    peft_method: str | None
    #: fms-acceleration's plugins active in the job, as its framework names them
    #: (``trainer_entry.models.acceleration``), comma-separated; None: no framework
    acceleration_plugins: str | None = None


class DataRecord(_Record):
    """What the data preparation did (``trainer_entry.data``)."""

    #: the data file's name and hash, or the hub dataset's name, split and fingerprint
    source: dict[str, Any]
    #: records in the dataset
    examples: int
    #: training sequences made from them
    sequences: int
    tokens: int
    #: tokens that carry a loss
    label_tokens: int
    #: the cache folder's name; absent without processing
    cache_key: str | None = None
    formatting: str | None = None
    max_seq_len: int | None = None
    packing: bool | None = None
    #: ``none``: the file as it is (``no_data_processing``)
    processing: str | None = None
    #: packed: the tail shorter than one block
    tokens_dropped: int | None = None
    #: not packed: examples cut to max_seq_len, and those left with no token to learn from
    examples_truncated: int | None = None
    examples_dropped: int | None = None
    #: True: read from the cache; None: no cache used
    cache_hit: bool | None = None
    cache_path: str | None = None
    #: ``eval: true``: documents (sequences before packing, texts, images) held out for
    #: eval and not trained on; the counts above are then the part trained on
    heldout_sequences: int | None = None
    #: a task's counts beside tokens over the data (``COUNT_UNITS``: source and target
    #: tokens, audio seconds, …); absent for the tasks without
    counts: dict[str, float] | None = None


class RankRecord(_Record):
    """One rank's step records (``trainer_entry.measure.steps.RankStats``)."""

    rank: int
    pid: int
    step_times_s: list[float]
    step_tokens: list[int]
    step_padded_tokens: list[int]
    step_rows: list[int]
    step_sq_tokens: list[int]
    #: sliding window -> Σ r·min(r, w) for each step
    step_windowed_sq_tokens: dict[int, list[int]]
    #: the process's minor page faults in each step (absent in older records)
    step_page_faults: list[int] = []
    #: a task's counts beside tokens per step (``COUNT_UNITS``; absent for other tasks)
    step_counts: dict[str, list[float]] = {}
    #: the moments of the rows' lengths along a task's FLOPs dimensions per step
    step_moments: dict[str, list[int]] = {}
    first_step_s: float | None
    first_step_end_unix: float | None
    peak_rss_bytes: int | None
    cuda_max_allocated_bytes: int | None
    cuda_max_reserved_bytes: int | None


class Versions(_Record):
    python: str
    torch: str
    cuda: str | None
    transformers: str
    peft: str
    accelerate: str
    #: TRL, where installed (the ``sft`` backend)
    trl: str | None = None


class ChildResult(_Record):
    """``result.json``: one run of one experiment, finished or not."""

    schema_version: int = RESULT_SCHEMA_VERSION
    experiment_id: str
    cell_id: str | None
    scenario: str | None
    framework_config: str | None
    repeat: int
    #: the swept axes' values of the cell
    swept: dict[str, Any]
    model_name_or_path: str | None
    status: Status
    #: one line; None when the run finished
    error: str | None
    #: the exception's class name
    error_type: str | None
    world_size: int
    timings: RunTimings
    finished_at: str

    # ---- a finished run ------------------------------------------------------
    #: what the run trained (``causal-lm``, ``seq-classification``, ``image-classification``)
    task: str | None = None
    #: the trainer backend that ran it (``sft``, ``hf``)
    trainer: str | None = None
    #: what one sample is (``sequences``, ``images``)
    sample_unit: str | None = None
    device: Literal["gpu", "cpu"] | None = None
    #: devices trained on: GPUs (DataParallel: all the one process drove); on the CPU,
    #: processes
    num_gpus: int | None = None
    #: training processes (``world_size``; 1 under DataParallel)
    processes: int | None = None
    #: accelerate's distributed type as it ran (``NO``, ``MULTI_CPU``, ``MULTI_GPU``,
    #: ``FSDP``, ``DEEPSPEED``)
    distributed_type: str | None = None
    #: the ZeRO stage DeepSpeed ran with; None without DeepSpeed
    zero_stage: int | None = None
    #: DeepSpeed held the parameters as per-rank shards (ZeRO-3); None without DeepSpeed
    params_partitioned: bool | None = None
    per_device_train_batch_size: int | None = None
    gradient_accumulation_steps: int | None = None
    effective_batch_size: int | None = None
    max_seq_len: int | None = None
    packing: bool | None = None
    peft_method: str | None = None
    torch_dtype: str | None = None
    activation_checkpointing: bool | None = None
    #: how the checkpointed blocks recompute, read from the model: ``non-reentrant``,
    #: ``reentrant``, ``mixed`` or ``other``; None: no block checkpointed
    activation_checkpointing_mode: str | None = None
    # -- what shapes the run's memory, read from its trained objects
    # (``trainer_entry.results.memoryshape``); None in results written before them --------
    #: what computed the loss (the backend's ``loss_implementation``): ``transformers
    #: ForCausalLMLoss (full fp32 logits)``, ``trl fused LM head (chunked nll)``, ...
    loss_implementation: str | None = None
    #: the parameters' dtype as kept: ``bfloat16``, or ``bfloat16 frozen, float32 trainable``
    weights_dtype: str | None = None
    #: the gradients' dtype: the stepped parameters', with the model's where a master copy
    #: differs (``float32 master (bfloat16 in the model)``)
    gradients_dtype: str | None = None
    #: the optimizer's state tensors' dtypes and names: ``float32 (exp_avg, exp_avg_sq)``;
    #: None where it kept none (a note says so)
    optimizer_states_dtype: str | None = None
    #: the ``optim`` argument and the class that stepped: ``adamw_torch_fused (AdamW, fused)``
    optimizer: str | None = None
    gpu_device_name: str | None = None
    #: the host memory allocator in force in the child, as it found it in its own process:
    #: ``glibc 2.36``, ``jemalloc /usr/lib/x86_64-linux-gnu/libjemalloc.so.2``, ...
    allocator: str | None = None
    #: the allocator variables in force (``MALLOC_*``, ``GLIBC_TUNABLES``, ``TCMALLOC_*``,
    #: ...): ``NAME=value`` joined by ``; ``, sorted; None: none set, the defaults
    allocator_settings: str | None = None
    started_at: str | None = None
    metrics: ChildMetrics | None = None
    model: ModelRecord | None = None
    data: DataRecord | None = None
    flops: FlopsRecord | None = None
    ranks: list[RankRecord] | None = None
    #: the trainer's own metrics, as it returned them
    hf_metrics: dict[str, Any] | None = None
    #: [step, loss] of every logged step
    loss_history: list[tuple[int, float]] | None = None
    #: rank 0's GPU memory stage figures (HF's names)
    memory_stages: dict[str, Number] | None = None
    versions: Versions | None = None
    notes: list[str] | None = None

    #: the launch that wrote it, shared by its ranks (``LAUNCH_ID_ENV``; its outcome.json
    #: names the same one); on a failure, also where a peer's report is told apart
    launch_id: str | None = None

    # ---- a run that failed ---------------------------------------------------
    #: the rank that wrote this failure
    error_rank: int | None = None

    def record(self) -> dict[str, Any]:
        """The JSON object written to disk: the fields that were set, and the schema version."""
        data = self.model_dump(mode="json", exclude_unset=True)
        data["schema_version"] = self.schema_version
        return _json_safe(data)  # type: ignore[no-any-return]


class ResultError(ValueError):
    """A ``result.json`` that is JSON but not a result this version reads."""


def timestamp() -> str:
    """The time now as a result records it (``started_at``, ``finished_at``): UTC, to the second."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def one_line(text: str, limit: int = 500) -> str:
    """An error message as one line: whitespace runs collapsed, long text cut."""
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _json_safe(value: Any) -> Any:
    """Replace NaN and infinities (not valid JSON) with None, recursively."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def write_result(path: Path, result: ChildResult) -> None:
    """Write a result atomically: a reader sees no file or the whole file."""
    text = json.dumps(result.record(), indent=2, sort_keys=True, allow_nan=False)
    write_atomic(path, text + "\n")


def load_result(path: Path) -> ChildResult | None:
    """The result at ``path``, validated; None when there is none or it cannot be read.

    Raises ``ResultError`` (naming the file and the first bad key) when the
    file is a JSON object that is not a valid result.
    """
    data = read_result(path)
    if data is None:
        return None
    try:
        return ChildResult.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        raise ResultError(f"{path}: {where}: {first['msg']}{more}") from None


def launch_result(path: Path, launch_id: str) -> dict[str, Any] | None:
    """The result at ``path`` if the launch ``launch_id`` wrote it; None otherwise (none,
    unreadable, or another launch's: an earlier attempt's is no evidence of this one);
    an empty ``launch_id`` takes any."""
    result = read_json_object(path)
    if result is None or (launch_id and result.get("launch_id") not in (None, launch_id)):
        return None
    return result


def read_result(path: Path) -> dict[str, Any] | None:
    """The JSON object at ``path``, unvalidated; None if there is none or it cannot be read.

    Any JSON object file reads this way (the parent reads ``outcome.json`` and
    its executors' records with it too); ``load_result`` validates a result.
    """
    return read_json_object(path)
