"""The shapes of the config files (pydantic), and errors that point into the YAML.

Every model forbids unknown keys and is strict about types, so a typo or a
``"yes"`` where a boolean belongs is an error naming the key path, its line
and the keys that are allowed.
"""

from __future__ import annotations

import functools
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    ValidationError,
    create_model,
    model_validator,
)

from orchestrator.config.values import type_name
from orchestrator.config.yamlio import Loc, YamlDoc, format_loc
from orchestrator.contract.errors import ConfigError

PositiveInt = Annotated[int, Field(gt=0)]
PositiveFloat = Annotated[float, Field(gt=0)]


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


class CostModel(_Strict):
    """What the hardware and its energy cost: cost per token, time/cost to train, the
    energy's cost and emissions (the user's own numbers)."""

    usd_per_gpu_hour: PositiveFloat | None = None
    usd_per_kwh: PositiveFloat | None = None
    grams_co2_per_kwh: PositiveFloat | None = None


class MatrixModel(_Strict):
    """Axes crossed with every scenario; the command line overrides them."""

    num_gpus: list[PositiveInt] | None = None
    effective_batch_size: list[PositiveInt] | None = None
    max_seq_len: list[PositiveInt] | None = None
    packing: list[bool] | None = None
    #: how many times each cell runs, each in a fresh process
    repeats: PositiveInt | None = None


class EnvironmentModel(_Strict):
    """One entry of ``environments:``: a Python interpreter every cell also runs under."""

    #: part of the experiment ids and a key column of the tables
    name: str
    #: the interpreter (a venv's ``bin/python``), relative to the scenarios file's folder
    python: str | None = None
    #: or a tox env of the project: ``<project>/.tox/<tox>/bin/python``
    tox: str | None = None


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


class SearchModel(_Strict):
    """``search:``: which value ``tunematrix fit`` raises until it no longer fits."""

    max: Literal["per_device_train_batch_size", "max_seq_len"]
    #: a value that fits, where the search starts (default 1, or 64 tokens)
    min: PositiveInt | None = None
    #: the largest value worth probing
    limit: PositiveInt | None = None
    #: a probe whose peak memory is above (1 - margin) of the device's does not fit
    margin: Annotated[float, Field(ge=0, lt=1)] | None = None


class MeasureModel(_Strict):
    """``measure:``: how long a cell runs: its fixed ``max_steps`` (``until: steps``), or
    until its mean step time is known to ``precision`` (``until: steady``)."""

    until: Literal["steps", "steady"]
    #: the 95% interval's half-width over the mean at which a run stops (default 0.02)
    precision: Annotated[float, Field(gt=0, lt=1)] | None = None
    #: measured steps before a run may stop (default 10)
    min_steps: PositiveInt | None = None
    #: the step cap (default 200)
    max_steps: PositiveInt | None = None


class AllocatorModel(_Strict):
    """``allocator:``: the host memory allocator of a cell's processes and its settings
    (``orchestrator.contract.allocators``); ``allocator: jemalloc`` names it alone."""

    #: glibc (the system's malloc), or jemalloc or tcmalloc preloaded
    name: Literal["glibc", "jemalloc", "tcmalloc"] = "glibc"
    #: the preloaded allocator's shared library, relative to the scenarios file's folder
    #: (default: found on this machine at plan time)
    library: str | None = None
    #: the allocator's environment variables (``MALLOC_MMAP_THRESHOLD_: 4294967296``)
    settings: dict[str, StrictInt | str] = {}

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        # ``allocator: jemalloc`` is ``allocator: {name: jemalloc}``
        return {"name": data} if isinstance(data, str) else data


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
    #: time limit of each experiment of this scenario, in seconds
    timeout_s: PositiveFloat | None = None
    #: record a few steps after the warm-up with torch.profiler (left out of the window)
    profile: bool = False
    #: how many steps a profile records (default 3)
    profile_steps: PositiveInt | None = None
    #: the largest per-device batch or sequence length that fits (``tunematrix fit``)
    search: SearchModel | None = None
    #: steady-state measuring (``orchestrator.contract.steady``); None: the fixed max_steps
    measure: MeasureModel | None = None
    #: the host memory allocator of its cells (default: the file's ``allocator:``)
    allocator: AllocatorModel | None = None


class ScenariosFileModel(_Strict):
    """The whole scenarios file; a superset of fms-acceleration's format."""

    accelerate_config: str | None = None
    #: time limit of each experiment, in seconds (a scenario may set its own)
    timeout_s: PositiveFloat | None = None
    #: ``family``: the experiments of one family share a launch (``--launch``)
    launch: Literal["cell", "family"] | None = None
    #: the host memory allocator of the scenarios that name none (None: as the
    #: environment has it)
    allocator: AllocatorModel | None = None
    cost: CostModel | None = None
    frameworks: dict[str, FrameworkModel] = {}
    matrix: MatrixModel = MatrixModel()
    #: the interpreters every cell runs under (an axis); none: the running one
    environments: list[EnvironmentModel] | None = None
    data_processing: DataProcessingModel | None = None
    scenarios: list[ScenarioModel]


#: where the executors' sections of the scenarios file (``slurm:``, ``ray:``) come from:
#: the executors' registry hands in its own reader as it loads
#: (``orchestrator.executors.registry``), so the file's model knows every registered
#: executor's section and the config stage never imports the executors
_executor_sections: list[Callable[[], Mapping[str, type[BaseModel]]]] = []


def executor_sections_from(source: Callable[[], Mapping[str, type[BaseModel]]]) -> None:
    """Read the executors' sections from ``source`` (the registry's, called at each load)."""
    _executor_sections[:] = [source]


def executor_sections() -> dict[str, type[BaseModel]]:
    """Each registered executor's section, under its name (none before the registry loads)."""
    return dict(_executor_sections[0]()) if _executor_sections else {}


def scenarios_file_model(sections: Mapping[str, type[BaseModel]]) -> type[_Strict]:
    """The scenarios file's model with an optional top-level section per executor that has one
    (``NAME:`` for ``--executor NAME``), each checked by the executor's own model.

    The model has ``ScenariosFileModel``'s fields, the sections placed after ``cost``
    (so the keys an error lists as allowed read in the file's usual order).
    """
    return _with_sections(tuple(sections.items()))


@functools.lru_cache(maxsize=16)
def _with_sections(sections: tuple[tuple[str, type[BaseModel]], ...]) -> type[_Strict]:
    if not sections:
        return ScenariosFileModel
    own = ScenariosFileModel.model_fields
    taken = [name for name, _ in sections if name in own]
    if taken:
        raise ValueError(f"an executor's section may not be named {', '.join(taken)}")
    names = list(own)
    at = names.index("cost") + 1
    fields: dict[str, Any] = {name: (own[name].annotation, own[name]) for name in names[:at]}
    fields.update({name: (model | None, None) for name, model in sections})
    fields.update({name: (own[name].annotation, own[name]) for name in names[at:]})
    return create_model(
        "ScenariosFileModel", __base__=_Strict, __doc__=ScenariosFileModel.__doc__, **fields
    )


class FrameworksFileModel(_Strict):
    """A separate file of framework definitions (``--frameworks``)."""

    frameworks: dict[str, FrameworkModel]


class ContentsEntryModel(_Strict):
    """One framework of fms-acceleration's ``sample-configurations/CONTENTS.yaml``."""

    shortname: str
    #: the fms-acceleration plugins the configuration needs
    plugins: list[str] = []
    #: the plugin configuration, relative to CONTENTS.yaml
    filename: str


class ContentsFileModel(_Strict):
    """fms-acceleration's ``CONTENTS.yaml``, accepted as it is by ``--frameworks``."""

    framework_configs: list[ContentsEntryModel]


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
        message = f"{msg[0].lower()}{msg[1:]} (got {type_name(got)} {_short_repr(got)})"
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


def validate(doc: YamlDoc, model: type[_Strict], what: str) -> Any:
    if not isinstance(doc.data, dict):
        raise ConfigError(
            f"{what} must be a YAML mapping at the top level, got {type_name(doc.data)}",
            file=doc.file,
        )
    try:
        return model.model_validate(doc.data)
    except ValidationError as exc:
        raise _pydantic_error(doc, exc, model) from None
