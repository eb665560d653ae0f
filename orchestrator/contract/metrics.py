"""Every column of the results tables, declared once.

A ``Column`` says what a column is: its name and unit, the record it comes
from, how the repeats of a cell combine it, which way is better, and how
tables and plots label it. ``raw_summary.csv`` (its columns and their order),
``benchmarks.csv`` (which figures a cell gets), compare (which metrics it
knows, and their direction), the report's tables and the plots all read these
declarations. What remains elsewhere are views that pick or order a few
columns (summary.md's figures, compare's default metrics), each name checked
against this registry by a test.

To add a metric the child measures: compute it in the child
(``trainer_entry/results/finished.py``), give the typed record a field for it
(``ChildMetrics`` in ``orchestrator/contract/result.py``), and declare it here
with one ``Column`` line, where ``raw_summary.csv`` should show it. With
``aggregate="median"`` it is in ``benchmarks.csv``; with a ``better``
direction, compare checks it when asked (``--metric NAME``). A figure the
child reports but no line declares is left out of the tables, with a warning
that names it; a unit test fails while ``ChildMetrics`` and this registry differ.

The contract package imports nothing else of the project.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

#: Where a column's value comes from: ``plan``, the experiment as planned (its
#: ``spec.json``); ``outcome``, the parent's ``outcome.json``; ``sidecar``, the
#: memory sampler's figures in the outcome's ``memory``; ``child``, the child's
#: ``result.json``; ``derived``, computed by the report from other columns.
Source = Literal["plan", "outcome", "sidecar", "child", "derived"]
SOURCES: tuple[Source, ...] = ("plan", "outcome", "sidecar", "child", "derived")

#: How the repeats of a cell combine into the cell's value in ``benchmarks.csv``:
#: ``spread``, the median over the ok repeats plus their coefficient of
#: variation, min and max (``<name>_cv``, ``_min``, ``_max``); ``median``, the
#: median over the ok repeats; ``first``, the first value the repeats have;
#: ``first_ok``, the first value the ok repeats have; ``mix``, the repeats'
#: status, or their mix (``ok×2 oom×1``); ``evidence``, the first error of the
#: repeats and its log; ``none``, a figure of one run only, not in the cells.
Aggregate = Literal["spread", "median", "first", "first_ok", "mix", "evidence", "none"]
AGGREGATES: tuple[Aggregate, ...] = (
    "spread",
    "median",
    "first",
    "first_ok",
    "mix",
    "evidence",
    "none",
)
#: The statistics ``spread`` adds beside the median, as column name suffixes.
SPREAD_SUFFIXES = ("_cv", "_min", "_max")

#: Which way a metric improves; compare flags a change in the other direction.
Better = Literal["higher", "lower", "none"]


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
    _child("train_runtime", "s", aggregate="median", better="lower"),
    _child("train_samples_per_second", "samples/s", aggregate="median", better="higher"),
    _child("train_steps_per_second", "steps/s", better="higher"),
    _child(
        "train_tokens_per_second",
        "tokens/s",
        aggregate="median",
        better="higher",
        label="HF est. tokens/s/GPU",
    ),
    _child(
        "tokens_per_second_global",
        "tokens/s",
        aggregate="spread",
        better="higher",
        label="tokens/s",
    ),
    _child(
        "tokens_per_second_per_device",
        "tokens/s",
        aggregate="spread",
        better="higher",
        label="tokens/s/GPU",
    ),
    _child(
        "samples_per_second_global",
        "samples/s",
        aggregate="spread",
        better="higher",
        label="samples/s",
    ),
    _child("samples_per_second_per_device", "samples/s", aggregate="spread", better="higher"),
    _child("step_time_median_s", "s", aggregate="spread", better="lower"),
    _child("step_time_cv", "fraction", aggregate="median"),
    _child("train_loss", "", aggregate="median", better="lower", label="mean train loss"),
    # quality beside speed (trainer_entry/run/evaluate.py; summary.md's quality column,
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
    _child("mem_peak_rss_bytes", "bytes", aggregate="median", better="lower"),
    _child("flops_per_token", "FLOPs", aggregate="median"),
    _child("mfu", "fraction", aggregate="median", better="higher", label="MFU %"),
    _derived(
        "cost_per_1m_tokens_usd",
        "USD",
        aggregate="median",
        better="lower",
        label="$/1M tokens",
        raw=True,
    ),
    _child("gpu_device_name", "", aggregate="first", path=("gpu_device_name",), fallback="outcome"),
    # what trained, as accelerate set it up (trainer_entry/run/engine.py): NO, MULTI_CPU,
    # MULTI_GPU, FSDP, DEEPSPEED; a run whose config names DeepSpeed but that did not run
    # under it fails instead. ZeRO stage and partitioned parameters: DeepSpeed runs only
    _child("distributed_type", "", aggregate="first", path=("distributed_type",)),
    _child("zero_stage", "", aggregate="first", path=("zero_stage",)),
    _child("params_partitioned", "", aggregate="first", path=("params_partitioned",)),
    # -- the child's other figures ---------------------------------------------------------
    _child("step_time_mean_s", "s"),
    _child("step_time_min_s", "s"),
    _child("step_time_max_s", "s"),
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
    _child("tokens_measured", "tokens"),
    _child("samples_measured", "count"),
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
    _child("torch_max_memory_reserved_bytes", "bytes", aggregate="median", better="lower"),
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
    _outcome("wall_s", "s"),
    _outcome("job_s", "s", aggregate="median"),
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
    _child("data_tokens", "tokens", aggregate="median", path=("data", "tokens")),
    # the job's tree: PSS (shared pages split between the processes that map them), and
    # whether RSS stood in for a process; the summed RSS counts shared pages once per process
    _sidecar("mem_tree_peak_pss_bytes", "bytes", aggregate="median", better="lower"),
    _sidecar("mem_tree_peak_measure", ""),
    _sidecar("mem_tree_peak_rss_bytes", "bytes", aggregate="median"),
    _sidecar("mem_nvidia_peak_bytes_mean", "bytes"),
    _sidecar("mem_nvidia_peak_bytes_max", "bytes"),
    # utilisation (orchestrator/job/utilisation.py), over the window util_window names:
    # "measured" (the measured steps), "training" (first step to last) or "job" (its whole
    # life, where the child's files do not say when training ran). Empty where not sampled:
    # the GPU columns on the CPU, gpu_mem_bw_util_mean_pct where NVML does not tell it
    _sidecar("gpu_util_mean_pct", "%", aggregate="median", better="higher", label="GPU util %"),
    _sidecar("gpu_util_p10_pct", "%", aggregate="median", better="higher"),
    _sidecar("gpu_mem_bw_util_mean_pct", "%", aggregate="median"),
    # the job tree's CPU time / (wall time × the CPUs its affinity allows): 100 = all busy
    _sidecar("cpu_util_mean_pct", "% of allowed CPUs", aggregate="median", label="CPU util %"),
    _sidecar("cpu_allowed", "count"),
    _sidecar("util_window", "", aggregate="first_ok"),
    _outcome("memory_backend"),
    _outcome("devices"),
    _outcome("attempt", "count"),
    _outcome("run_mode"),
    _outcome("packed_with"),
    _outcome("executor"),
    _outcome("job_id", aliases=("slurm_job_id",)),
    # an environment's versions as the plan found them (python and the training stack),
    # and, where the child's result reports other versions (the interpreter changed
    # between plan and run), which: the plan's against the child's, set where the row is
    # built (orchestrator/results/environments.py)
    Column(name="environment_versions", source="plan", aggregate="first"),
    Column(name="environment_note", source="plan", aggregate="first"),
    # -- derived by the report (after the scenario arguments in raw_summary.csv) -----------
    _derived(
        "peak_memory_bytes",
        "bytes",
        aggregate="median",
        better="lower",
        label="peak mem GiB",
        raw=False,
    ),
    _derived("peak_memory_source", "", aggregate="first_ok", raw=False),
    _derived("usd_per_gpu_hour", "USD", raw=False),
    _derived("cost_per_run_usd", "USD", aggregate="median", label="$ per run", raw=False),
    _derived("time_per_epoch_s", "s", aggregate="median", label="time per epoch", raw=False),
    _derived("cost_per_epoch_usd", "USD", aggregate="median", label="$ per epoch", raw=False),
    _derived("time_to_train_s", "s", aggregate="median", raw=False),
    _derived("cost_to_train_usd", "USD", aggregate="median", raw=False),
)

#: The key columns, in order: what names an experiment (``plan.csv``'s columns).
KEY_COLUMNS: tuple[str, ...] = tuple(c.name for c in _DECLARED if c.key)

_registry: dict[str, Column] = {}
_by_alias: dict[str, str] = {}
#: ``columns()``, kept until the registry changes (tables ask for it once per row)
_columns: tuple[Column, ...] | None = None


def register(column: Column) -> Column:
    """Declare a further column (after the declared ones); returns it.

    Key columns are the plan's and cannot be added; a name (or alias) already
    declared is an error.
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
        raise KeyError(f"no column {name!r} is declared in orchestrator/contract/metrics.py")
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
    )


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
