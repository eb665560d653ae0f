"""Typed, validated configuration: the scenarios file, defaults.yaml and accelerate configs.

Files are read once, here. Pydantic checks their shape (``schema``); the checks
that need context (names that become paths, framework references, duplicates,
model lists) follow, and every failure is a ``ConfigError`` naming the file,
the line, the key path and what is allowed. Nothing downstream reads raw YAML.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from orchestrator.config.allocator import resolve_allocator
from orchestrator.config.environments import EnvironmentEntry, load_environments
from orchestrator.config.measure import measure_lines, resolve_measure
from orchestrator.config.schema import (
    ContentsFileModel,
    FrameworkModel,
    FrameworksFileModel,
    MatrixModel,
    ScenarioModel,
    ScenariosFileModel,
    scenarios_file_model,
    validate,
)
from orchestrator.config.schema import executor_sections as registered_sections
from orchestrator.config.search import Search, resolve_search
from orchestrator.config.values import (
    AXES,
    NO_FRAMEWORK,
    RESERVED_ARGUMENTS,
    canonical_json,
    check_model_name,
    check_name,
    check_unique,
    check_value,
    type_name,
)
from orchestrator.config.yamlio import Loc, YamlDoc, load_yaml
from orchestrator.contract.allocators import Allocator
from orchestrator.contract.applicability import (
    BACKEND_KEY,
    BATCH_SHARING_SIZES,
    RENAMED,
    TASK_KEY,
    TASKS,
    batch_sharing_problem,
    canonical_name,
    predecessor_argument,
    refused_argument,
    unknown_argument,
)
from orchestrator.contract.errors import ConfigError
from orchestrator.contract.plugins import CONFIG_ENV
from orchestrator.contract.steady import SteadyMeasure
from orchestrator.contract.trainers import trainer_names

# ---------------------------------------------------------------------------
# Resolved configuration (what the matrix is built from)
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class AccelerateConfig:
    """An accelerate config file: its absolute path and parsed content."""

    path: Path
    data: Mapping[str, Any]

    @property
    def distributed_type(self) -> str:
        """The distributed type it names, upper case (``NO`` where it names none)."""
        return str(self.data.get("distributed_type", "NO")).upper()

    @functools.cached_property
    def digest(self) -> str:
        """Hash of the parsed content: comments and formatting do not change it."""
        return hashlib.sha256(canonical_json(dict(self.data)).encode()).hexdigest()


@dataclass(frozen=True)
class Framework:
    name: str
    accelerate: AccelerateConfig | None
    arguments: Mapping[str, Any]
    env: Mapping[str, str]
    file: str
    line: int | None
    #: what experiment ids hash in place of ``env`` where it names files by their
    #: place on this machine (CONTENTS.yaml): the files' content, so ids agree
    #: across machines and folders
    env_identity: Mapping[str, str] | None = None
    #: the line of each of its arguments
    argument_lines: Mapping[str, int | None] = field(default_factory=dict)


@dataclass(frozen=True)
class Scenario:
    name: str
    index: int
    frameworks: tuple[str | None, ...]
    slow: bool
    device: str
    num_gpus: tuple[int, ...] | None
    models: tuple[str, ...]
    arguments: Mapping[str, Any]  # without model_name_or_path
    sweep: Mapping[str, tuple[Any, ...]]
    line: int | None
    timeout_s: float | None = None
    #: record ``profile_steps`` steps after the warm-up with torch.profiler
    profile: bool = False
    #: None: the default (``orchestrator.contract.window.DEFAULT_PROFILE_STEPS``)
    profile_steps: int | None = None
    #: what ``tunematrix fit`` searches for this scenario's cells (None: nothing)
    search: Search | None = None
    #: steady-state measuring (``measure: {until: steady}``); None: the fixed max_steps
    measure: SteadyMeasure | None = None
    #: the host memory allocator of its cells (its own ``allocator:``, else the file's);
    #: None: as the environment has it
    allocator: Allocator | None = None
    #: the line of each argument and sweep key (``arguments.<key>``, ``sweep.<key>``)
    lines: Mapping[str, int | None] = field(default_factory=dict)


@dataclass(frozen=True)
class BenchConfig:
    """Everything the matrix needs, validated."""

    scenarios_file: Path
    defaults_file: Path | None
    defaults: Mapping[str, Any]
    default_accelerate: AccelerateConfig | None
    frameworks: Mapping[str, Framework]
    matrix: MatrixModel
    data_processing: Mapping[str, Any] | None
    scenarios: tuple[Scenario, ...]
    timeout_s: float | None = None
    #: the file's ``launch:`` (None: not set; the command line's ``--launch`` wins)
    launch: str | None = None
    #: the file's ``allocator:``, every scenario's that names none (None: not set)
    allocator: Allocator | None = None
    usd_per_gpu_hour: float | None = None
    #: the file's price of a kWh and grams of CO2 per kWh (``cost:``)
    usd_per_kwh: float | None = None
    grams_co2_per_kwh: float | None = None
    #: the executors' sections of the file that it has, by executor name (``<executor>:``)
    executors: Mapping[str, BaseModel] = field(default_factory=dict)
    #: ``environments:`` as written (probed at plan time); empty: the running interpreter
    environments: tuple[EnvironmentEntry, ...] = ()
    #: the line of each argument of the defaults file, and of each key of the scenarios
    #: file's data_processing stanza (where a setting is refused after planning)
    defaults_lines: Mapping[str, int | None] = field(default_factory=dict)
    data_lines: Mapping[str, int | None] = field(default_factory=dict)

    def section(self, executor: str) -> BaseModel | None:
        """The file's section for ``executor``, where it has one."""
        return self.executors.get(executor)

    def where(self, scenario: Scenario, key: str | None = None) -> dict[str, Any]:
        """Keyword arguments of ``ConfigError`` pointing at ``scenario`` (at ``key``'s own
        line, ``arguments.<name>`` or ``sweep.<name>``, where it has one)."""
        loc = f"scenarios[{scenario.index}]" + (f".{key}" if key else "")
        line = scenario.lines.get(key) if key else None
        return {
            "file": str(self.scenarios_file),
            "line": scenario.line if line is None else line,
            "key": loc,
        }


# ---------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------


def _check_arguments(doc: YamlDoc, arguments: Mapping[str, Any], loc: Loc) -> None:
    for key, value in arguments.items():
        new = RENAMED.get(key)
        if new is not None and new in arguments:
            raise doc.error(
                f"'{key}' is the old name of '{new}', which is set too; keep one", (*loc, key)
            )
        if key in RESERVED_ARGUMENTS:
            hint = (
                "set num_gpus at the scenario level or under matrix:"
                if key == "num_gpus"
                else "set repeats under matrix: or with --repeats"
            )
            raise doc.error(f"'{key}' is not a trainer argument; {hint}", (*loc, key))
        unknown = None if key in AXES else unknown_argument(key)
        if unknown:
            raise doc.error(unknown, (*loc, key))
        problem = check_value(value, (*loc, key))
        if problem:
            raise doc.error(*problem)
        refused = refused_argument(key, value) or _value_problem(key, value)
        if refused:
            raise doc.error(refused, (*loc, key))


def _value_problem(key: str, value: Any) -> str | None:
    """Why ``key: value`` is refused whatever the cell: the predecessor's names without a
    counterpart here, and task or trainer names nothing runs."""
    if key == TASK_KEY and value not in TASKS:
        return f"task must be one of {', '.join(TASKS)}, got {value!r}"
    if key == BACKEND_KEY and value not in trainer_names():
        return f"trainer must be one of {', '.join(trainer_names())}, got {value!r}"
    return predecessor_argument(key, value)


def _check_axis_list(doc: YamlDoc, values: Sequence[Any] | None, loc: Loc) -> None:
    if values is None:
        return
    if not values:
        raise doc.error("empty list; give at least one value or remove the key", loc)
    check_unique(doc, values, loc, "value")


def load_accelerate_config(
    path: Path, *, file: str | None = None, line: int | None = None
) -> AccelerateConfig:
    """Load an accelerate config file; a missing or malformed one is a ``ConfigError``."""
    if not path.is_file():
        where = f" (referenced from {file}" + (f":{line}" if line else "") + ")" if file else ""
        raise ConfigError(f"accelerate config not found{where}", file=path)
    doc = load_yaml(path, "accelerate config")
    if not isinstance(doc.data, dict):
        raise ConfigError(
            f"an accelerate config must be a YAML mapping, got {type_name(doc.data)}", file=path
        )
    problem = check_value(doc.data, ())
    if problem:
        raise doc.error(*problem)
    parallelism = doc.data.get("parallelism_config")
    if isinstance(parallelism, dict):
        # accelerate copies these keys to its launch flags: parallelism_config_tp_size, ...
        names = (f"parallelism_config_{n}_size" for n in BATCH_SHARING_SIZES)
        refused = batch_sharing_problem({name: parallelism.get(name) for name in names})
        if refused:
            raise doc.error(refused, ("parallelism_config",))
    return AccelerateConfig(path=path.resolve(), data=doc.data)


def _load_frameworks(
    doc: YamlDoc,
    models: Mapping[str, FrameworkModel],
    into: dict[str, Framework],
    env_identity: Mapping[str, Mapping[str, str]] | None = None,
) -> None:
    base = Path(doc.file).parent
    for name, fw in models.items():
        loc: Loc = ("frameworks", name)
        problem = check_name(name, "framework name")
        if problem:
            raise doc.error(problem, loc)
        if name == NO_FRAMEWORK:
            raise doc.error(
                f"'{NO_FRAMEWORK}' is reserved for 'no overlay' (null in framework_config); "
                "choose another name",
                loc,
            )
        if name in into:
            other = into[name]
            raise doc.error(
                f"framework '{name}' is already defined in {other.file}"
                + (f":{other.line}" if other.line else ""),
                loc,
            )
        _check_arguments(doc, fw.arguments, (*loc, "arguments"))
        if "model_name_or_path" in fw.arguments:
            raise doc.error(
                "a framework overlay may not set model_name_or_path; list models in the scenario",
                (*loc, "arguments", "model_name_or_path"),
            )
        accelerate = None
        if fw.accelerate_config is not None:
            accelerate = load_accelerate_config(
                base / fw.accelerate_config,
                file=doc.file,
                line=doc.line_of((*loc, "accelerate_config")),
            )
        into[name] = Framework(
            name=name,
            accelerate=accelerate,
            arguments=dict(fw.arguments),
            env=dict(fw.env),
            file=doc.file,
            line=doc.line_of(loc),
            env_identity=(env_identity or {}).get(name),
            argument_lines={k: doc.line_of((*loc, "arguments", k)) for k in fw.arguments},
        )


def _contents_frameworks(
    doc: YamlDoc,
) -> tuple[dict[str, FrameworkModel], dict[str, dict[str, str]]]:
    """fms-acceleration's ``CONTENTS.yaml`` as framework overlays.

    Each shortname becomes a framework whose jobs get
    ``ACCELERATION_FRAMEWORK_CONFIG_FILE`` set to its file, resolved beside
    CONTENTS.yaml, as the predecessor's benchmark does. Returns the overlays
    and, for the ids, each one's file by name and content hash.
    """
    contents: ContentsFileModel = validate(doc, ContentsFileModel, "a CONTENTS.yaml")
    base = Path(doc.file).parent
    out: dict[str, FrameworkModel] = {}
    identity: dict[str, dict[str, str]] = {}
    for i, entry in enumerate(contents.framework_configs):
        loc: Loc = ("framework_configs", i)
        if entry.shortname in out:
            raise doc.error(f"shortname '{entry.shortname}' appears twice", (*loc, "shortname"))
        path = (base / entry.filename).resolve()
        if not path.is_file():
            raise doc.error(
                f"{entry.filename}: no such file beside {Path(doc.file).name} ({base})",
                (*loc, "filename"),
            )
        plugins = ", ".join(entry.plugins) or "none"
        out[entry.shortname] = FrameworkModel(
            description=f"fms-acceleration {entry.filename} (plugins: {plugins})",
            env={CONFIG_ENV: str(path)},
        )
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        identity[entry.shortname] = {CONFIG_ENV: f"{entry.filename}@sha256:{digest}"}
    return out, identity


def _resolve_scenario(
    doc: YamlDoc,
    index: int,
    sc: ScenarioModel,
    frameworks: Mapping[str, Framework],
    allocator: Allocator | None = None,
) -> Scenario:
    """Scenario ``index`` checked and resolved; ``allocator``: the file's, where it names none."""
    loc: Loc = ("scenarios", index)
    problem = check_name(sc.name, "scenario name")
    if problem:
        raise doc.error(problem, (*loc, "name"))

    fw_names = _frameworks_of(doc, sc, loc, frameworks)
    if sc.num_gpus is not None:
        _check_axis_list(doc, sc.num_gpus, (*loc, "num_gpus"))

    args_loc: Loc = (*loc, "arguments")
    _check_arguments(doc, sc.arguments, args_loc)
    arguments = dict(sc.arguments)
    for axis in AXES:
        value = arguments.get(axis)
        if isinstance(value, list):
            raise doc.error(
                f"'{axis}' is a matrix axis: give one value here, "
                f"or list several under sweep: {{{axis}: [...]}}",
                (*args_loc, axis),
            )

    sweep = _sweep_of(doc, sc, loc, arguments, [frameworks[f] for f in fw_names if f])

    models = _models_of(doc, arguments, sweep, args_loc)

    return Scenario(
        name=sc.name,
        index=index,
        frameworks=fw_names,
        slow=sc.slow,
        device=sc.device,
        num_gpus=tuple(sc.num_gpus) if sc.num_gpus is not None else None,
        models=models,
        arguments=arguments,
        sweep=sweep,
        line=doc.line_of(loc),
        timeout_s=sc.timeout_s,
        profile=sc.profile,
        profile_steps=sc.profile_steps,
        search=resolve_search(doc, sc.search, (*loc, "search")),
        measure=resolve_measure(doc, sc.measure, (*loc, "measure")),
        allocator=(
            resolve_allocator(doc, sc.allocator, (*loc, "allocator"))
            if sc.allocator is not None
            else allocator
        ),
        lines={
            **{f"arguments.{k}": doc.line_of((*args_loc, k)) for k in sc.arguments},
            **{f"sweep.{k}": doc.line_of((*loc, "sweep", k)) for k in sc.sweep},
            **measure_lines(doc, sc.measure, (*loc, "measure")),
        },
    )


def _frameworks_of(
    doc: YamlDoc, sc: ScenarioModel, loc: Loc, frameworks: Mapping[str, Framework]
) -> tuple[str | None, ...]:
    """The scenario's framework names, each defined and named once."""
    if sc.framework_config is None:
        return (None,)
    fl: Loc = (*loc, "framework_config")
    if not sc.framework_config:
        raise doc.error("empty list; use [null] for no overlay or remove the key", fl)
    check_unique(doc, sc.framework_config, fl, "framework")
    for i, fname in enumerate(sc.framework_config):
        if fname is not None and fname not in frameworks:
            defined = ", ".join(sorted(frameworks)) or "none are defined"
            raise doc.error(
                f"unknown framework '{fname}'; defined frameworks: {defined} "
                "(define it under frameworks: or pass --frameworks FILE)",
                (*fl, i),
            )
    return tuple(sc.framework_config)


def _sweep_of(
    doc: YamlDoc,
    sc: ScenarioModel,
    loc: Loc,
    arguments: Mapping[str, Any],
    overlays: list[Framework],
) -> dict[str, tuple[Any, ...]]:
    """The scenario's sweep, checked against its arguments and its frameworks' (``overlays``)."""
    sweep: dict[str, tuple[Any, ...]] = {}
    for key, values in sc.sweep.items():
        sl: Loc = (*loc, "sweep", key)
        if key in RESERVED_ARGUMENTS:
            raise doc.error(f"'{key}' cannot be swept; set it at the scenario level", sl)
        if canonical_name(key) in {canonical_name(a) for a in arguments}:
            raise doc.error(f"'{key}' is both a constant in arguments and swept; keep one", sl)
        twin = next((k for k in sweep if canonical_name(k) == canonical_name(key)), None)
        if twin is not None:
            raise doc.error(f"'{twin}' and '{key}' name one setting, swept twice; keep one", sl)
        unknown = None if key in AXES else unknown_argument(key)
        if unknown:
            raise doc.error(unknown, sl)
        if not values:
            raise doc.error("empty sweep list; give at least one value", sl)
        bad_value = check_value(values, sl)
        if bad_value:
            raise doc.error(*bad_value)
        check_unique(doc, values, sl, "sweep value")
        for i, value in enumerate(values):
            refused = refused_argument(key, value) or _value_problem(key, value)
            if refused:
                raise doc.error(refused, (*sl, i))
        for overlay in overlays:
            if canonical_name(key) in {canonical_name(a) for a in overlay.arguments}:
                raise doc.error(
                    f"'{key}' is swept here but framework '{overlay.name}' sets it; keep one", sl
                )
        sweep[key] = tuple(values)
    return sweep


def _models_of(
    doc: YamlDoc, arguments: dict[str, Any], sweep: dict[str, tuple[Any, ...]], args_loc: Loc
) -> tuple[str, ...]:
    """The scenario's models (taken out of ``arguments`` or ``sweep``), each checked."""
    raw_models = arguments.pop("model_name_or_path", None)
    if "model_name_or_path" in sweep:
        raw_models = list(sweep.pop("model_name_or_path"))
    if raw_models is not None:
        ml: Loc = (*args_loc, "model_name_or_path")
        items = raw_models if isinstance(raw_models, list) else [raw_models]
        if not items:
            raise doc.error("empty model list; give at least one model_name_or_path", ml)
        for i, model in enumerate(items):
            problem = check_model_name(model)
            if problem:
                raise doc.error(problem, (*ml, i) if isinstance(raw_models, list) else ml)
        check_unique(doc, items, ml, "model")
        return tuple(items)
    return ()


def load_defaults(path: Path | None) -> tuple[dict[str, Any], dict[str, int | None]]:
    """defaults.yaml: trainer arguments shared by all scenarios (empty if no file), and
    the line of each."""
    if path is None:
        return {}, {}
    doc = load_yaml(path, "defaults file")
    if doc.data is None:
        return {}, {}
    if not isinstance(doc.data, dict):
        raise ConfigError(
            f"a defaults file must be a mapping of trainer arguments, got {type_name(doc.data)}",
            file=path,
        )
    for key in doc.data:
        if not isinstance(key, str):
            raise doc.error(f"argument names must be strings, got {key!r}")
        if key in AXES:
            raise doc.error(
                f"'{key}' is a matrix axis; set it under matrix: in the scenarios file "
                "or in a scenario's arguments",
                (key,),
            )
    _check_arguments(doc, doc.data, ())
    if "model_name_or_path" in doc.data:
        value = doc.data["model_name_or_path"]
        for i, model in enumerate(value if isinstance(value, list) else [value]):
            problem = check_model_name(model)
            if problem:
                raise doc.error(problem, ("model_name_or_path", i))
    return dict(doc.data), {key: doc.line_of((key,)) for key in doc.data}


def _all_frameworks(
    doc: YamlDoc, model: ScenariosFileModel, frameworks_files: Sequence[Path]
) -> dict[str, Framework]:
    """The file's frameworks, then each frameworks file's (ours, or a predecessor's
    CONTENTS.yaml)."""
    frameworks: dict[str, Framework] = {}
    _load_frameworks(doc, model.frameworks, frameworks)
    for extra in frameworks_files:
        fdoc = load_yaml(extra, "frameworks file")
        if isinstance(fdoc.data, dict) and "framework_configs" in fdoc.data:
            overlays, identity = _contents_frameworks(fdoc)
            _load_frameworks(fdoc, overlays, frameworks, identity)
            continue
        fmodel: FrameworksFileModel = validate(fdoc, FrameworksFileModel, "a frameworks file")
        _load_frameworks(fdoc, fmodel.frameworks, frameworks)
    return frameworks


def _all_scenarios(
    doc: YamlDoc,
    model: ScenariosFileModel,
    frameworks: Mapping[str, Framework],
    allocator: Allocator | None,
    default_models: list[str] | None,
) -> list[Scenario]:
    """Every scenario resolved, the defaults' models where it names none, each name once."""
    scenarios: list[Scenario] = []
    seen: dict[str, int] = {}
    for i, sc in enumerate(model.scenarios):
        scenario = _resolve_scenario(doc, i, sc, frameworks, allocator)
        if not scenario.models:
            if not default_models:
                raise doc.error(
                    f"scenario '{scenario.name}' has no model; "
                    "set arguments.model_name_or_path (a name or a list)",
                    ("scenarios", i),
                )
            scenario = dataclasses.replace(scenario, models=tuple(default_models))
        if scenario.name in seen:
            first = model.scenarios[seen[scenario.name]]
            raise doc.error(
                f"duplicate scenario name '{first.name}' "
                f"(also scenarios[{seen[scenario.name]}], line "
                f"{doc.line_of(('scenarios', seen[scenario.name]))})",
                ("scenarios", i, "name"),
            )
        seen[scenario.name] = i
        scenarios.append(scenario)
    return scenarios


def load_config(
    scenarios_file: Path,
    *,
    defaults_file: Path | None,
    frameworks_files: Sequence[Path] = (),
    accelerate_config: Path | None = None,
    accelerate_fallback: Path | None = None,
    document: YamlDoc | None = None,
) -> BenchConfig:
    """Load and validate the scenarios file with its defaults and framework files.

    ``document``: the scenarios file already parsed (from a mapping given in
    code); ``scenarios_file`` then only names it and anchors relative paths.

    The default accelerate config (for frameworks that name none) is, first
    found: ``accelerate_config`` (the command line), the file's own
    ``accelerate_config:`` key (relative to the file), ``accelerate_fallback``.
    """
    doc = document if document is not None else load_yaml(scenarios_file, "scenarios file")
    # every registered executor's section (read through the executors' registry)
    executor_sections = registered_sections()
    file_model = scenarios_file_model(executor_sections)
    model: ScenariosFileModel = validate(doc, file_model, "a scenarios file")

    frameworks = _all_frameworks(doc, model, frameworks_files)
    if not model.scenarios:
        raise doc.error("no scenarios; define at least one", ("scenarios",))
    m = model.matrix
    for axis in ("num_gpus", "effective_batch_size", "max_seq_len", "packing"):
        _check_axis_list(doc, getattr(m, axis), ("matrix", axis))

    defaults, defaults_lines = load_defaults(defaults_file)
    default_models = defaults.pop("model_name_or_path", None)
    if isinstance(default_models, str):
        default_models = [default_models]

    allocator = resolve_allocator(doc, model.allocator, ("allocator",))
    scenarios = _all_scenarios(doc, model, frameworks, allocator, default_models)

    if accelerate_config is None and model.accelerate_config is not None:
        accelerate_config = scenarios_file.parent / model.accelerate_config
    if accelerate_config is None:
        accelerate_config = accelerate_fallback
    default_accelerate = (
        load_accelerate_config(accelerate_config, file=str(scenarios_file))
        if accelerate_config is not None
        else None
    )

    data = model.data_processing.model_dump(exclude_none=True) if model.data_processing else None
    if data is not None:
        problem = check_value(data, ("data_processing",))
        if problem:
            raise doc.error(*problem)

    return BenchConfig(
        scenarios_file=scenarios_file,
        defaults_file=defaults_file,
        defaults=defaults,
        default_accelerate=default_accelerate,
        frameworks=frameworks,
        matrix=m,
        data_processing=data,
        scenarios=tuple(scenarios),
        timeout_s=model.timeout_s,
        launch=model.launch,
        allocator=allocator,
        usd_per_gpu_hour=model.cost.usd_per_gpu_hour if model.cost else None,
        usd_per_kwh=model.cost.usd_per_kwh if model.cost else None,
        grams_co2_per_kwh=model.cost.grams_co2_per_kwh if model.cost else None,
        executors={
            name: getattr(model, name)
            for name in executor_sections
            if getattr(model, name) is not None
        },
        environments=(
            load_environments(doc, model.environments) if model.environments is not None else ()
        ),
        defaults_lines=defaults_lines,
        data_lines={key: doc.line_of(("data_processing", key)) for key in data or {}},
    )
