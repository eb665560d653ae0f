"""Every column of the results tables, declared once.

A ``Column`` says what a column is: its name and unit, the record it comes
from, how the repeats of a cell combine it, which way is better, how tables
and plots label it. The lists of the report (``ROLES``: what compare matches
rows on, what orders the cells, what a plot's label may name, summary.md's
figures, …) are each one ordered tuple of column names.
``raw_summary.csv`` (its columns and their order), ``benchmarks.csv`` (which
figures a cell gets, in which order), compare (which metrics it knows, their
direction, which rows match), the report's tables and the plots all read these
declarations (``with_role``). What remains elsewhere are a few views that pick
columns for one table or check (the figures a run without metrics lacks, the
cost table), each name checked against this registry by a test.

To add a metric the child measures: compute it in the child
(``trainer_entry/results/finished.py``), give the typed record a field for it
(``ChildMetrics`` in ``orchestrator/contract/result.py``), and declare it here
with one ``Column`` line, where ``raw_summary.csv`` should show it. With
``aggregate="median"`` it is in ``benchmarks.csv``; with a ``better``
direction, compare checks it when asked (``--metric NAME``); put where it
belongs in a role's tuple (``ROLES["summary"]``: summary.md's figures), it
joins that list there. A figure the
child reports but no line declares is left out of the tables, with a warning
that names it; a unit test fails while ``ChildMetrics`` and this registry differ.

The contract package imports nothing else of the project.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal, get_args

from orchestrator.contract.trainers import COUNT_UNITS, count_column

#: Where a column's value comes from: ``plan``, the experiment as planned (its
#: ``spec.json``); ``outcome``, the parent's ``outcome.json``; ``sidecar``, the
#: memory sampler's figures in the outcome's ``memory``; ``child``, the child's
#: ``result.json``; ``derived``, computed by the report from other columns.
Source = Literal["plan", "outcome", "sidecar", "child", "derived"]
SOURCES: tuple[Source, ...] = get_args(Source)

#: How the repeats of a cell combine into the cell's value in ``benchmarks.csv``:
#: ``spread``, the median over the ok repeats plus their coefficient of
#: variation, min and max (``<name>_cv``, ``_min``, ``_max``); ``median``, the
#: median over the ok repeats; ``first``, the first value the repeats have;
#: ``first_ok``, the first value the ok repeats have; ``mix``, the repeats'
#: status, or their mix (``ok×2 oom×1``); ``evidence``, the first error of the
#: repeats and its log; ``none``, a figure of one run only, not in the cells.
Aggregate = Literal["spread", "median", "first", "first_ok", "mix", "evidence", "none"]
AGGREGATES: tuple[Aggregate, ...] = get_args(Aggregate)
#: The statistics ``spread`` adds beside the median, as column name suffixes.
SPREAD_SUFFIXES = ("_cv", "_min", "_max")

#: Which way a metric improves; compare flags a change in the other direction.
Better = Literal["higher", "lower", "none"]


@dataclass(frozen=True)
class Role:
    """A list of columns the report reads (``with_role``): what it is for, and its
    columns in their order. A column joins the list where its name is put in it."""

    meaning: str
    columns: tuple[str, ...]


def _role(meaning: str, names: str) -> Role:
    return Role(meaning, tuple(names.split()))


#: The lists of columns the report reads from the registry, by role.
ROLES: Mapping[str, Role] = MappingProxyType(
    {
        "compare": _role(
            "what makes two rows the same experiment: compare matches rows on these where "
            "both sides have them (results/compare.py)",
            "scenario trainer task framework_config model_name_or_path num_gpus "
            "per_device_train_batch_size peft_method max_seq_len packing torch_dtype device "
            "environment",
        ),
        "baseline": _role(
            "what must be equal between a framework or trainer variant and its baseline cell "
            "(results/equivalence.py)",
            "scenario task model_name_or_path num_gpus effective_batch_size max_seq_len "
            "packing peft_method torch_dtype device environment",
        ),
        "sort": _role(
            "the order of the cells in benchmarks.csv (results/aggregate.py)",
            "scenario framework_config model_name_or_path num_gpus effective_batch_size "
            "max_seq_len",
        ),
        "series": _role(
            "a scaling series: cells equal in these that differ in their GPU count "
            "(results/aggregate.py)",
            "scenario task trainer framework_config model_name_or_path effective_batch_size "
            "max_seq_len packing peft_method torch_dtype device",
        ),
        "numeric": _role(
            "read as numbers from every table, empty where no number (results/collect.py)",
            "num_gpus per_device_train_batch_size gradient_accumulation_steps "
            "effective_batch_size max_seq_len repeat position",
        ),
        "cell_order": _role(
            "the order of a scenario's cells in summary.md's tables and in the plots "
            "(results/tablecolumns.py)",
            "model_name_or_path framework_config num_gpus effective_batch_size "
            "per_device_train_batch_size",
        ),
        "label_base": _role(
            "what a cell's label in the plots starts with (results/plots.py)",
            "model_name_or_path framework_config num_gpus",
        ),
        "label": _role(
            "what a cell's label in the plots may add, in this order, where it tells cells "
            "apart (results/plots.py)",
            "task trainer effective_batch_size per_device_train_batch_size peft_method "
            "max_seq_len torch_dtype packing gradient_accumulation_steps environment device "
            "processes",
        ),
        "summary": _role(
            "the figure columns of a scenario's table in summary.md (results/markdown.py)",
            "tokens_per_second_global tokens_per_second_per_device train_tokens_per_second "
            "peak_memory_bytes mfu cost_per_1m_tokens_usd train_loss gpu_util_mean_pct "
            "cpu_util_mean_pct energy_per_token_j",
        ),
        "compared": _role(
            "what compare checks when no metric is named (results/compare.py)",
            "tokens_per_second_global tokens_per_second_per_device train_tokens_per_second "
            "step_time_median_s peak_memory_bytes mfu energy_per_token_j",
        ),
        "varying": _role(
            "the keys a scenario's table in summary.md shows in a column of their own where "
            "its cells differ in them (results/markdown.py)",
            "task trainer peft_method max_seq_len torch_dtype packing environment",
        ),
        "environment_row": _role(
            "what a row of summary.md's environments side by side always names, first "
            "(results/envtables.py)",
            "scenario model_name_or_path framework_config num_gpus",
        ),
        "environment_figure": _role(
            "the figures summary.md shows side by side per environment (results/envtables.py)",
            "tokens_per_second_global peak_memory_bytes",
        ),
        "run_figure": _role(
            "figures every run that trained reports: a failed run without any left no metrics "
            "(results/capacity.py)",
            "train_runtime tokens_per_second_global train_tokens_per_second "
            "step_time_median_s train_loss",
        ),
        "annotated": _role(
            "conditions of a run that are not part of the experiment but change its figures: "
            "compare marks a matched cell whose sides differ in one (results/compare.py)",
            "gpu_device_name peak_memory_source memory_backend run_mode allocator "
            "allocator_settings gpu_conditions",
        ),
        "cell_figure": _role(
            "the order of the median figures of a cell in benchmarks.csv, after the spread "
            "ones; a median figure without this role follows them, in the registry's order "
            "(results/aggregate.py)",
            "train_tokens_per_second train_samples_per_second train_runtime step_time_cv "
            "train_loss loss_last mfu achieved_tflops_per_device flops_per_token "
            "peak_memory_bytes mem_nvidia_mem_reserved mem_peak_torch_mem_alloc_in_bytes "
            "mem_torch_mem_alloc_in_bytes mem_peak_rss_bytes torch_max_memory_reserved_bytes "
            "mem_tree_peak_pss_bytes mem_tree_peak_rss_bytes time_to_first_step_s job_s "
            "padding_fraction data_tokens cost_per_1m_tokens_usd cost_per_run_usd "
            "time_per_epoch_s cost_per_epoch_usd time_to_train_s cost_to_train_usd "
            "energy_per_token_j power_mean_w kwh_per_1m_tokens energy_cost_per_1m_tokens_usd "
            "co2_per_1m_tokens_g",
        ),
    }
)


@dataclass(frozen=True, kw_only=True)
class Column:
    """One column of the results tables."""

    name: str
    """The column's name in every table, with its unit in it (``_s``, ``_bytes``)."""
    source: Source
    """The record the value comes from (see ``Source``)."""
    unit: str = ""
    """The unit of a value: ``tokens/s``, ``s``, ``bytes``, ``MiB``, ``USD``,
    ``fraction`` (0..1), ``count``; empty for text and labels."""
    aggregate: Aggregate = "none"
    """How a cell's repeats combine (see ``Aggregate``)."""
    better: Better = "none"
    """Which way is better; compare knows the metrics that have a direction."""
    label: str = ""
    """The column's header in the report's tables (default: its name)."""
    path: tuple[str, ...] = ()
    """Where the value is in its source's record (default: under its name; a
    ``child`` figure under ``metrics``)."""
    fallback: Source | None = None
    """The record to read when the source has no value (``gpu_device_name``:
    the parent's outcome when the child left no result)."""
    aliases: tuple[str, ...] = ()
    """Other names of the column, read as this one: older tables' and records'
    (``slurm_job_id``), the predecessor's (``nvidia_mem_reserved``)."""
    key: bool = False
    """A key column: it names the experiment (``plan.csv``'s columns)."""
    raw: bool = True
    """Whether ``raw_summary.csv`` has the column in the registry's order; the
    report's derived figures (``raw=False``) follow the scenario arguments."""
    short: str = ""
    """A key column's value in a cell's label, ``{v}`` for the value (``seq {v}``);
    ``{unit}`` is what ``num_gpus`` counts, ``{per}`` the word after a per-device
    figure. Empty: the value itself, or ``name=value``."""
    flags: tuple[str, str] | None = None
    """A yes/no key column's labels for yes and no (``packed``, ``unpacked``)."""
    meaning: str = ""
    """What the figure means, as summary.md's reading guide says it; ``{worker}`` and
    ``{workers}`` are GPU and GPUs, or process and processes on the CPU."""

    def __post_init__(self) -> None:
        if not self.name or not self.name.isidentifier():
            raise ValueError(f"a column name is an identifier, got {self.name!r}")
        if self.source not in SOURCES:
            raise ValueError(f"{self.name}: source must be one of {SOURCES}, got {self.source!r}")
        if self.aggregate not in AGGREGATES:
            raise ValueError(
                f"{self.name}: aggregate must be one of {AGGREGATES}, got {self.aggregate!r}"
            )
        if self.better not in ("higher", "lower", "none"):
            raise ValueError(
                f"{self.name}: better must be higher, lower or none, got {self.better!r}"
            )
        if self.source == "derived" and self.path:
            raise ValueError(f"{self.name}: a derived column is read from no record")

    @property
    def where(self) -> tuple[str, ...]:
        """The keys that lead to the value in its source's record."""
        if self.path:
            return self.path
        return ("metrics", self.name) if self.source == "child" else (self.name,)

    @property
    def child_metric(self) -> bool:
        """Whether the child reports the value among its result's ``metrics``."""
        return self.source == "child" and self.where[0] == "metrics"

    @property
    def header(self) -> str:
        return self.label or self.name

    @property
    def output(self) -> bool:
        """A measured figure or bookkeeping of a run, never a setting of the experiment."""
        return not self.key


def _key(name: str, aggregate: Aggregate = "first", **more: Any) -> Column:
    return Column(name=name, source="plan", key=True, aggregate=aggregate, **more)


def _child(name: str, unit: str, **more: Any) -> Column:
    return Column(name=name, source="child", unit=unit, **more)


def _outcome(name: str, unit: str = "", **more: Any) -> Column:
    return Column(name=name, source="outcome", unit=unit, **more)


def _sidecar(name: str, unit: str, **more: Any) -> Column:
    return Column(name=name, source="sidecar", unit=unit, **more)


def _derived(name: str, unit: str, **more: Any) -> Column:
    return Column(name=name, source="derived", unit=unit, **more)


# The names the code reads columns by, outside this file; each column below is declared
# from its name here.
#: the headline throughput: real (non-padding) tokens per second over the measured
#: steps, all workers together
TOKENS_PER_SECOND = "tokens_per_second_global"
#: samples per second, all workers together (the classification tasks' unit)
SAMPLES_PER_SECOND = "samples_per_second_global"
#: HF Trainer's estimate of tokens/s per device, padding included: no measurement
HF_TOKENS_PER_SECOND = "train_tokens_per_second"
#: HF Trainer's wall time of training
TRAIN_RUNTIME = "train_runtime"
#: the job's wall time, launch to exit
JOB_S = "job_s"
#: the parent's wall time of the experiment, its retries and waits included
WALL_S = "wall_s"
#: a launch's cost before training, paid once however many rows shared it
LAUNCH_OVERHEAD = "launch_overhead_s"
#: what shapes a run's memory besides its key columns, read from its trained objects
#: (trainer_entry/results/memoryshape.py): the loss, the attention as loaded, activation
#: checkpointing's mode, the dtypes of weights, gradients and optimizer states, the optimizer
LOSS_IMPLEMENTATION = "loss_implementation"
ATTENTION_LOADED = "attn_implementation_loaded"
CHECKPOINTING_MODE = "activation_checkpointing_mode"
WEIGHTS_DTYPE = "weights_dtype"
GRADIENTS_DTYPE = "gradients_dtype"
OPTIMIZER_STATES_DTYPE = "optimizer_states_dtype"
OPTIMIZER = "optimizer"
MEMORY_SHAPE: tuple[str, ...] = (
    LOSS_IMPLEMENTATION,
    ATTENTION_LOADED,
    CHECKPOINTING_MODE,
    WEIGHTS_DTYPE,
    GRADIENTS_DTYPE,
    OPTIMIZER_STATES_DTYPE,
    OPTIMIZER,
)
#: the host memory allocator in force in a run, and its variables (empty: the defaults)
ALLOCATOR = "allocator"
ALLOCATOR_SETTINGS = "allocator_settings"
#: the phases of a run's wall time, in order (orchestrator/job/phases.py), and their columns
PHASE_COLUMNS: Mapping[str, str] = MappingProxyType(
    {
        phase: f"phase_{phase}_s"
        for phase in (
            "launch",
            "imports",
            "model",
            "data",
            "first_step",
            "training",
            "after_training",
        )
    }
)
#: the tokens of the prepared dataset: one epoch
DATA_TOKENS = "data_tokens"
#: how busy the GPUs were
GPU_UTIL = "gpu_util_mean_pct"
#: how busy the job's allowed CPUs were
CPU_UTIL = "cpu_util_mean_pct"
# where a run's peak memory is read from (the report's peak memory, fit's probes)
#: the peak memory NVML saw on the job's GPUs, the largest
NVML_PEAK = "mem_nvidia_peak_bytes_max"
#: torch's peak reserved memory, the largest rank's
TORCH_RESERVED_PEAK = "torch_max_memory_reserved_bytes"
#: the peak resident memory of a training process
PROCESS_RSS_PEAK = "mem_peak_rss_bytes"
#: the peak PSS of the job's process tree
TREE_PSS_PEAK = "mem_tree_peak_pss_bytes"
#: the peak summed RSS of the job's process tree
TREE_RSS_PEAK = "mem_tree_peak_rss_bytes"
#: the report's peak memory of a run, from the first source it has
PEAK_MEMORY = "peak_memory_bytes"
#: which source that was
PEAK_MEMORY_SOURCE = "peak_memory_source"
#: the price the report's costs use
USD_PER_GPU_HOUR = "usd_per_gpu_hour"
#: the report's costs and times to train (derived from the above and the price)
COST_PER_1M_TOKENS = "cost_per_1m_tokens_usd"
COST_PER_RUN = "cost_per_run_usd"
TIME_PER_EPOCH = "time_per_epoch_s"
COST_PER_EPOCH = "cost_per_epoch_usd"
TIME_TO_TRAIN = "time_to_train_s"
COST_TO_TRAIN = "cost_to_train_usd"
#: the real tokens and the samples fed in the measured steps, all workers together
TOKENS_MEASURED = "tokens_measured"
SAMPLES_MEASURED = "samples_measured"
#: energy over the measured steps (orchestrator/job/energy.py): joules, all of the
#: cell's GPUs (or CPU packages) together, where it came from, the window it covers,
#: how many devices it adds up, and why it is empty or what it covers
ENERGY_J = "energy_j"
ENERGY_SOURCE = "energy_source"
ENERGY_WINDOW = "energy_window"
ENERGY_DEVICES = "energy_devices"
ENERGY_NOTE = "energy_note"
#: the mean power of one device over the window
POWER_MEAN = "power_mean_w"
#: the share of samples of the most throttled GPU with a slowdown reason, and the
#: conditions a cell ran under (its power limit, and throttling where it passed the mark)
GPU_THROTTLED = "gpu_throttled_pct"
GPU_CONDITIONS = "gpu_conditions"
#: the mark: a GPU whose samples over the window carry a slowdown reason more often than
#: this share ran throttled, and its cell's gpu_conditions says so
THROTTLED_SHARE = 0.10
#: the report's energy figures (derived from the above and the tokens measured)
ENERGY_PER_TOKEN = "energy_per_token_j"
ENERGY_PER_SAMPLE = "energy_per_sample_j"
KWH_PER_1M_TOKENS = "kwh_per_1m_tokens"
ENERGY_COST_PER_1M_TOKENS = "energy_cost_per_1m_tokens_usd"
CO2_PER_1M_TOKENS = "co2_per_1m_tokens_g"

# The order is raw_summary.csv's: the key columns, the design's figures, the
# child's other figures, then the run's bookkeeping; the derived columns last.
_DECLARED: tuple[Column, ...] = (
    # -- the experiment (plan.csv's columns, and raw_summary.csv's first) ------------------
    _key("experiment_id", aggregate="none"),
    _key("scenario"),
    _key("framework_config"),
    _key("model_name_or_path"),
    _key("num_gpus", unit="count", short="{v} {unit}"),
    # training processes: num_gpus, but 1 under dp (one DataParallel process drives
    # all the cell's GPUs); empty in tables written before it existed
    _key("processes", unit="count"),
    _key("per_device_train_batch_size", unit="count", short="bs {v}/{per}"),
    _key("gradient_accumulation_steps", unit="count", short="accum {v}"),
    _key("effective_batch_size", unit="count", short="eb {v}"),
    _key("max_seq_len", unit="tokens", short="seq {v}"),
    _key("packing", flags=("packed", "unpacked")),
    _key("task", path=("arguments", "task")),
    _key("trainer", path=("arguments", "trainer")),
    _key("peft_method", path=("arguments", "peft_method")),
    _key("torch_dtype", path=("arguments", "torch_dtype")),
    _key("device"),
    # the environments: entry a cell ran under (empty without one)
    _key("environment"),
    _key("repeat", aggregate="none"),
    # plan order and OOM pruning: the experiment's 1-based place in the plan's run order
    # (orchestrator/matrix/order.py); empty in tables written before it existed
    _key("position", unit="count", aggregate="none"),
    _key("cell_id", aggregate="none"),
    Column(name="status", source="outcome", key=True, aggregate="mix"),
    # -- the design's figures --------------------------------------------------------------
    _outcome("error", aggregate="evidence"),
    _outcome("log", aggregate="evidence"),
    _child(TRAIN_RUNTIME, "s", aggregate="median", better="lower"),
    _child("train_samples_per_second", "samples/s", aggregate="median", better="higher"),
    _child("train_steps_per_second", "steps/s", better="higher"),
    _child(
        HF_TOKENS_PER_SECOND,
        "tokens/s",
        aggregate="median",
        better="higher",
        label="HF est. tokens/s/GPU",
    ),
    _child(
        TOKENS_PER_SECOND,
        "tokens/s",
        aggregate="spread",
        better="higher",
        label="tokens/s",
        meaning="real (non-padding) tokens per second over the measured steps (warm-up "
        "excluded), all {workers} together",
    ),
    _child(
        "tokens_per_second_per_device",
        "tokens/s",
        aggregate="spread",
        better="higher",
        label="tokens/s/GPU",
        meaning="the same, per {worker}",
    ),
    _child(
        SAMPLES_PER_SECOND,
        "samples/s",
        aggregate="spread",
        better="higher",
        label="samples/s",
        meaning="samples per second over the measured steps, all {workers} together (a "
        "sequence, an image, a pair, a clip: each task's sample, below where tasks differ)",
    ),
    _child("samples_per_second_per_device", "samples/s", aggregate="spread", better="higher"),
    # the counts a task reports beside tokens and samples (``TaskLine.counts``)
    *(
        _child(
            count_column(count),
            "s/s" if count.endswith("_seconds") else "tokens/s",
            aggregate="spread",
            better="higher",
            label=count.replace("_seconds", " s").replace("_tokens", " tokens") + "/s",
            meaning=f"{unit} per second over the measured steps, all {{workers}} together",
        )
        for count, unit in COUNT_UNITS.items()
    ),
    _child("step_time_median_s", "s", aggregate="spread", better="lower"),
    _child("step_time_cv", "fraction", aggregate="median"),
    _child(
        "train_loss",
        "",
        aggregate="median",
        better="lower",
        label="mean train loss",
        meaning="HF Trainer's `train_loss`: the mean training loss over all the run's steps, "
        "warm-up included (the quality column has the first and last)",
    ),
    # quality beside speed (trainer_entry/results/evaluate.py; summary.md's quality column,
    # orchestrator/results/quality.py): eval: true's figures on the held-out split, the
    # Trainer's eval loss (each eval batch's mean loss, causal-lm per label token, averaged
    # with the batches weighted by their rows: the exact per-token mean for trainer hf's
    # packed rows) and its exp; the slope of the training loss (loss per optimizer step
    # over the measured steps: negative, it falls; positive, it rises)
    _child("eval_loss", "", aggregate="median", better="lower", label="eval loss"),
    _child("perplexity", "", aggregate="median", better="lower"),
    _child("eval_accuracy", "fraction", aggregate="median", better="higher", label="eval acc %"),
    _child("loss_slope_per_step", "loss/step", aggregate="median", label="loss slope/step"),
    _sidecar(
        "mem_nvidia_mem_reserved",
        "MiB",
        aggregate="median",
        better="lower",
        aliases=("nvidia_mem_reserved",),
    ),
    _child(
        "mem_peak_torch_mem_alloc_in_bytes",
        "bytes",
        aggregate="median",
        better="lower",
        aliases=("peak_torch_mem_alloc_in_bytes",),
    ),
    _child(
        "mem_torch_mem_alloc_in_bytes",
        "bytes",
        aggregate="median",
        better="lower",
        aliases=("torch_mem_alloc_in_bytes",),
    ),
    _child(PROCESS_RSS_PEAK, "bytes", aggregate="median", better="lower"),
    _child("flops_per_token", "FLOPs", aggregate="median"),
    #: a task whose FLOPs are counted (``trainer_entry.measure.counted``): per sample too
    _child("flops_per_sample", "FLOPs", aggregate="median"),
    _child(
        "mfu",
        "fraction",
        aggregate="median",
        better="higher",
        label="MFU %",
        meaning="model FLOPs utilisation: the model's training FLOPs per token (forward and "
        "backward, attention included, recompute not counted) × tokens/s per {worker}, "
        "over the {worker}'s peak FLOP/s at the run's precision",
    ),
    _derived(
        COST_PER_1M_TOKENS,
        "USD",
        aggregate="median",
        better="lower",
        label="$/1M tokens",
        raw=True,
        meaning="{workers} × the price per {worker}-hour ÷ tokens per hour, × 1M",
    ),
    _child("gpu_device_name", "", aggregate="first", path=("gpu_device_name",), fallback="outcome"),
    # what trained, as accelerate set it up (trainer_entry/measure/engine.py): NO, MULTI_CPU,
    # MULTI_GPU, FSDP, DEEPSPEED; a run whose config names DeepSpeed but that did not run
    # under it fails instead. ZeRO stage and partitioned parameters: DeepSpeed runs only
    _child("distributed_type", "", aggregate="first", path=("distributed_type",)),
    _child("zero_stage", "", aggregate="first", path=("zero_stage",)),
    _child("params_partitioned", "", aggregate="first", path=("params_partitioned",)),
    # what hardware_flops_per_token's recompute depends on (trainer_entry/measure/recompute.py)
    _child(CHECKPOINTING_MODE, "", aggregate="first", path=(CHECKPOINTING_MODE,)),
    # what shapes memory, read from the trained objects (trainer_entry/results/memoryshape.py;
    # summary.md's "What shapes memory", results/memoryreport.py): the loss as the trainer
    # computed it, the attention the model was loaded with (``_loaded``: the scenario's
    # attn_implementation argument keeps its own column, a key of the cells), the dtypes
    # weights, gradients and optimizer states were kept in, and the optimizer that stepped
    _child(LOSS_IMPLEMENTATION, "", aggregate="first", path=(LOSS_IMPLEMENTATION,)),
    _child(ATTENTION_LOADED, "", aggregate="first", path=("model", "attn_implementation")),
    # fms-acceleration's plugins that were active in the job, read from its framework (a
    # framework_config that names them and cannot run them is refused before launch)
    _child("acceleration_plugins", "", aggregate="first", path=("model", "acceleration_plugins")),
    _child(WEIGHTS_DTYPE, "", aggregate="first", path=(WEIGHTS_DTYPE,)),
    _child(GRADIENTS_DTYPE, "", aggregate="first", path=(GRADIENTS_DTYPE,)),
    _child(OPTIMIZER_STATES_DTYPE, "", aggregate="first", path=(OPTIMIZER_STATES_DTYPE,)),
    _child(OPTIMIZER, "", aggregate="first", path=(OPTIMIZER,)),
    # the host memory allocator in force in the child and its variables (empty: none set,
    # the defaults; trainer_entry/measure/hostallocator.py): they change CPU step times
    _child(ALLOCATOR, "", aggregate="first", path=(ALLOCATOR,)),
    _child(ALLOCATOR_SETTINGS, "", aggregate="first", path=(ALLOCATOR_SETTINGS,)),
    # -- the child's other figures ---------------------------------------------------------
    _child("step_time_mean_s", "s"),
    _child("step_time_min_s", "s"),
    _child("step_time_max_s", "s"),
    # a condition of the measurement: the host allocator's churn in the measured steps
    _child("host_page_faults_per_step", "count", aggregate="median"),
    _child("steps", "count"),
    _child("steps_measured", "count"),
    _child("warmup_steps_excluded", "count"),
    # steady-state measuring (orchestrator/contract/steady.py): the mode (steps: the fixed
    # max_steps; steady: until the mean step time is known to a precision), how the run
    # stopped (steady: within the precision; max_steps: at its cap), and the achieved
    # precision of every run: the batch-means 95% interval's half-width, % of the mean
    _child("measure_until", "", aggregate="first_ok"),
    _child("measure_stopped", "", aggregate="first_ok"),
    _child("step_time_ci_pct", "%", aggregate="median", label="step time ±%"),
    _child(TOKENS_MEASURED, "tokens"),
    _child(SAMPLES_MEASURED, "count"),
    _child("tokens_total", "tokens"),
    _child("padded_tokens_total", "tokens"),
    _child("padding_fraction", "fraction", aggregate="median"),
    _child("measured_time_s", "s"),
    # loss_first, loss_last and loss_nonfinite_steps in the cells: the quality column's
    # divergence flag reads them
    _child("loss_first", "", aggregate="median"),
    _child("loss_last", "", aggregate="median"),
    _child("loss_mean_last10pct", ""),
    _child("loss_nonfinite_steps", "count", aggregate="median"),
    # the wall time eval: true added after training, and the examples it evaluated
    _child("eval_runtime", "s", aggregate="median"),
    _child("eval_samples", "count", aggregate="median"),
    _child("hardware_flops_per_token", "FLOPs"),
    _child("achieved_tflops_per_device", "TFLOP/s", aggregate="median", better="higher"),
    _child("peak_tflops_per_device", "TFLOP/s"),
    _child("torch_max_memory_allocated_bytes", "bytes"),
    _child(TORCH_RESERVED_PEAK, "bytes", aggregate="median", better="lower"),
    _child("mem_load_peak_bytes", "bytes"),
    _child("mem_stage_source", ""),
    _child("mfu_precision", ""),
    # a profile (profile: true, --profile; trainer_entry/measure/profile.py), from each rank's
    # trace over its profiled steps, the mean over the ranks; empty when not profiled.
    # Communication and compute are unions of intervals over the profiled steps' time:
    # they overlap, so they may sum above 100; exposed is communication without compute
    _child("profiled_steps", "count", aggregate="first_ok"),
    _child("comm_time_pct", "%", aggregate="median", better="lower", label="comm %"),
    _child("compute_time_pct", "%", aggregate="median", label="compute %"),
    _child("comm_exposed_time_pct", "%", aggregate="median", label="exposed comm %"),
    _child("comm_time_per_step_ms", "ms", aggregate="median", label="comm ms/step"),
    _child("profiled_step_time_ms", "ms", aggregate="median", label="profiled step ms"),
    _child("profile_export_s", "s", aggregate="median"),
    _child("top_ops", "", aggregate="first_ok", label="top operators (self time)"),
    # -- the run: the parent's bookkeeping, the child's record, the sidecar ----------------
    _outcome(WALL_S, "s"),
    _outcome(JOB_S, "s", aggregate="median"),
    _outcome("returncode"),
    _outcome("started_at"),
    _outcome("finished_at"),
    _child("world_size", "count", path=("world_size",)),
    _child("trainable_params", "count", path=("model", "trainable_params")),
    _child("total_params", "count", path=("model", "total_params")),
    _child(
        "time_to_first_step_s",
        "s",
        aggregate="median",
        better="lower",
        path=("timings", "time_to_first_step_s"),
    ),
    _child("data_cache_hit", "", path=("data", "cache_hit")),
    _child(DATA_TOKENS, "tokens", aggregate="median", path=("data", "tokens")),
    # the job's tree: PSS (shared pages split between the processes that map them), and
    # whether RSS stood in for a process; the summed RSS counts shared pages once per process
    _sidecar(TREE_PSS_PEAK, "bytes", aggregate="median", better="lower"),
    _sidecar("mem_tree_peak_measure", ""),
    _sidecar(TREE_RSS_PEAK, "bytes", aggregate="median"),
    _sidecar("mem_nvidia_peak_bytes_mean", "bytes"),
    _sidecar(NVML_PEAK, "bytes"),
    # utilisation (orchestrator/job/utilisation.py), over the window util_window names:
    # "measured" (the measured steps), "training" (first step to last) or "job" (its whole
    # life, where the child's files do not say when training ran). Empty where not sampled:
    # the GPU columns on the CPU, gpu_mem_bw_util_mean_pct where NVML does not tell it
    _sidecar(
        GPU_UTIL,
        "%",
        aggregate="median",
        better="higher",
        label="GPU util %",
        meaning="how busy the GPUs were (NVML), mean over the measured steps",
    ),
    _sidecar("gpu_util_p10_pct", "%", aggregate="median", better="higher"),
    _sidecar("gpu_mem_bw_util_mean_pct", "%", aggregate="median"),
    # the job tree's CPU time / (wall time × the CPUs its affinity allows): 100 = all busy
    _sidecar(
        CPU_UTIL,
        "% of allowed CPUs",
        aggregate="median",
        label="CPU util %",
        meaning="the job's CPU time ÷ (wall time × the CPUs it may use) over the measured steps: "
        "100 is every allowed CPU busy",
    ),
    _sidecar("cpu_allowed", "count"),
    _sidecar("util_window", "", aggregate="first_ok"),
    # energy over the same window as utilisation (orchestrator/job/energy.py): the
    # GPUs' energy counter (else their power samples integrated), or the CPU packages'
    # RAPL counter on the CPU; empty with energy_note saying why, never 0
    _sidecar(ENERGY_J, "J", aggregate="median"),
    _sidecar(ENERGY_SOURCE, "", aggregate="first_ok"),
    _sidecar(ENERGY_WINDOW, "", aggregate="first_ok"),
    _sidecar(ENERGY_DEVICES, "count", aggregate="first_ok"),
    _sidecar(ENERGY_NOTE, "", aggregate="first_ok"),
    _sidecar(POWER_MEAN, "W", aggregate="median", label="W per GPU"),
    # the conditions of the measurement, per GPU over the window, pooled: the slowest
    # GPU's clocks, the hottest, the lowest enforced power limit, the most throttled
    _sidecar("gpu_sm_clock_min_mhz", "MHz", aggregate="median"),
    _sidecar("gpu_sm_clock_median_mhz", "MHz", aggregate="median"),
    _sidecar("gpu_mem_clock_min_mhz", "MHz", aggregate="median"),
    _sidecar("gpu_mem_clock_median_mhz", "MHz", aggregate="median"),
    _sidecar("gpu_temp_max_c", "°C", aggregate="median"),
    _sidecar("gpu_power_limit_w", "W", aggregate="median"),
    _sidecar("gpu_power_limit_note", "", aggregate="first_ok"),
    _sidecar(GPU_THROTTLED, "%", aggregate="median", better="lower"),
    _sidecar("gpu_clock_reasons", "", aggregate="first_ok"),
    _sidecar(GPU_CONDITIONS, "", aggregate="first_ok"),
    _outcome("memory_backend"),
    _outcome("devices"),
    _outcome("attempt", "count"),
    _outcome("run_mode"),
    _outcome("packed_with"),
    _outcome("executor"),
    _outcome("job_id", aliases=("slurm_job_id",)),
    # the launch a row ran in (--launch family: several rows share one), its place there
    # and size, and its cost before training, paid once per launch (the same on its rows)
    _outcome("launch_id"),
    _outcome("launch_position", "count"),
    _outcome("launch_size", "count"),
    _outcome(LAUNCH_OVERHEAD, "s", aggregate="median", better="lower"),
    # where the wall time went: phases that add up to wall_s (orchestrator/job/phases.py)
    *(
        _outcome(column, "s", aggregate="median", path=("phases", f"{phase}_s"))
        for phase, column in PHASE_COLUMNS.items()
    ),
    # the wait before launch for the GPUs to cool (--cool-down; orchestrator/job/cooldown.py):
    # how long, the hottest GPU at launch, and why it ran out or was not made
    _outcome("cooldown_wait_s", "s", aggregate="median", path=("cooldown", "wait_s")),
    _outcome("cooldown_start_c", "°C", aggregate="median", path=("cooldown", "start_c")),
    _outcome("cooldown_note", "", aggregate="first", path=("cooldown", "note")),
    # an environment's versions as the plan found them (python and the training stack),
    # and, where the child's result reports other versions (the interpreter changed
    # between plan and run), which: the plan's against the child's, set where the row is
    # built (orchestrator/results/envtables.py)
    Column(name="environment_versions", source="plan", aggregate="first"),
    Column(name="environment_note", source="plan", aggregate="first"),
    # -- derived by the report (after the scenario arguments in raw_summary.csv) -----------
    _derived(
        PEAK_MEMORY,
        "bytes",
        aggregate="median",
        better="lower",
        label="peak mem GiB",
        raw=False,
    ),
    _derived(PEAK_MEMORY_SOURCE, "", aggregate="first_ok", raw=False),
    _derived(USD_PER_GPU_HOUR, "USD", raw=False),
    _derived(COST_PER_RUN, "USD", aggregate="median", label="$ per run", raw=False),
    _derived(TIME_PER_EPOCH, "s", aggregate="median", label="time per epoch", raw=False),
    _derived(COST_PER_EPOCH, "USD", aggregate="median", label="$ per epoch", raw=False),
    _derived(TIME_TO_TRAIN, "s", aggregate="median", raw=False),
    _derived(COST_TO_TRAIN, "USD", aggregate="median", raw=False),
    # energy per token and per sample: the energy over the measured steps ÷ the tokens
    # (samples) measured in them, where it covers them and every GPU of the cell
    _derived(
        ENERGY_PER_TOKEN,
        "J/token",
        aggregate="median",
        better="lower",
        label="J/token",
        meaning="the energy used over the measured steps ÷ the real tokens measured in them "
        "(the Energy section says what was measured)",
    ),
    _derived(ENERGY_PER_SAMPLE, "J/sample", aggregate="median", better="lower"),
    _derived(KWH_PER_1M_TOKENS, "kWh", aggregate="median", better="lower", label="kWh/1M tokens"),
    _derived(
        ENERGY_COST_PER_1M_TOKENS,
        "USD",
        aggregate="median",
        better="lower",
        label="energy $/1M tokens",
    ),
    _derived(CO2_PER_1M_TOKENS, "g", aggregate="median", better="lower", label="g CO2/1M tokens"),
)

#: The key columns, in order: what names an experiment (``plan.csv``'s columns).
KEY_COLUMNS: tuple[str, ...] = tuple(c.name for c in _DECLARED if c.key)

_registry: dict[str, Column] = {}
_by_alias: dict[str, str] = {}
#: ``columns()``, kept until the registry changes (tables ask for it once per row)
_columns: tuple[Column, ...] | None = None


def register(column: Column) -> Column:
    """Declare a further column (after the declared ones); returns it.

    Key columns are the plan's and cannot be added, and the lists of ``ROLES`` name
    declared columns only; a name (or alias) already declared is an error.
    """
    if column.key:
        raise ValueError(f"{column.name}: key columns come from the plan and are fixed")
    _declare([column])
    return column


def unregister(name: str) -> None:
    """Remove a column ``register`` added (tests); the declared ones stay."""
    global _columns
    if any(c.name == name for c in _DECLARED):
        raise ValueError(f"{name} is one of the declared columns")
    _columns = None
    column = _registry.pop(name)
    for alias in column.aliases:
        _by_alias.pop(alias, None)


def _declare(declared: Iterable[Column]) -> None:
    global _columns
    _columns = None
    for column in declared:
        for name in (column.name, *column.aliases):
            if name in _registry or name in _by_alias:
                raise ValueError(f"column {name!r} is declared twice")
        _registry[column.name] = column
        for alias in column.aliases:
            _by_alias[alias] = column.name


_declare(_DECLARED)


def _check_roles(roles: Mapping[str, Role]) -> None:
    """Each list names declared columns, each once."""
    declared = {c.name for c in _DECLARED}
    for role, listed in roles.items():
        for name in listed.columns:
            if name not in declared:
                raise ValueError(f"{role!r} names {name!r}, which is not a declared column")
        if len(set(listed.columns)) != len(listed.columns):
            raise ValueError(f"{role!r} names a column twice")


_check_roles(ROLES)


def columns() -> tuple[Column, ...]:
    """Every column, in declaration order (the same tuple until the registry changes)."""
    global _columns
    if _columns is None:
        _columns = tuple(_registry.values())
    return _columns


def find(name: str) -> Column | None:
    """The column named ``name`` (or one of its aliases); None for an undeclared name."""
    return _registry.get(name) or _registry.get(_by_alias.get(name, ""))


def get(name: str) -> Column:
    """The column named ``name``; a ``KeyError`` that says where to declare it otherwise."""
    column = find(name)
    if column is None:
        raise KeyError(f"no column {name!r} is declared in orchestrator/contract/columns.py")
    return column


def names(*, aliases: bool = False) -> frozenset[str]:
    """Every declared column name (and, with ``aliases``, every other name of one)."""
    found = set(_registry)
    if aliases:
        found |= set(_by_alias)
    return frozenset(found)


def alias_map() -> dict[str, str]:
    """Other names -> the column's name."""
    return dict(_by_alias)


def select(
    *,
    source: Source | Iterable[Source] | None = None,
    aggregate: Aggregate | Iterable[Aggregate] | None = None,
    better: Better | Iterable[Better] | None = None,
    key: bool | None = None,
    raw: bool | None = None,
    role: str | None = None,
) -> tuple[Column, ...]:
    """The columns that match every criterion given, in declaration order."""

    def wanted(value: str, criterion: str | Iterable[str] | None) -> bool:
        if criterion is None:
            return True
        return value == criterion if isinstance(criterion, str) else value in set(criterion)

    return tuple(
        c
        for c in _registry.values()
        if wanted(c.source, source)
        and wanted(c.aggregate, aggregate)
        and wanted(c.better, better)
        and (key is None or c.key == key)
        and (raw is None or c.raw == raw)
        and (role is None or c.name in ROLES[role].columns)
    )


def with_role(role: str) -> tuple[str, ...]:
    """The names of the columns in ``role``'s list (see ``ROLES``), in its order."""
    if role not in ROLES:
        raise KeyError(f"no role {role!r}; the roles are {sorted(ROLES)}")
    return ROLES[role].columns


def raw_columns() -> tuple[str, ...]:
    """``raw_summary.csv``'s fixed columns, in order (scenario arguments and the
    derived figures follow them)."""
    return tuple(c.name for c in select(raw=True))


def child_metrics() -> tuple[Column, ...]:
    """The figures the child reports in its result's ``metrics``."""
    return tuple(c for c in _registry.values() if c.child_metric)


def undeclared_metrics(metrics: Mapping[str, Any]) -> list[str]:
    """The names in a result's ``metrics`` that no column declares."""
    declared = {c.name for c in child_metrics()}
    return [name for name in metrics if name not in declared]


def spread_columns() -> tuple[str, ...]:
    """The statistics columns ``spread`` adds to the cells, metric by metric."""
    return tuple(
        f"{c.name}{suffix}" for c in select(aggregate="spread") for suffix in SPREAD_SUFFIXES
    )


def directions() -> dict[str, Better]:
    """Every metric with a direction (``higher`` or ``lower``), and which it is."""
    return {c.name: c.better for c in _registry.values() if c.better != "none"}


def direction(name: str) -> Better:
    """Which way ``name`` is better, ``higher`` or ``lower``; a ``ValueError`` for a
    column without a direction (or none of that name)."""
    column = find(name)
    if column is None or column.better == "none":
        raise ValueError(f"no direction known for metric {name!r}")
    return column.better


def short_label(name: str, value: str, *, unit: str = "GPU", per: str = "dev") -> str | None:
    """A key value as a cell's label shows it (``seq 1024``); None where the column
    declares no short form."""
    column = find(name)
    if column is None or not column.short:
        return None
    return column.short.format(v=value, unit=unit, per=per)
