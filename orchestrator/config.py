"""Typed, validated configuration: the scenarios file, defaults.yaml and accelerate configs.

Files are read once, here. Pydantic checks their shape (unknown keys, types);
the checks that need context (names that become paths, framework references,
duplicates, model lists) follow, and every failure is a ``ConfigError`` naming
the file, the line, the key path and what is allowed. Nothing downstream reads
raw YAML.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import re
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from orchestrator.errors import ConfigError
from orchestrator.yamlio import Loc, YamlDoc, format_loc, load_yaml

# ---------------------------------------------------------------------------
# Names and values
# ---------------------------------------------------------------------------

#: Matrix axes: set under ``matrix:`` (or on the command line); a scenario may
#: pin one in its ``arguments`` or sweep it, but defaults.yaml may not set them.
AXES = ("effective_batch_size", "max_seq_len", "packing")

#: Keys that are not trainer arguments and so may not appear in ``arguments``.
RESERVED_ARGUMENTS = ("num_gpus", "repeat", "repeats")

#: The framework label used for "no overlay" (``null`` in ``framework_config``).
NO_FRAMEWORK = "none"

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_NAME_MAX = 64
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")


def check_name(value: str, what: str) -> str | None:
    """Why ``value`` cannot name a scenario or framework, or None if it can.

    These names become parts of experiment ids, which are folder names under
    the results folder, so nothing that could leave that folder is allowed.
    """
    if "\x00" in value:
        return f"{what} {value!r} contains a NUL character"
    if not value:
        return f"{what} is empty"
    if "/" in value or "\\" in value or value.startswith("."):
        return (
            f"{what} {value!r} would escape the results folder; "
            "use letters, digits, '-', '_' and '.', starting with a letter or digit"
        )
    if ".." in value:
        return f"{what} {value!r} must not contain '..'"
    if not _NAME_RE.match(value):
        return (
            f"{what} {value!r} has characters that are not allowed; "
            "use letters, digits, '-', '_' and '.', starting with a letter or digit"
        )
    if len(value) > _NAME_MAX:
        return f"{what} {value!r} is longer than {_NAME_MAX} characters"
    return None


def check_model_name(value: object) -> str | None:
    """Why ``value`` cannot be a ``model_name_or_path``, or None if it can.

    Hub ids, local folders (relative or absolute) and ``config:<arch>`` are
    all fine: a model name never becomes a path under the results folder, only
    a sanitised short form of it does (see ``orchestrator.ids``).
    """
    if not isinstance(value, str):
        return f"a model name must be a string, got {_type_name(value)} {value!r}"
    if not value:
        return "a model name is empty"
    if "\x00" in value:
        return f"model name {value!r} contains a NUL character"
    if _CONTROL_RE.search(value):
        return f"model name {value!r} contains a control character"
    if value != value.strip():
        return f"model name {value!r} has leading or trailing spaces"
    return None


def _type_name(value: object) -> str:
    return {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean"}.get(
        type(value), type(value).__name__
    )


def check_value(value: object, loc: Loc) -> tuple[str, Loc] | None:
    """Why ``value`` is not a plain JSON value (None if it is), and where.

    Arguments travel to the child as JSON (``spec.json``), so only JSON types
    are allowed: null, booleans, numbers, strings, lists and string-keyed maps.
    """
    if value is None or isinstance(value, (bool, int, str)):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else (f"{value} is not a finite number", loc)
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            problem = check_value(item, (*loc, i))
            if problem:
                return problem
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return (f"mapping keys must be strings, got {key!r}", loc)
            problem = check_value(item, (*loc, key))
            if problem:
                return problem
        return None
    return (f"unsupported value {value!r} ({type(value).__name__}); quote it as a string", loc)


def canonical_json(value: Any) -> str:
    """The one JSON text of ``value`` used for hashing: sorted keys, no spaces."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)


# ---------------------------------------------------------------------------
# File shapes (pydantic)
# ---------------------------------------------------------------------------

PositiveInt = Annotated[int, Field(gt=0)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class FrameworkModel(_Strict):
    """A named overlay that scenarios list under ``framework_config``."""

    description: str | None = None
    #: accelerate config file for this framework, relative to the file that defines it
    accelerate_config: str | None = None
    #: trainer arguments that override the scenario's
    arguments: dict[str, Any] = {}
    #: extra environment variables for the job
    env: dict[str, str] = {}


class MatrixModel(_Strict):
    """Axes crossed with every scenario; the command line overrides them."""

    num_gpus: list[PositiveInt] | None = None
    effective_batch_size: list[PositiveInt] | None = None
    max_seq_len: list[PositiveInt] | None = None
    packing: list[bool] | None = None
    #: how many times each cell runs, each in a fresh process
    repeats: PositiveInt | None = None


class DataProcessingModel(_Strict):
    """The predecessor's ``data_processing`` stanza: how the training data is prepared."""

    dataset_name: str | None = None
    dataset_split: str | None = None
    formatting: str | None = None
    tokenize: bool | None = None
    input_field: str | None = None
    dataset_text_field: str | None = None
    response_field: str | None = None
    chat_template: str | None = None
    response_template: str | None = None
    additional_dataset_kwargs: dict[str, Any] | None = None


class ScenarioModel(_Strict):
    """One scenario: constants, the models to try, frameworks and sweeps."""

    name: str
    description: str | None = None
    #: framework names to cross with (``null`` = no overlay); default ``[null]``
    framework_config: list[str | None] | None = None
    #: slow scenarios run only when the filter names them
    slow: bool = False
    #: ``gpu`` scenarios are the default on GPU machines, ``cpu`` ones elsewhere
    device: Literal["gpu", "cpu"] = "gpu"
    #: restrict the GPU counts of the matrix to these
    num_gpus: list[PositiveInt] | None = None
    #: trainer arguments; a list under ``model_name_or_path`` expands
    arguments: dict[str, Any] = {}
    #: explicit cartesian sweep: argument name -> values
    sweep: dict[str, list[Any]] = {}


class ScenariosFileModel(_Strict):
    """The whole scenarios file; a superset of fms-acceleration's format."""

    accelerate_config: str | None = None
    frameworks: dict[str, FrameworkModel] = {}
    matrix: MatrixModel = MatrixModel()
    data_processing: DataProcessingModel | None = None
    scenarios: list[ScenarioModel]


class FrameworksFileModel(_Strict):
    """A separate file of framework definitions (``--frameworks``)."""

    frameworks: dict[str, FrameworkModel]


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
        return str(self.data.get("distributed_type", "NO"))

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

    def where(self, scenario: Scenario, key: str | None = None) -> dict[str, Any]:
        """Keyword arguments of ``ConfigError`` pointing at ``scenario``."""
        loc = f"scenarios[{scenario.index}]" + (f".{key}" if key else "")
        return {"file": str(self.scenarios_file), "line": scenario.line, "key": loc}


# ---------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------


def _pydantic_error(doc: YamlDoc, exc: ValidationError, root: type[BaseModel]) -> ConfigError:
    # A typo shows up twice: an unknown key and a missing one. The unknown key,
    # with the allowed names, is the more useful line, so it goes first.
    errors = sorted(exc.errors(), key=lambda e: e["type"] != "extra_forbidden")
    first = errors[0]
    loc = _data_loc(doc.data, first["loc"], keep_last=first["type"] == "missing")
    kind = first["type"]
    if kind == "extra_forbidden":
        allowed = _allowed_keys(root, loc[:-1])
        message = f"unknown key '{loc[-1]}'"
        if allowed:
            message += f"; allowed: {', '.join(allowed)}"
        return ConfigError(
            message + _more(errors),
            file=doc.file,
            line=doc.line_of(loc),
            key=format_loc(loc[:-1]) or None,
        )
    if kind == "missing":
        message = f"missing required key '{loc[-1]}'"
    else:
        msg = str(first["msg"]).removeprefix("Value error, ")
        got = first.get("input")
        message = f"{msg[0].lower()}{msg[1:]} (got {_type_name(got)} {_short_repr(got)})"
    return doc.error(message + _more(errors), loc)


def _more(errors: Sequence[Any]) -> str:
    n = len(errors) - 1
    return f" (and {n} more problem{'s' if n > 1 else ''})" if n else ""


def _short_repr(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _data_loc(data: Any, loc: Sequence[Any], keep_last: bool) -> Loc:
    """The part of a pydantic error location that exists in the data.

    Pydantic appends markers such as ``[key]`` or union member names; the key
    path shown to the user stops where the data stops.
    """
    out: list[str | int] = []
    node = data
    for i, part in enumerate(loc):
        if part == "[key]":
            break
        try:
            node = node[part]
        except (KeyError, IndexError, TypeError):
            if keep_last and i == len(loc) - 1:
                out.append(part)
            break
        out.append(part)
    return tuple(out)


def _allowed_keys(root: type[BaseModel], loc: Loc) -> list[str]:
    """The field names of the model found at ``loc`` inside ``root``."""
    current: Any = root
    for part in loc:
        current = _unwrap(current)
        if isinstance(current, type) and issubclass(current, BaseModel):
            field = current.model_fields.get(str(part))
            if field is None:
                return []
            current = field.annotation
        else:
            args = typing.get_args(current)
            current = args[-1] if args else None
    current = _unwrap(current)
    if isinstance(current, type) and issubclass(current, BaseModel):
        return list(current.model_fields)
    return []


def _unwrap(tp: Any) -> Any:
    """Strip ``Optional`` and ``Annotated`` from a type."""
    while True:
        origin = typing.get_origin(tp)
        if origin is Annotated:
            tp = typing.get_args(tp)[0]
        elif origin in (typing.Union, types.UnionType):
            members = [a for a in typing.get_args(tp) if a is not type(None)]
            if len(members) != 1:
                return tp
            tp = members[0]
        else:
            return tp


def _validate(doc: YamlDoc, model: type[_Strict], what: str) -> Any:
    if not isinstance(doc.data, dict):
        raise ConfigError(
            f"{what} must be a YAML mapping at the top level, got {_type_name(doc.data)}",
            file=doc.file,
        )
    try:
        return model.model_validate(doc.data)
    except ValidationError as exc:
        raise _pydantic_error(doc, exc, model) from None


def _check_arguments(doc: YamlDoc, arguments: Mapping[str, Any], loc: Loc) -> None:
    for key, value in arguments.items():
        if key in RESERVED_ARGUMENTS:
            hint = (
                "set num_gpus at the scenario level or under matrix:"
                if key == "num_gpus"
                else "set repeats under matrix: or with --repeats"
            )
            raise doc.error(f"'{key}' is not a trainer argument; {hint}", (*loc, key))
        problem = check_value(value, (*loc, key))
        if problem:
            raise doc.error(*problem)


def _check_unique(doc: YamlDoc, values: Sequence[Any], loc: Loc, what: str) -> None:
    seen: dict[str, int] = {}
    for i, value in enumerate(values):
        key = canonical_json(value)
        if key in seen:
            raise doc.error(
                f"{what} {value!r} is listed twice (items {seen[key]} and {i})", (*loc, i)
            )
        seen[key] = i


def _check_axis_list(doc: YamlDoc, values: Sequence[Any] | None, loc: Loc) -> None:
    if values is None:
        return
    if not values:
        raise doc.error("empty list; give at least one value or remove the key", loc)
    _check_unique(doc, values, loc, "value")


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
            f"an accelerate config must be a YAML mapping, got {_type_name(doc.data)}", file=path
        )
    problem = check_value(doc.data, ())
    if problem:
        raise doc.error(*problem)
    return AccelerateConfig(path=path.resolve(), data=doc.data)


def _load_frameworks(
    doc: YamlDoc, models: Mapping[str, FrameworkModel], into: dict[str, Framework]
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
        )


def _resolve_scenario(
    doc: YamlDoc, index: int, sc: ScenarioModel, frameworks: Mapping[str, Framework]
) -> Scenario:
    loc: Loc = ("scenarios", index)
    problem = check_name(sc.name, "scenario name")
    if problem:
        raise doc.error(problem, (*loc, "name"))

    fw_names: tuple[str | None, ...] = (None,)
    if sc.framework_config is not None:
        fl: Loc = (*loc, "framework_config")
        if not sc.framework_config:
            raise doc.error("empty list; use [null] for no overlay or remove the key", fl)
        _check_unique(doc, sc.framework_config, fl, "framework")
        for i, fname in enumerate(sc.framework_config):
            if fname is not None and fname not in frameworks:
                defined = ", ".join(sorted(frameworks)) or "none are defined"
                raise doc.error(
                    f"unknown framework '{fname}'; defined frameworks: {defined} "
                    "(define it under frameworks: or pass --frameworks FILE)",
                    (*fl, i),
                )
        fw_names = tuple(sc.framework_config)

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

    sweep: dict[str, tuple[Any, ...]] = {}
    for key, values in sc.sweep.items():
        sl: Loc = (*loc, "sweep", key)
        if key in RESERVED_ARGUMENTS:
            raise doc.error(f"'{key}' cannot be swept; set it at the scenario level", sl)
        if key in arguments:
            raise doc.error(f"'{key}' is both a constant in arguments and swept; keep one", sl)
        if not values:
            raise doc.error("empty sweep list; give at least one value", sl)
        bad_value = check_value(values, sl)
        if bad_value:
            raise doc.error(*bad_value)
        _check_unique(doc, values, sl, "sweep value")
        for fname in fw_names:
            if fname is not None and key in frameworks[fname].arguments:
                raise doc.error(
                    f"'{key}' is swept here but framework '{fname}' sets it; keep one", sl
                )
        sweep[key] = tuple(values)

    raw_models = arguments.pop("model_name_or_path", None)
    if "model_name_or_path" in sweep:
        raw_models = list(sweep.pop("model_name_or_path"))
    models: tuple[str, ...] = ()
    if raw_models is not None:
        ml: Loc = (*args_loc, "model_name_or_path")
        items = raw_models if isinstance(raw_models, list) else [raw_models]
        if not items:
            raise doc.error("empty model list; give at least one model_name_or_path", ml)
        for i, model in enumerate(items):
            problem = check_model_name(model)
            if problem:
                raise doc.error(problem, (*ml, i) if isinstance(raw_models, list) else ml)
        _check_unique(doc, items, ml, "model")
        models = tuple(items)

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
    )


def load_defaults(path: Path | None) -> dict[str, Any]:
    """defaults.yaml: trainer arguments shared by all scenarios (empty if no file)."""
    if path is None:
        return {}
    doc = load_yaml(path, "defaults file")
    if doc.data is None:
        return {}
    if not isinstance(doc.data, dict):
        raise ConfigError(
            f"a defaults file must be a mapping of trainer arguments, got {_type_name(doc.data)}",
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
    return dict(doc.data)


def load_config(
    scenarios_file: Path,
    *,
    defaults_file: Path | None,
    frameworks_files: Sequence[Path] = (),
    accelerate_config: Path | None = None,
    accelerate_fallback: Path | None = None,
) -> BenchConfig:
    """Load and validate the scenarios file with its defaults and framework files.

    The default accelerate config (for frameworks that name none) is, first
    found: ``accelerate_config`` (the command line), the file's own
    ``accelerate_config:`` key (relative to the file), ``accelerate_fallback``.
    """
    doc = load_yaml(scenarios_file, "scenarios file")
    model: ScenariosFileModel = _validate(doc, ScenariosFileModel, "a scenarios file")

    frameworks: dict[str, Framework] = {}
    _load_frameworks(doc, model.frameworks, frameworks)
    for extra in frameworks_files:
        fdoc = load_yaml(extra, "frameworks file")
        fmodel: FrameworksFileModel = _validate(fdoc, FrameworksFileModel, "a frameworks file")
        _load_frameworks(fdoc, fmodel.frameworks, frameworks)

    if not model.scenarios:
        raise doc.error("no scenarios; define at least one", ("scenarios",))
    m = model.matrix
    for axis in ("num_gpus", "effective_batch_size", "max_seq_len", "packing"):
        _check_axis_list(doc, getattr(m, axis), ("matrix", axis))

    defaults = load_defaults(defaults_file)
    default_models = defaults.pop("model_name_or_path", None)
    if isinstance(default_models, str):
        default_models = [default_models]

    scenarios: list[Scenario] = []
    seen: dict[str, int] = {}
    for i, sc in enumerate(model.scenarios):
        scenario = _resolve_scenario(doc, i, sc, frameworks)
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
    )
