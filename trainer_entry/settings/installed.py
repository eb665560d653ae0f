"""The installed libraries' own names for the settings tunematrix passes them.

Libraries rename settings between releases: transformers 5.23 renamed
``gradient_checkpointing`` to ``activation_checkpointing``, TRL once called
``max_length`` ``max_seq_length``, transformers ``tokenizer`` ``processing_class``.
Scenarios, specs and rows use one name for each (tunematrix's, the newest
release's: ``orchestrator.contract.applicability.SPELLINGS``); here each is passed
under the name the installed class or function takes, read from its fields or
parameters, never from a version number. A setting the installed library takes
under no name is a ``SettingError`` naming the key, the library and its version.

Nothing of the training stack is imported here: callers hand in the classes.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from orchestrator.contract.applicability import SPELLINGS
from trainer_entry.spec_errors import SpecError


@dataclass(frozen=True)
class Owner:
    """What takes a group of settings: a package's class or function (for messages)."""

    #: the distribution (``transformers``, ``trl``, ``peft``)
    package: str
    #: the class or function (``TrainingArguments``)
    name: str

    @property
    def version(self) -> str:
        try:
            return version(self.package)
        except PackageNotFoundError:
            return "(version unknown)"

    def __str__(self) -> str:
        return f"{self.package} {self.version}'s {self.name}"


class SettingError(SpecError):
    """A setting the installed library does not take, under any of its names."""

    key: str

    def __init__(self, key: str, owner: Owner, detail: str) -> None:
        self.owner = owner
        self.detail = detail
        super().__init__(f"{key}: {detail}", key=key)


class MissingPackage(SettingError):
    """A setting the installed library takes, but that needs a package this interpreter
    lacks (``use_liger_kernel`` needs ``liger-kernel``): found before anything loads."""

    def __init__(self, key: str, owner: Owner, package: str) -> None:
        self.package = package
        super().__init__(
            key,
            owner,
            f"{package} is not installed in this interpreter (pip install {package}, "
            f"or remove {key})",
        )


class Refused(SpecError):
    """The installed library refused the settings' values (building its class raised)."""

    def __init__(self, owner: Owner, detail: str, what: str = "trainer arguments") -> None:
        self.owner = owner
        self.detail = detail
        super().__init__(f"invalid {what} ({owner}): {detail}")


def init_fields(cls: type) -> frozenset[str]:
    """The names a dataclass (``TrainingArguments``, ``SFTConfig``, ``LoraConfig``) takes."""
    return frozenset(f.name for f in dataclasses.fields(cls) if f.init)


def parameters(function: Callable[..., Any]) -> frozenset[str]:
    """The named parameters of ``function`` (``Trainer.__init__``; of a class: its
    constructor's)."""
    return frozenset(inspect.signature(function).parameters)


def spellings(name: str) -> tuple[str, ...]:
    """``name`` and the older names a release may take it under (``SPELLINGS``)."""
    return (name, *SPELLINGS.get(name, ()))


def installed_name(name: str, accepted: frozenset[str]) -> str | None:
    """The spelling of ``name`` that ``accepted`` (the installed fields) has, or None."""
    return next((n for n in spellings(name) if n in accepted), None)


def in_installed_names(
    kwargs: Mapping[str, Any],
    accepted: frozenset[str],
    owner: Owner | Callable[[str], Owner],
    notes: list[str] | None = None,
    *,
    why: Callable[[str], str] | None = None,
) -> dict[str, Any]:
    """``kwargs`` with each key under the name ``accepted`` has for it.

    A key that ``accepted`` lacks under every spelling raises ``SettingError`` naming
    its ``owner`` (or ``owner(key)``, where keys come from several libraries);
    ``why(key)`` may say more (which release takes it). Each key passed under
    another name adds a line to ``notes``, once.
    """
    out: dict[str, Any] = {}
    for key, value in kwargs.items():
        name = installed_name(key, accepted)
        if name is None:
            owner = owner(key) if callable(owner) else owner
            other = [n for n in spellings(key) if n != key]
            nor = f" (nor under its older name{'s' if len(other) > 1 else ''} {', '.join(other)})"
            more = why(key) if why is not None else ""
            raise SettingError(
                key,
                owner,
                f"{owner} does not take it{nor if other else ''}{more}; upgrade {owner.package} "
                "or remove the setting",
            )
        if name != key and notes is not None:
            by = owner(key) if callable(owner) else owner
            note = f"{key} is passed as {name}, the name {by} takes"
            if note not in notes:
                notes.append(note)
        out[name] = value
    return out


def read(obj: Any, name: str) -> Any:
    """Setting ``name`` of ``obj`` (a built ``TrainingArguments``), under whichever of its
    names the installed class has; None where it has none."""
    for spelled in spellings(name):
        if hasattr(obj, spelled):
            return getattr(obj, spelled)
    return None
