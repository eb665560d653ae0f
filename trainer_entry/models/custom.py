"""``python:<module>:<function>`` models: a function of the user's builds the model.

The contract (also in ``trainer_entry/models/README.md`` and the README):

- the module is imported, and the function called, only in the training
  child and only for an experiment whose ``model_name_or_path`` names it;
- the module is looked for first in the scenarios file's folder (the spec's
  ``python_path``), then on the ``PYTHONPATH`` and among installed packages;
- the function is called with the scenario's ``model_kwargs`` as keyword
  arguments, plus ``task`` (the task's name) and the task's own model keywords
  (``num_labels`` for the classification tasks) where the function has a
  parameter of that name and ``model_kwargs`` does not set it (a ``**kwargs``
  parameter alone receives none of them);
- it returns a ``transformers.PreTrainedModel``, or a pair ``(model,
  tokenizer)``: the tokenizer is used as if it had been loaded (a pad token
  added where it has none, its size checked against the embedding). Image
  tasks take no processor (their pixels follow the model's config), so for
  them the function returns the model alone;
- anything that goes wrong (the module not found, no such function, the
  function raising or returning something else) is one line, ``model
  '<name>' could not be built: <Error>: <message>``, with the traceback in the
  run's log; the run is ``failed`` like any model that cannot be loaded.

``trust_remote_code`` has nothing to do with it: naming the function in the
scenario is what runs it.

Nothing here imports the training stack at module level: the checks before
training (``trainer_entry.run.preflight``) use ``check_findable``.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
import traceback
from collections.abc import Mapping, Sequence
from typing import Any

from orchestrator.contract.modelnames import python_factory
from trainer_entry.spec_errors import SpecError

#: the keyword that gives a function naming it the task's name (besides ``model_kwargs``)
TASK_KEYWORD = "task"


def parse_name(name: str) -> tuple[str, str]:
    """(module, function) of ``python:<module>:<function>``; a SpecError for a bad name."""
    try:
        return python_factory(name)
    except ValueError as exc:
        raise SpecError(str(exc)) from None


def put_first_on_path(folders: Sequence[str]) -> None:
    """Put ``folders`` at the front of ``sys.path``, in their order."""
    for folder in reversed(folders):
        while folder in sys.path:
            sys.path.remove(folder)
        sys.path.insert(0, folder)
    importlib.invalidate_caches()


def _where(folders: Sequence[str]) -> str:
    first = ", ".join(folders)
    rest = "the PYTHONPATH and installed packages"
    return f"looked in {first}, then {rest}" if first else f"looked in {rest}"


def _failure(name: str, exc: BaseException, hint: str | None = None) -> SpecError:
    text = str(exc).strip()
    first = text.splitlines()[0] if text else ""
    what = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
    return SpecError(f"model '{name}' could not be built: {what}" + (f" ({hint})" if hint else ""))


def check_findable(name: str, folders: Sequence[str]) -> None:
    """Refuse, before the training stack is imported, a name whose top package is nowhere.

    Finding a top-level package runs none of its code; ``sys.path`` is left as it was.
    """
    module, _ = parse_name(name)
    top = module.partition(".")[0]
    saved = list(sys.path)
    try:
        put_first_on_path(folders)
        found = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        found = None
    finally:
        sys.path[:] = saved
    if found is None:
        raise _failure(name, ModuleNotFoundError(f"No module named '{top}'"), _where(folders))


def factory_arguments(
    factory: Any, model_kwargs: Mapping[str, Any], offered: Mapping[str, Any]
) -> dict[str, Any]:
    """``model_kwargs``, plus each ``offered`` keyword the function names and they do not set."""
    try:
        parameters = inspect.signature(factory).parameters
    except (TypeError, ValueError):  # no signature to read: offer nothing
        parameters = {}  # type: ignore[assignment]
    named = {
        p.name
        for p in parameters.values()
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    }
    arguments = dict(model_kwargs)
    for key, value in offered.items():
        if key in named and key not in arguments:
            arguments[key] = value
    return arguments


def _import(name: str, module: str, folders: Sequence[str]) -> Any:
    put_first_on_path(folders)
    try:
        return importlib.import_module(module)
    except Exception as exc:  # not found, or the module failed as it ran
        traceback.print_exc()
        missing = (
            isinstance(exc, ModuleNotFoundError)
            and exc.name is not None
            and (module == exc.name or module.startswith(exc.name + "."))
        )
        raise _failure(name, exc, _where(folders) if missing else None) from None


def _oom(exc: BaseException) -> bool:
    from trainer_entry.measure.memory import is_oom

    return is_oom(exc)


def build(
    name: str,
    model_kwargs: Mapping[str, Any],
    *,
    task: str,
    task_kwargs: Mapping[str, Any],
    folders: Sequence[str],
) -> tuple[Any, Any | None]:
    """(the model, the tokenizer it came with or None) from the function ``name`` names."""
    module_name, function_name = parse_name(name)
    module = _import(name, module_name, folders)
    factory = getattr(module, function_name, None)
    if factory is None:
        raise _failure(
            name, AttributeError(f"module '{module_name}' has no attribute '{function_name}'")
        )
    if not callable(factory):
        raise _failure(
            name,
            TypeError(
                f"'{module_name}.{function_name}' is a {type(factory).__name__}, not callable"
            ),
        )
    arguments = factory_arguments(factory, model_kwargs, {TASK_KEYWORD: task, **task_kwargs})
    try:
        inspect.signature(factory).bind(**arguments)
    except TypeError as exc:
        raise _failure(
            name,
            TypeError(f"model_kwargs {sorted(model_kwargs)} do not fit {function_name}: {exc}"),
        ) from None
    except ValueError:
        pass  # no signature to check against: the call will say
    try:
        built = factory(**arguments)
    except Exception as exc:
        if _oom(exc):
            raise  # out of memory is a status of its own, as anywhere else
        traceback.print_exc()
        raise _failure(name, exc) from None
    return _split(name, function_name, built)


def _split(name: str, function: str, built: Any) -> tuple[Any, Any | None]:
    from transformers import PreTrainedModel

    tokenizer = None
    if isinstance(built, tuple):
        if len(built) != 2:
            raise _failure(
                name,
                TypeError(
                    f"{function} returned a tuple of {len(built)}; "
                    "return the model or (model, tokenizer)"
                ),
            )
        built, tokenizer = built
    if not isinstance(built, PreTrainedModel):
        raise _failure(
            name,
            TypeError(
                f"{function} returned {_type_name(built)}, "
                "not a transformers PreTrainedModel; return the model or (model, tokenizer)"
            ),
        )
    return built, tokenizer


def _type_name(value: Any) -> str:
    """``a dict``, ``None``, or a class's dotted name."""
    if value is None:
        return "None"
    cls = type(value)
    if cls.__module__ == "builtins":
        return f"a {cls.__qualname__}"
    return f"{cls.__module__}.{cls.__qualname__}"
