"""Expand a validated config into the experiment matrix. Pure: no I/O, no processes.

Order (outermost first): scenario (file order) × framework_config × model ×
sweep values (keys in file order, the last key varying fastest) × num_gpus ×
effective_batch_size × max_seq_len × packing × repeat.

Trainer arguments merge as defaults < scenario arguments < sweep value <
framework overlay; ``key: null`` at a layer removes the key set below it. Each
cell builds its own dict, so nothing one scenario sets reaches another.
"""

from __future__ import annotations

import fnmatch
import hashlib
import itertools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestrator.config.scenarios import BenchConfig, Scenario
from orchestrator.config.values import NO_FRAMEWORK, canonical_json
from orchestrator.contract.errors import ConfigError, UserError
from orchestrator.matrix.experiment import Experiment
from orchestrator.matrix.ids import experiment_id

DEFAULT_EFFECTIVE_BATCH_SIZE = (4, 8)
DEFAULT_MAX_SEQ_LEN = (4096,)
DEFAULT_PACKING = (True,)
DEFAULT_GPU_COUNTS = (1, 2)
DEFAULT_CPU_PROCESSES = (1,)

# Merge layers, lowest first; a key set at a higher layer wins.
_DEFAULTS, _SCENARIO, _SWEEP, _FRAMEWORK = range(4)
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


@dataclass(frozen=True)
class Axis:
    values: tuple[Any, ...]
    #: where the values came from, for the plan header
    source: str


@dataclass(frozen=True)
class Plan:
    experiments: tuple[Experiment, ...]
    device: str
    device_source: str
    axes: Mapping[str, Axis]
    repeats: Axis
    scenarios: tuple[str, ...]
    #: argument names swept by at least one selected scenario, in first-seen order
    swept_keys: tuple[str, ...]
    notes: tuple[str, ...] = field(default=())


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
        for key, value in values.items():
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


def build_plan(config: BenchConfig, selection: Selection, gpu_count: int) -> Plan:
    """Select scenarios and expand them into experiments (with stable ids)."""
    device, device_source = resolve_device(selection.device, gpu_count)
    if selection.preview and selection.device == "auto" and not selection.filters:
        device, device_source = _preview_device(config, device, device_source)
    scenarios = select_scenarios(config, selection.filters, device, device_source)

    m = config.matrix
    if selection.num_gpus is not None:
        gpus = Axis(selection.num_gpus, "command line")
    elif m.num_gpus is not None:
        gpus = Axis(tuple(m.num_gpus), "scenarios file")
    else:
        gpus = Axis(*default_num_gpus(device, gpu_count))
    ebs = (
        Axis(selection.effective_batch_size, "command line")
        if selection.effective_batch_size is not None
        else _file_axis(m.effective_batch_size, DEFAULT_EFFECTIVE_BATCH_SIZE)
    )
    seqs = _file_axis(m.max_seq_len, DEFAULT_MAX_SEQ_LEN)
    packs = _file_axis(m.packing, DEFAULT_PACKING)
    if selection.repeats is not None:
        repeats = Axis((selection.repeats,), "command line")
    else:
        repeats = _file_axis([m.repeats] if m.repeats else None, (1,))
    n_repeats = int(repeats.values[0])

    experiments: list[Experiment] = []
    seen: dict[str, Experiment] = {}
    notes: list[str] = []
    swept_keys: dict[str, None] = {}

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
        swept_keys.update(dict.fromkeys(scenario.sweep))
        for cell in _expand_scenario(config, scenario, counts, ebs, seqs, packs, n_repeats):
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

    if not experiments:
        raise UserError(
            "the matrix is empty: "
            + ("; ".join(notes) if notes else "no scenario produced an experiment")
        )
    return Plan(
        experiments=tuple(experiments),
        device=device,
        device_source=device_source,
        axes={
            "num_gpus": gpus,
            "effective_batch_size": ebs,
            "max_seq_len": seqs,
            "packing": packs,
        },
        repeats=repeats,
        scenarios=tuple(s.name for s in scenarios),
        swept_keys=tuple(swept_keys),
        notes=tuple(notes),
    )


def _file_axis(values: Sequence[Any] | None, default: tuple[Any, ...]) -> Axis:
    if values is not None:
        return Axis(tuple(values), "scenarios file")
    return Axis(default, "default")


def _expand_scenario(
    config: BenchConfig,
    scenario: Scenario,
    gpu_counts: tuple[int, ...],
    ebs: Axis,
    seqs: Axis,
    packs: Axis,
    repeats: int,
) -> Iterator[Experiment]:
    for fw_name in scenario.frameworks:
        framework = config.frameworks[fw_name] if fw_name is not None else None
        fw_label = fw_name if fw_name is not None else NO_FRAMEWORK
        accelerate = (
            framework.accelerate
            if framework is not None and framework.accelerate is not None
            else config.default_accelerate
        )
        env = dict(framework.env) if framework is not None else {}
        # what the id hashes: the files a framework's env names by content, not place
        env_identity = framework.env_identity if framework is not None else None
        for model in scenario.models:
            for combo in _sweep_combos(scenario.sweep):
                merged, provenance = _merge(
                    [
                        (_DEFAULTS, config.defaults),
                        (_SCENARIO, scenario.arguments),
                        (_SWEEP, combo),
                        (_FRAMEWORK, framework.arguments if framework is not None else {}),
                    ]
                )
                merged["model_name_or_path"] = model
                eb_values = _axis_override(
                    config, scenario, merged, provenance, "effective_batch_size", ebs.values
                )
                seq_values = _axis_override(
                    config, scenario, merged, provenance, "max_seq_len", seqs.values
                )
                pack_values = _axis_override(
                    config, scenario, merged, provenance, "packing", packs.values
                )
                per_device = merged.get("per_device_train_batch_size")
                grad_accum = merged.get("gradient_accumulation_steps")
                base = {
                    "scenario": scenario.name,
                    "framework": fw_label,
                    "device": scenario.device,
                    "arguments": merged,
                    "data_processing": config.data_processing,
                    "accelerate_config": accelerate.digest if accelerate is not None else None,
                    "env": env_identity or env,
                }
                base_digest = hashlib.sha256(canonical_json(base).encode()).hexdigest()
                for n, eb, seq, pack in itertools.product(
                    gpu_counts, eb_values, seq_values, pack_values
                ):
                    try:
                        pd, ga = resolve_batch(
                            eb,
                            n,
                            per_device,
                            grad_accum,
                            per_device_layer=provenance.get("per_device_train_batch_size", 0),
                            grad_accum_layer=provenance.get("gradient_accumulation_steps", 0),
                        )
                    except ValueError as exc:
                        raise ConfigError(
                            f"{exc} (scenario '{scenario.name}', framework {fw_label}, "
                            f"model {model})",
                            **config.where(scenario),
                        ) from None
                    arguments = dict(merged)
                    arguments.update(
                        per_device_train_batch_size=pd,
                        gradient_accumulation_steps=ga,
                        max_seq_len=seq,
                        packing=pack,
                    )
                    digest = hashlib.sha256(
                        canonical_json(
                            {
                                "base": base_digest,
                                "num_gpus": n,
                                "effective_batch_size": eb,
                                "per_device_train_batch_size": pd,
                                "gradient_accumulation_steps": ga,
                                "max_seq_len": seq,
                                "packing": pack,
                            }
                        ).encode()
                    ).hexdigest()[:8]
                    ids = {
                        "scenario": scenario.name,
                        "model_name_or_path": model,
                        "framework": fw_label,
                        "num_gpus": n,
                        "effective_batch_size": eb,
                        "digest": digest,
                    }
                    cell_id = experiment_id(repeat=0, **ids)
                    for repeat in range(repeats):
                        yield Experiment(
                            experiment_id=experiment_id(repeat=repeat, **ids),
                            cell_id=cell_id,
                            scenario=scenario.name,
                            framework=fw_label,
                            model_name_or_path=model,
                            device=scenario.device,
                            num_gpus=n,
                            effective_batch_size=eb,
                            per_device_train_batch_size=pd,
                            gradient_accumulation_steps=ga,
                            max_seq_len=seq,
                            packing=pack,
                            repeat=repeat,
                            arguments=arguments,
                            swept=combo,
                            accelerate=accelerate,
                            env=env,
                            data_processing=config.data_processing,
                            timeout_s=scenario.timeout_s or config.timeout_s,
                        )
