"""Expand a validated config into the experiment matrix. Pure: no I/O, no processes.

Expansion order (outermost first): scenario (file order) × framework_config × model ×
sweep values (keys in file order, the last key varying fastest) × num_gpus ×
effective_batch_size × max_seq_len × packing × environment (``environments:``) × repeat.
The plan's run order is ``orchestrator.matrix.order``'s (smaller cells first within a
model and GPU count, variants counterbalanced by repeat).

Trainer arguments merge as defaults < scenario arguments < sweep value <
framework overlay; ``key: null`` at a layer removes the key set below it. Each
cell builds its own dict, so nothing one scenario sets reaches another.

Every cell names its ``task`` and ``trainer`` (the defaults resolved: causal-lm,
and the task's default backend), so both are in its id and its key columns.
What does not apply to a cell's task, trainer or PEFT method
(``orchestrator.contract.applicability.inapplicable_argument``) is an error at the line
that wrote it, unless it comes from what every scenario shares (defaults.yaml, the
data_processing stanza, the ``matrix:`` axes): that is left out of the cells it does
not apply to (an axis is not crossed: ``max_seq_len`` and ``packing`` of an image
task stay empty), with a note in the plan.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import itertools
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestrator.config.environments import Environment
from orchestrator.config.measure import MeasureOverride
from orchestrator.config.scenarios import AccelerateConfig, BenchConfig, Scenario
from orchestrator.config.values import NO_FRAMEWORK
from orchestrator.contract.applicability import (
    ARGUMENT_TASKS,
    BACKEND_KEY,
    DEFAULT_TASK,
    EVAL_KEY,
    HOLDOUT_KEY,
    LORA_KEYS,
    RENAMED,
    TASK_KEY,
    Inapplicable,
    backend_only_fields,
    canonical_name,
    default_backend,
    inapplicable_argument,
)
from orchestrator.contract.errors import ConfigError, Place, UserError
from orchestrator.contract.modelnames import is_python_model
from orchestrator.contract.packing import masked_note, masked_per_document, trl_strategy
from orchestrator.matrix import frameworks
from orchestrator.matrix.experiment import Experiment, with_allocator
from orchestrator.matrix.ids import experiment_id, spec_digest, spec_hash
from orchestrator.matrix.measuring import measure_note, measure_of, measured
from orchestrator.matrix.order import order_experiments

# The plan types live in matrix.plan; importers of matrix.expand may still name them here.
from orchestrator.matrix.plan import Axis as Axis
from orchestrator.matrix.plan import Plan as Plan
from orchestrator.matrix.profiling import profile_note, profile_steps, profiled

DEFAULT_EFFECTIVE_BATCH_SIZE = (4, 8)
DEFAULT_MAX_SEQ_LEN = (4096,)
DEFAULT_PACKING = (True,)
DEFAULT_GPU_COUNTS = (1, 2)
DEFAULT_CPU_PROCESSES = (1,)

# Merge layers, lowest first; a key set at a higher layer wins.
_DEFAULTS, _SCENARIO, _SWEEP, _FRAMEWORK = range(4)
#: the source of an axis set by a flag (``Axis.source``)
COMMAND_LINE = "command line"
_LAYER_NAMES = {
    _DEFAULTS: "defaults.yaml",
    _SCENARIO: "the scenario's arguments",
    _SWEEP: "the sweep",
    _FRAMEWORK: "the framework overlay",
}


@dataclass(frozen=True)
class Selection:
    """What the command line (or the shell script's environment) asks for."""

    num_gpus: tuple[int, ...] | None = None
    effective_batch_size: tuple[int, ...] | None = None
    filters: tuple[str, ...] = ()
    #: ``auto`` (GPU if one is detected), ``gpu`` or ``cpu``
    device: str = "auto"
    repeats: int | None = None
    #: a preview (``plan``, DRY_RUN): with ``auto``, a file with no scenario for this
    #: machine is planned for its scenarios' own device rather than refused
    preview: bool = False
    #: ``--profile``: profile every cell; ``--profile-steps``: how many steps (both: the
    #: scenario's ``profile``/``profile_steps`` otherwise)
    profile: bool = False
    profile_steps: int | None = None
    #: ``--until``, ``--precision``, ``--min-steps``, ``--max-steps``: over every
    #: scenario's ``measure:`` (steady-state measuring, ``orchestrator.matrix.measuring``)
    measure: MeasureOverride = field(default_factory=MeasureOverride)


# ---------------------------------------------------------------------------
# Batch arithmetic
# ---------------------------------------------------------------------------


def resolve_batch(
    effective_batch_size: int,
    num_gpus: int,
    per_device: int | None,
    grad_accum: int | None,
    *,
    per_device_layer: int = _SCENARIO,
    grad_accum_layer: int = _SCENARIO,
) -> tuple[int, int]:
    """Per-device batch and gradient accumulation for an effective batch size.

    ``effective = per_device × grad_accum × num_gpus``. Whatever is not given
    is derived (nothing given: grad_accum 1). When both are given at the same
    layer they must multiply out exactly; when given at different layers the
    more specific one is kept and the other derived, so a scenario that sets
    ``per_device_train_batch_size`` over a default ``gradient_accumulation_steps``
    gets the accumulation it needs. Raises ``ValueError`` with the numbers.
    """
    eb, n = effective_batch_size, num_gpus
    for name, value in (
        ("per_device_train_batch_size", per_device),
        ("gradient_accumulation_steps", grad_accum),
    ):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if value is not None and value <= 0:
            raise ValueError(f"{name} must be a positive integer, got {value}")

    if per_device is not None and grad_accum is not None:
        if per_device_layer == grad_accum_layer:
            if per_device * grad_accum * n != eb:
                raise ValueError(
                    f"per_device_train_batch_size {per_device} × gradient_accumulation_steps "
                    f"{grad_accum} × num_gpus {n} = {per_device * grad_accum * n}, "
                    f"not effective_batch_size {eb}; set only one of the two"
                )
            return per_device, grad_accum
        if per_device_layer > grad_accum_layer:
            grad_accum = None
        else:
            per_device = None

    if per_device is not None:
        return per_device, _divide(
            eb,
            n * per_device,
            f"num_gpus {n} × per_device_train_batch_size {per_device}",
            "gradient_accumulation_steps",
        )
    grad_accum = 1 if grad_accum is None else grad_accum
    return _divide(
        eb,
        n * grad_accum,
        f"num_gpus {n} × gradient_accumulation_steps {grad_accum}",
        "per_device_train_batch_size",
    ), grad_accum


def _divide(eb: int, by: int, by_text: str, derived: str) -> int:
    if eb < by:
        raise ValueError(
            f"effective_batch_size {eb} is smaller than {by_text} = {by}, so {derived} would be 0"
        )
    if eb % by:
        raise ValueError(
            f"effective_batch_size {eb} is not divisible by {by_text} = {by} "
            f"({eb} / {by} = {eb / by:g})"
        )
    return eb // by


# ---------------------------------------------------------------------------
# Selection
# ---------------------------------------------------------------------------


def parse_filters(values: Sequence[str]) -> tuple[str, ...]:
    """``["a,b", "c d"]`` -> ``("a", "b", "c", "d")``: commas and spaces both separate."""
    out: list[str] = []
    for value in values:
        out.extend(p for p in value.replace(",", " ").split() if p)
    return tuple(dict.fromkeys(out))


def select_scenarios(
    config: BenchConfig, filters: Sequence[str], device: str, device_source: str = ""
) -> list[Scenario]:
    """The scenarios to plan.

    With filters (names or shell-style patterns such as ``peft-*``): every
    scenario a pattern matches, slow ones included; a pattern that matches
    nothing is an error. Without: every non-slow scenario for ``device``.
    """
    names = [s.name for s in config.scenarios]
    if filters:
        for pattern in filters:
            if not any(fnmatch.fnmatchcase(n, pattern) for n in names):
                raise UserError(
                    f"filter '{pattern}' matches no scenario in {config.scenarios_file}; "
                    f"scenarios: {_describe_scenarios(config)}"
                )
        return [s for s in config.scenarios if any(fnmatch.fnmatchcase(s.name, p) for p in filters)]
    chosen = [s for s in config.scenarios if not s.slow and s.device == device]
    theirs = {s.device for s in config.scenarios if not s.slow}
    if not chosen and len(theirs) == 1:
        (other,) = theirs
        raise UserError(
            f"every non-slow scenario in {config.scenarios_file} is for {other}, and this "
            f"run is for {device}{f' ({device_source})' if device_source else ''}; preview it "
            f"with DRY_RUN=true or `tunematrix plan`, run it on a {other} machine, or choose "
            f"--filter/--device; scenarios: {_describe_scenarios(config)}"
        )
    if not chosen:
        raise UserError(
            f"no non-slow scenario for device '{device}' in {config.scenarios_file}; "
            f"name scenarios with --filter, or choose --device; scenarios: "
            f"{_describe_scenarios(config)}"
        )
    return chosen


def _describe_scenarios(config: BenchConfig) -> str:
    parts = []
    for s in config.scenarios:
        tags = [t for t, on in (("slow", s.slow), ("cpu", s.device == "cpu")) if on]
        parts.append(s.name + (f" ({', '.join(tags)})" if tags else ""))
    return ", ".join(parts)


def default_num_gpus(device: str, gpu_count: int) -> tuple[tuple[int, ...], str]:
    """The GPU-count axis when neither the command line nor the file sets one."""
    if device == "cpu":
        return DEFAULT_CPU_PROCESSES, "default for CPU (processes)"
    if gpu_count > 0:
        capped = tuple(n for n in DEFAULT_GPU_COUNTS if n <= gpu_count)
        return capped, f"default, capped at the {gpu_count} GPU(s) detected"
    return DEFAULT_GPU_COUNTS, "default (no GPU detected here)"


def _preview_device(config: BenchConfig, device: str, source: str) -> tuple[str, str]:
    """The device to preview for: this machine's, or the scenarios' own when none is for it.

    Previewing a GPU matrix on a laptop is the point of a dry run; running it
    there is not, and ``run`` still refuses.
    """
    if any(not s.slow and s.device == device for s in config.scenarios):
        return device, source
    theirs = {s.device for s in config.scenarios if not s.slow}
    if len(theirs) != 1:
        return device, source
    (other,) = theirs
    return other, (
        f"{source}; previewing the scenarios' own device, {other}: "
        f"none is for {device}, and a run here would refuse"
    )


def resolve_device(requested: str, gpu_count: int) -> tuple[str, str]:
    if requested in ("gpu", "cpu"):
        return requested, "requested"
    if requested != "auto":
        raise UserError(f"device must be auto, gpu or cpu, got {requested!r}")
    if gpu_count > 0:
        return "gpu", f"{gpu_count} GPU(s) detected"
    return "cpu", "no GPU detected"


# ---------------------------------------------------------------------------
# Expansion
# ---------------------------------------------------------------------------


def _merge(
    layers: Sequence[tuple[int, Mapping[str, Any]]],
) -> tuple[dict[str, Any], dict[str, int]]:
    merged: dict[str, Any] = {}
    provenance: dict[str, int] = {}
    for layer, values in layers:
        for written, value in values.items():
            key = canonical_name(written)  # one spelling: an old name sets the new one
            if value is None:
                merged.pop(key, None)
                provenance.pop(key, None)
            else:
                merged[key] = value
                provenance[key] = layer
    return merged, provenance


def _sweep_combos(sweep: Mapping[str, Sequence[Any]]) -> Iterator[dict[str, Any]]:
    keys = list(sweep)
    for values in itertools.product(*(sweep[k] for k in keys)):
        yield dict(zip(keys, values, strict=True))


def _axis_override(
    config: BenchConfig,
    scenario: Scenario,
    merged: dict[str, Any],
    provenance: dict[str, int],
    name: str,
    default: tuple[Any, ...],
) -> tuple[Any, ...]:
    if name not in merged:
        return default
    value = merged.pop(name)
    layer = _LAYER_NAMES[provenance.pop(name)]
    if name == "packing":
        if not isinstance(value, bool):
            raise ConfigError(
                f"packing must be true or false, got {value!r} (from {layer})",
                **config.where(scenario),
            )
    elif isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(
            f"{name} must be a positive integer, got {value!r} (from {layer})",
            **config.where(scenario),
        )
    return (value,)


#: GPUs to plan for: a count, or a function that counts them (called only when
#: the plan needs a count: ``device="auto"``, or no GPU-count axis given)
GpuCount = int | Callable[[], int]


def build_plan(
    config: BenchConfig,
    selection: Selection,
    gpu_count: GpuCount,
    environments: Sequence[Environment] | None = None,
) -> Plan:
    """Select scenarios and expand them into experiments (with stable ids).

    ``environments``: the file's ``environments:`` already probed
    (``orchestrator.config.environments.resolve_all``), each cell running under each.
    """
    if config.environments and environments is None:
        raise ValueError("the scenarios file lists environments: probe them first (resolve_all)")
    envs: tuple[Environment | None, ...] = tuple(environments or ()) or (None,)
    count = _once(gpu_count)
    device, device_source = resolve_device(
        selection.device, count() if selection.device == "auto" else 0
    )
    if selection.preview and selection.device == "auto" and not selection.filters:
        device, device_source = _preview_device(config, device, device_source)
    scenarios = select_scenarios(config, selection.filters, device, device_source)
    axes, repeats = _axes(config, selection, device, count)
    gpus = axes["num_gpus"]
    n_repeats = int(repeats.values[0])

    experiments: list[Experiment] = []
    seen: dict[str, Experiment] = {}
    notes: list[str] = []
    swept_keys: dict[str, None] = {}
    checks = _Applicability(backend_only=backend_only_fields())

    for scenario in scenarios:
        counts = gpus.values
        if scenario.num_gpus is not None:
            counts = tuple(n for n in gpus.values if n in scenario.num_gpus)
            if not counts:
                notes.append(
                    f"scenario '{scenario.name}' is left out: it runs on num_gpus "
                    f"{list(scenario.num_gpus)}, the matrix has {list(gpus.values)}"
                )
                continue
        if scenario.device == "gpu" and device == "cpu":
            notes.append(f"scenario '{scenario.name}' needs GPUs; planned on the CPU as processes")
        swept_keys.update(dict.fromkeys(canonical_name(key) for key in scenario.sweep))
        profile = profile_steps(scenario, selection.profile, selection.profile_steps)
        if profile:
            notes.append(profile_note(scenario, profile))
        steady = measure_of(scenario, selection.measure)
        if steady is not None:
            notes.append(measure_note(scenario, steady))
        for cell in _expand_scenario(config, scenario, counts, axes, n_repeats, checks, envs):
            # steady state first: its step cap is the max_steps the profile is checked against
            cell = measured(config, scenario, cell, steady, profile)
            cell = profiled(config, scenario, cell, profile)
            cell = with_allocator(cell, scenario.allocator)
            other = seen.get(cell.experiment_id)
            if other is not None:
                # Every axis value, model, framework and sweep value is distinct by
                # validation, so this is a hash collision: refuse rather than let one
                # experiment overwrite another's folder.
                raise UserError(
                    f"two different experiments got the same id {cell.experiment_id}; "
                    "change a scenario name or an argument to separate them"
                )
            seen[cell.experiment_id] = cell
            experiments.append(cell)
        checks.settle(scenario.name)

    notes.extend(checks.notes())
    notes.extend(_old_names_note(config, scenarios))
    notes.extend(_per_document_notes(experiments))
    if not experiments:
        raise UserError(
            "the matrix is empty: "
            + ("; ".join(notes) if notes else "no scenario produced an experiment")
        )
    return Plan(
        # smaller cells first, variants counterbalanced by repeat; positions recorded
        experiments=order_experiments(experiments),
        device=device,
        device_source=device_source,
        axes=axes,
        repeats=repeats,
        scenarios=tuple(s.name for s in scenarios),
        swept_keys=tuple(swept_keys),
        notes=tuple(notes),
        environments=tuple(e for e in envs if e is not None),
        pinned_axes={k: dict(v) for k, v in checks.pinned.items()},
    )


def _old_names_note(config: BenchConfig, scenarios: Sequence[Scenario]) -> list[str]:
    """One line naming the old argument names the plan read as tunematrix's (``RENAMED``)."""
    written = [*config.defaults]
    for scenario in scenarios:
        written += [*scenario.arguments, *scenario.sweep]
        for name in scenario.frameworks:
            if name is not None and name in config.frameworks:
                written += [*config.frameworks[name].arguments]
    old = [key for key in dict.fromkeys(written) if key in RENAMED]
    if not old:
        return []
    pairs = ", ".join(f"{key} as {RENAMED[key]}" for key in old)
    return [f"old argument names read as the ones rows and ids use: {pairs}"]


def _once(gpu_count: GpuCount) -> Callable[[], int]:
    """``gpu_count`` as a function that counts at most once (counting costs a few ms)."""
    if isinstance(gpu_count, int):
        fixed = gpu_count
        return lambda: fixed
    return functools.cache(gpu_count)


def _axes(
    config: BenchConfig, selection: Selection, device: str, count: Callable[[], int]
) -> tuple[dict[str, Axis], Axis]:
    """The four axes of the matrix (num_gpus, effective_batch_size, max_seq_len,
    packing) and the repeats, each from the command line, else the file, else the
    default."""
    m = config.matrix
    if selection.num_gpus is not None:
        gpus = Axis(selection.num_gpus, COMMAND_LINE)
    elif m.num_gpus is not None:
        gpus = Axis(tuple(m.num_gpus), "scenarios file")
    else:
        gpus = Axis(*default_num_gpus(device, count() if device != "cpu" else 0))
    ebs = (
        Axis(selection.effective_batch_size, COMMAND_LINE)
        if selection.effective_batch_size is not None
        else _file_axis(m.effective_batch_size, DEFAULT_EFFECTIVE_BATCH_SIZE)
    )
    if selection.repeats is not None:
        repeats = Axis((selection.repeats,), COMMAND_LINE)
    else:
        repeats = _file_axis([m.repeats] if m.repeats else None, (1,))
    axes = {
        "num_gpus": gpus,
        "effective_batch_size": ebs,
        "max_seq_len": _file_axis(m.max_seq_len, DEFAULT_MAX_SEQ_LEN),
        "packing": _file_axis(m.packing, DEFAULT_PACKING),
    }
    return axes, repeats


def _file_axis(values: Sequence[Any] | None, default: tuple[Any, ...]) -> Axis:
    if values is not None:
        return Axis(tuple(values), "scenarios file")
    return Axis(default, "default")


# ---------------------------------------------------------------------------
# One scenario: framework overlay × model × sweep value (a variant), then the
# axes of each variant (a cell), then the repeats of each cell (an experiment)
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Overlay:
    """One entry of a scenario's ``framework_config``, resolved."""

    #: the framework's name, ``none`` for a ``null`` entry
    label: str
    arguments: Mapping[str, Any]
    #: the framework's accelerate config, else the file's default one
    accelerate: AccelerateConfig | None
    env: dict[str, str]
    #: what the id hashes for ``env``: the files a framework's env names, by content
    #: rather than by place (CONTENTS.yaml), else ``env`` itself
    env_identity: Mapping[str, str]


def _overlay(config: BenchConfig, name: str | None) -> _Overlay:
    if name is None:
        return _Overlay(NO_FRAMEWORK, {}, config.default_accelerate, {}, {})
    framework = config.frameworks[name]
    env = dict(framework.env)
    return _Overlay(
        label=name,
        arguments=framework.arguments,
        accelerate=(
            framework.accelerate if framework.accelerate is not None else config.default_accelerate
        ),
        env=env,
        env_identity=framework.env_identity or env,
    )


@dataclass(frozen=True)
class _Variant:
    """A scenario × framework overlay × model × sweep value: its trainer arguments
    merged, the axis values it keeps, and the digest of everything but the axes."""

    scenario: Scenario
    overlay: _Overlay
    model: str
    swept: dict[str, Any]
    #: the merged arguments, without the axes the arguments may pin
    arguments: dict[str, Any]
    #: per argument, the merge layer that set it
    provenance: dict[str, int]
    effective_batch_size: tuple[int, ...]
    #: (None,) where the task takes no such setting: the axis is not crossed
    max_seq_len: tuple[int | None, ...]
    packing: tuple[bool | None, ...]
    #: the data_processing stanza, less what the task does not take
    data_processing: Mapping[str, Any] | None
    #: SHA-256 of what the cell ids share: scenario, framework, arguments, data, accelerate, env
    base_digest: str
    #: where each setting was written (``_places``)
    places: Mapping[str, Place] = field(default_factory=dict)
    #: where each axis value came from: "command line", "scenarios file", "default",
    #: or the layer of an argument that pinned it
    axis_sources: Mapping[str, str] = field(default_factory=dict)


@dataclass
class _Applicability:
    """What a plan's variants are checked against, what the shared settings left out, and
    the scenario's own settings a swept value left out of some of its cells."""

    #: the settings only some trainer backends take -> those backends (read once per plan)
    backend_only: Mapping[str, tuple[str, ...]]
    #: (where it was set, why it does not apply, scenario) -> the keys left out
    left_out: dict[tuple[str, str, str], dict[str, None]] = field(default_factory=dict)
    #: (scenario, key) -> the refusal of a setting a swept value left out of a cell
    deferred: dict[tuple[str, str], ConfigError] = field(default_factory=dict)
    #: (scenario, key) of the settings the scenario wrote that applied to some cell
    applied: set[tuple[str, str]] = field(default_factory=set)
    #: one line per framework whose cells a scenario's device cannot run, left out
    #: whole (``orchestrator.matrix.frameworks.cpu_refusal``)
    refused: dict[str, None] = field(default_factory=dict)
    #: scenario -> axis -> where a setting of that scenario pinned the axis (the plan header)
    pinned: dict[str, dict[str, str]] = field(default_factory=dict)

    def leave_out(self, where: str, key: str, why: str, scenario: str) -> None:
        self.left_out.setdefault((where, why, scenario), {})[key] = None

    def settle(self, scenario: str) -> None:
        """Refuse a setting of ``scenario`` that its sweep left out of every cell."""
        for (name, key), error in self.deferred.items():
            if name == scenario and (name, key) not in self.applied:
                raise error

    def notes(self) -> list[str]:
        """One line per setting (or settings) left out, naming the scenarios."""
        grouped: dict[tuple[str, str, tuple[str, ...]], list[str]] = {}
        for (where, why, scenario), keys in self.left_out.items():
            grouped.setdefault((where, why, tuple(keys)), []).append(scenario)
        return [
            f"{where}'s {' and '.join(keys)} {'is' if len(keys) == 1 else 'are'} left out of "
            f"{', '.join(scenarios)}: {why}"
            for (where, why, keys), scenarios in grouped.items()
        ] + list(self.refused)


def _per_document_notes(experiments: Sequence[Experiment]) -> list[str]:
    """One line per scenario whose cells hand packing to TRL with a per-document strategy
    under an attention implementation that takes no per-document lengths."""
    found: dict[tuple[str, str, str | None], None] = {}
    for e in experiments:
        # a packing strategy is an argument only the sft backend takes: any other cell's
        # was refused or left out by the applicability check
        strategy = trl_strategy(e.packing, e.arguments)
        attn = e.arguments.get("attn_implementation")
        if masked_per_document(strategy, attn):
            found[(e.scenario, str(strategy), attn)] = None
    return [
        f"scenario '{scenario}': {masked_note(strategy, attn)}"
        for scenario, strategy, attn in found
    ]


def _written(values: Mapping[str, Any], key: str) -> str:
    """How ``values`` spells argument ``key`` (its old name, ``RENAMED``, or the key)."""
    return next((k for k in values if canonical_name(k) == key and k != key), key)


def _place(
    config: BenchConfig, scenario: Scenario, overlay: _Overlay, key: str, layer: int
) -> dict[str, Any]:
    """Keyword arguments of ``ConfigError`` pointing at the line that set ``key`` (as the
    line spells it)."""
    if layer == _FRAMEWORK and overlay.label in config.frameworks:
        framework = config.frameworks[overlay.label]
        key = _written(framework.arguments, key)
        line = framework.argument_lines.get(key)
        return {
            "file": framework.file,
            "line": framework.line if line is None else line,
            "key": f"frameworks.{framework.name}.arguments.{key}",
        }
    if layer == _SWEEP:
        return config.where(scenario, f"sweep.{_written(scenario.sweep, key)}")
    if layer == _DEFAULTS:
        key = _written(config.defaults, key)
        return {"file": config.defaults_file, "line": config.defaults_lines.get(key), "key": key}
    return config.where(scenario, f"arguments.{_written(scenario.arguments, key)}")


def _places(
    config: BenchConfig, variant: _Variant, data_processing: Mapping[str, Any] | None
) -> dict[str, Place]:
    """Where each of a variant's settings was written: its arguments, the data stanza's
    keys, and the scenario itself (``""``: what a setting without a line of its own names)."""

    def place(where: Mapping[str, Any]) -> Place:
        file = where.get("file")
        return Place(str(file) if file is not None else None, where.get("line"), where.get("key"))

    places = {"": place(config.where(variant.scenario))}
    for key in data_processing or {}:
        places[key] = Place(
            str(config.scenarios_file), config.data_lines.get(key), f"data_processing.{key}"
        )
    for key, layer in variant.provenance.items():
        places[key] = place(_place(config, variant.scenario, variant.overlay, key, layer))
    framework = config.frameworks.get(variant.overlay.label)
    if framework is not None:
        # what its environment or accelerate config asks (fms-acceleration's plugins):
        # the framework's own entry
        places["framework_config"] = Place(
            framework.file, framework.line, f"framework '{framework.name}'"
        )
    # the model: a scenario's list (or sweep), else the defaults'
    model = [
        k
        for k in ("sweep.model_name_or_path", "arguments.model_name_or_path")
        if k in variant.scenario.lines
    ]
    if model:
        places["model_name_or_path"] = place(config.where(variant.scenario, model[0]))
    elif "model_name_or_path" in config.defaults_lines:
        places["model_name_or_path"] = Place(
            str(config.defaults_file),
            config.defaults_lines["model_name_or_path"],
            "model_name_or_path",
        )
    return places


def _decider(key: str, backend_only: Mapping[str, tuple[str, ...]]) -> str | None:
    """The argument that decides whether ``key`` applies: the task (for a task's setting,
    and the trainer), the PEFT method (LoRA's), ``eval`` (``holdout``) or the trainer
    (a backend's own: ``SFTConfig``'s)."""
    name = RENAMED.get(key, key)
    if key == BACKEND_KEY or name in ARGUMENT_TASKS:
        return TASK_KEY
    if name in LORA_KEYS:
        return "peft_method"
    if name == HOLDOUT_KEY:
        return EVAL_KEY
    if key in backend_only:
        return BACKEND_KEY
    return None


def _check_applicable(
    config: BenchConfig,
    scenario: Scenario,
    overlay: _Overlay,
    swept: Mapping[str, Any],
    merged: dict[str, Any],
    provenance: dict[str, int],
    checks: _Applicability,
) -> str:
    """Resolve the variant's task and trainer into ``merged`` and refuse what does not
    apply to them, at the line that wrote it. Left out instead, with a note: what
    defaults.yaml set, and a setting of the scenario (or its framework) in the cells
    where a swept value (``peft_method: none``, another task or trainer) makes it
    mean nothing, as long as it applies to one of the scenario's cells. Returns the task.
    """
    task = merged.get(TASK_KEY, DEFAULT_TASK)

    def refuse(key: str, problem: Inapplicable) -> ConfigError:
        layer = provenance.get(key, _SCENARIO)
        # the swept values that make the cell what it is: the key's own, then those
        # that decide whether it applies
        swept_here = [
            f"{k}: {swept[k]}"
            for k in dict.fromkeys((key, TASK_KEY, BACKEND_KEY, "peft_method"))
            if k in swept and provenance.get(k, _SWEEP) == _SWEEP
        ]
        parts = [f"the sweep's {', '.join(swept_here)}"] if swept_here else []
        if layer == _FRAMEWORK:
            parts.insert(0, f"framework '{overlay.label}', scenario '{scenario.name}'")
        context = f" ({', '.join(parts)})" if parts else ""
        return ConfigError(problem.line + context, **_place(config, scenario, overlay, key, layer))

    def settle(key: str, problem: Inapplicable | None) -> None:
        layer = provenance.get(key)
        if problem is None:
            if layer != _DEFAULTS:
                checks.applied.add((scenario.name, key))
            return
        decider = _decider(key, checks.backend_only)
        swept_decider = (
            decider is not None
            and decider in swept
            and provenance.get(decider, _SWEEP) == _SWEEP
            and layer in (_SCENARIO, _FRAMEWORK)
        )
        if layer == _DEFAULTS:
            where = config.defaults_file.name if config.defaults_file else "the defaults"
            why = problem.why
        elif swept_decider:
            # a constant the sweep turns off here; refused if no cell takes it
            where = "the scenario" if layer == _SCENARIO else f"framework {overlay.label}"
            why = f"{problem.why} (the sweep's {decider}: {swept[str(decider)]})"
            checks.deferred.setdefault((scenario.name, key), refuse(key, problem))
        else:
            raise refuse(key, problem)
        merged.pop(key)
        provenance.pop(key, None)
        checks.leave_out(where, key, why, scenario.name)

    for key in (TASK_KEY, BACKEND_KEY):
        if key in merged:
            settle(
                key,
                inapplicable_argument(
                    key, merged[key], task=task, backend="", arguments=merged, backend_only={}
                ),
            )
    merged[TASK_KEY] = task
    backend = merged.setdefault(BACKEND_KEY, default_backend(task))
    for key in list(merged):
        if key in (TASK_KEY, BACKEND_KEY, "model_name_or_path"):
            continue
        settle(
            key,
            inapplicable_argument(
                key,
                merged[key],
                task=task,
                backend=backend,
                arguments=merged,
                backend_only=checks.backend_only,
            ),
        )
    return str(task)


def _task_data(
    config: BenchConfig, scenario: Scenario, task: str, checks: _Applicability
) -> Mapping[str, Any] | None:
    """The data_processing stanza less the settings ``task`` does not take (noted)."""
    stanza = config.data_processing
    if not stanza:
        return stanza
    kept = {}
    for key, value in stanza.items():
        tasks = ARGUMENT_TASKS.get(key)
        if tasks is not None and task not in tasks:
            why = f"'{key}' means nothing for task {task}"
            checks.leave_out("data_processing", key, why, scenario.name)
        else:
            kept[key] = value
    return kept


def _variant(
    config: BenchConfig,
    scenario: Scenario,
    overlay: _Overlay,
    model: str,
    swept: dict[str, Any],
    axes: Mapping[str, Axis],
    checks: _Applicability,
) -> _Variant:
    merged, provenance = _merge(
        [
            (_DEFAULTS, config.defaults),
            (_SCENARIO, scenario.arguments),
            (_SWEEP, swept),
            (_FRAMEWORK, overlay.arguments),
        ]
    )
    merged["model_name_or_path"] = model
    task = _check_applicable(config, scenario, overlay, swept, merged, provenance, checks)
    # an argument that pins an axis replaces the axis for this variant (and leaves
    # the arguments, so the id hashes it once, as the axis value); an axis the task
    # takes no value of is not crossed
    pinned: dict[str, tuple[Any, ...]] = {}
    sources = {name: axis.source for name, axis in axes.items()}
    for name in ("effective_batch_size", "max_seq_len", "packing"):
        if task in ARGUMENT_TASKS.get(name, (task,)):
            if name in provenance:
                sources[name] = _LAYER_NAMES[provenance[name]]
                checks.pinned.setdefault(scenario.name, {})[name] = sources[name]
            pinned[name] = _axis_override(
                config, scenario, merged, provenance, name, axes[name].values
            )
        else:
            pinned[name] = (None,)
            checks.leave_out("the matrix", name, f"task {task} takes none", scenario.name)
    data_processing = _task_data(config, scenario, task, checks)
    base = {
        "scenario": scenario.name,
        "framework": overlay.label,
        "device": scenario.device,
        "arguments": merged,
        "data_processing": data_processing,
        "accelerate_config": overlay.accelerate.digest if overlay.accelerate is not None else None,
        "env": overlay.env_identity,
    }
    variant = _Variant(
        scenario=scenario,
        overlay=overlay,
        model=model,
        swept=swept,
        arguments=merged,
        provenance=provenance,
        effective_batch_size=pinned["effective_batch_size"],
        max_seq_len=pinned["max_seq_len"],
        packing=pinned["packing"],
        data_processing=data_processing,
        base_digest=spec_digest(base),
        axis_sources=sources,
    )
    return dataclasses.replace(variant, places=_places(config, variant, data_processing))


def _batch_split(
    config: BenchConfig, variant: _Variant, num_gpus: int, effective_batch_size: int
) -> tuple[int, int]:
    """Per-device batch and accumulation of one cell; an impossible split names the cell."""
    try:
        return resolve_batch(
            effective_batch_size,
            num_gpus,
            variant.arguments.get("per_device_train_batch_size"),
            variant.arguments.get("gradient_accumulation_steps"),
            per_device_layer=variant.provenance.get("per_device_train_batch_size", _DEFAULTS),
            grad_accum_layer=variant.provenance.get("gradient_accumulation_steps", _DEFAULTS),
        )
    except ValueError as exc:
        cell = (
            f"(scenario '{variant.scenario.name}', framework {variant.overlay.label}, "
            f"model {variant.model})"
        )
        sources = variant.axis_sources
        flags = [
            f"{flag} {value}"
            for name, flag, value in (
                ("effective_batch_size", "--effective-batch-size", effective_batch_size),
                ("num_gpus", "--num-gpus", num_gpus),
            )
            if sources.get(name) == COMMAND_LINE
        ]
        if not flags:
            raise ConfigError(f"{exc} {cell}", **config.where(variant.scenario)) from None
        # a value from a flag: the flag is named first; the file only where it set the split
        pinned = any(
            variant.provenance.get(name, _DEFAULTS) != _DEFAULTS
            for name in ("per_device_train_batch_size", "gradient_accumulation_steps")
        )
        where = config.where(variant.scenario) if pinned else {}
        raise ConfigError(f"{' with '.join(flags)}: {exc} {cell}", **where) from None


def _cell_experiments(
    config: BenchConfig,
    variant: _Variant,
    num_gpus: int,
    effective_batch_size: int,
    max_seq_len: int | None,
    packing: bool | None,
    repeats: int,
    environment: Environment | None = None,
) -> Iterator[Experiment]:
    """The repeats of one cell; the cell's id is its first repeat's."""
    per_device, grad_accum = _batch_split(config, variant, num_gpus, effective_batch_size)
    batch: dict[str, Any] = {
        "per_device_train_batch_size": per_device,
        "gradient_accumulation_steps": grad_accum,
    }
    # settings the task takes no value of are left out (an image has no sequence length)
    batch.update(
        (name, value)
        for name, value in (("max_seq_len", max_seq_len), ("packing", packing))
        if value is not None
    )
    digest = spec_hash(
        {
            "base": variant.base_digest,
            "num_gpus": num_gpus,
            "effective_batch_size": effective_batch_size,
            **batch,
            # hashed only with an environment, so other ids stay as they were
            **({"environment": environment.digest} if environment is not None else {}),
        }
    )
    ids = functools.partial(
        experiment_id,
        scenario=variant.scenario.name,
        model_name_or_path=variant.model,
        framework=variant.overlay.label,
        num_gpus=num_gpus,
        effective_batch_size=effective_batch_size,
        digest=digest,
        environment=environment.name if environment is not None else None,
    )
    cell_id = ids(repeat=0)
    arguments = {**variant.arguments, **batch}
    for repeat in range(repeats):
        yield Experiment(
            experiment_id=ids(repeat=repeat),
            cell_id=cell_id,
            scenario=variant.scenario.name,
            framework=variant.overlay.label,
            model_name_or_path=variant.model,
            device=variant.scenario.device,
            num_gpus=num_gpus,
            effective_batch_size=effective_batch_size,
            per_device_train_batch_size=per_device,
            gradient_accumulation_steps=grad_accum,
            max_seq_len=max_seq_len,
            packing=packing,
            repeat=repeat,
            arguments=arguments,
            swept=variant.swept,
            accelerate=variant.overlay.accelerate,
            env=variant.overlay.env,
            data_processing=variant.data_processing,
            timeout_s=variant.scenario.timeout_s or config.timeout_s,
            python_path=(str(config.scenarios_file.parent.resolve()),)
            if is_python_model(variant.model)
            else (),
            environment=environment,
            places=variant.places,
        )


def _expand_scenario(
    config: BenchConfig,
    scenario: Scenario,
    gpu_counts: tuple[int, ...],
    axes: Mapping[str, Axis],
    repeats: int,
    checks: _Applicability,
    environments: tuple[Environment | None, ...] = (None,),
) -> Iterator[Experiment]:
    for name in scenario.frameworks:
        overlay = _overlay(config, name)
        refusal = frameworks.cpu_refusal(overlay.accelerate) if scenario.device == "cpu" else None
        if refusal:
            where = config.where(scenario)
            at = where["file"] + (f":{where['line']}" if where["line"] else "")
            checks.refused[
                f"framework {overlay.label} is left out of scenario '{scenario.name}' ({at}) "
                f"on the CPU: {refusal}"
            ] = None
            continue
        for model in scenario.models:
            for written in _sweep_combos(scenario.sweep):
                # one spelling: a swept old name is the setting rows and ids name
                swept = {canonical_name(key): value for key, value in written.items()}
                variant = _variant(config, scenario, overlay, model, swept, axes, checks)
                # the environments of a cell next to each other (then its repeats)
                for n, eb, seq, pack, env in itertools.product(
                    gpu_counts,
                    variant.effective_batch_size,
                    variant.max_seq_len,
                    variant.packing,
                    environments,
                ):
                    yield from _cell_experiments(config, variant, n, eb, seq, pack, repeats, env)
