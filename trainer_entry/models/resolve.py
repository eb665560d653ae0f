"""Where a model name leads, found without loading anything (no torch, no transformers).

A run's model is one of: an embedded tiny model (``tiny-llama``), a shipped or
given architecture (``config:``), a user's function (``python:``), a local
folder, or a hub id, in the hub cache or on the hub. ``resolve`` says which, or
raises ``SpecError`` in one line when the name leads nowhere. The check before
launch (``trainer_entry.check``) resolves each distinct name once per run, so a
missing model costs seconds however many experiments name it, rather than a
launch and the hub's retries per experiment.

Asking the hub takes one request with a short time limit
(``HUB_TIMEOUT_S``), where ``transformers`` would retry for about a minute. A
model found in the cache while the hub does not answer is run offline
(``Resolved.offline``), so its jobs do not wait on the hub either.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.contract.modelnames import hub_offline
from trainer_entry import ASSETS
from trainer_entry.models.custom import check_findable
from trainer_entry.models.kinds import CONFIG_PREFIX, model_kind
from trainer_entry.models.tiny import TINY_NAME
from trainer_entry.spec_errors import SpecError, first_line

ARCHITECTURES = ASSETS / "architectures"
#: how long one request to the hub may take before the hub counts as not answering
HUB_TIMEOUT_S = 5.0
#: what a name that leads nowhere may be replaced with
_INSTEAD = "use {tiny}, config:<architecture> ({shipped}), a local folder, or a hub id"


def shipped_architectures() -> list[str]:
    return sorted(p.stem for p in ARCHITECTURES.glob("*.json"))


def architecture_config(spec: str) -> dict[str, Any]:
    """The config dict for ``config:<name or path>``."""
    target = spec.removeprefix(CONFIG_PREFIX)
    path = Path(target).expanduser()
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        shipped = ARCHITECTURES / f"{target}.json"
        if not shipped.is_file():
            raise SpecError(
                f"model 'config:{target}': no such architecture; shipped ones: "
                f"{', '.join(shipped_architectures())} (or give a path to a config.json)"
            )
        path = shipped
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise SpecError(f"model 'config:{target}': cannot read {path}: {exc}") from None
    if not isinstance(data, dict) or "model_type" not in data:
        raise SpecError(f"model 'config:{target}': {path} has no model_type")
    return {k: v for k, v in data.items() if not k.startswith("_")}


@dataclass(frozen=True)
class Resolved:
    """Where a model name leads."""

    #: ``shipped``, ``architecture``, ``function``, ``local folder``, ``hub cache``, ``hub``
    where: str
    #: found in the hub cache while the hub did not answer: run its jobs offline
    offline: bool = False
    #: what was found out on the way (the hub's silence), for the run's header
    detail: str = ""

    def describe(self) -> str:
        return self.where + (f"; {self.detail}" if self.detail else "")


class HubProbe:
    """Asks the hub about models, each once; after one request it does not answer in
    time, it stops asking (so N models cost one time limit, not N)."""

    def __init__(self, timeout_s: float = HUB_TIMEOUT_S) -> None:
        self.timeout_s = timeout_s
        #: why the hub counts as not answering (None: it has answered, or not been asked)
        self.silent: str | None = None

    def ask(self, name: str, revision: str | None) -> str | None:
        """None when the hub has ``name`` (at ``revision``); else why not, in a few words.

        Sets ``silent`` (and returns its reason) when the hub did not answer.
        """
        if self.silent is not None:
            return self.silent
        answer: dict[str, BaseException | None] = {}

        def request() -> None:
            try:
                from huggingface_hub import HfApi

                HfApi().model_info(name, revision=revision, timeout=self.timeout_s)
                answer["error"] = None
            except BaseException as exc:  # reported below, in words
                answer["error"] = exc

        # a thread with a deadline: a resolver or proxy that hangs must not hold the run
        worker = threading.Thread(target=request, daemon=True)
        worker.start()
        worker.join(self.timeout_s + 1.0)
        if "error" not in answer:
            self.silent = f"the hub did not answer in {self.timeout_s:g} s"
            return self.silent
        exc = answer["error"]
        if exc is None:
            return None
        kind = type(exc).__name__
        if kind in ("RepositoryNotFoundError", "GatedRepoError", "RevisionNotFoundError"):
            first = first_line(exc)
            return {
                "RepositoryNotFoundError": "the hub has no such model (or it is private: set "
                "HF_TOKEN)",
                "GatedRepoError": "the hub's model is gated: accept its terms and set HF_TOKEN",
                "RevisionNotFoundError": f"the hub has no such revision ({first})",
            }[kind]
        if kind == "HfHubHTTPError" or "HTTPError" in kind:
            first = first_line(exc)
            return f"the hub answered with an error ({first})"
        if "Timeout" in kind:
            self.silent = f"the hub did not answer in {self.timeout_s:g} s"
        else:
            self.silent = f"the hub could not be reached ({kind}: {first_line(exc)})"
        return self.silent


def resolve(
    name: str,
    *,
    revision: str | None = None,
    python_path: Sequence[str] = (),
    hub: HubProbe | None = None,
    env: Mapping[str, str] = os.environ,
) -> Resolved:
    """Where model ``name`` leads; ``SpecError`` (one line) where it leads nowhere.

    ``hub``: the probe that asks the hub (shared by the names of one run); the hub is
    not asked when the environment keeps it offline (``HF_HUB_OFFLINE``).
    """
    kind = model_kind(name)
    if kind == "tiny":
        return Resolved("shipped")
    if kind == "config":
        architecture_config(name)
        if not name.startswith(CONFIG_PREFIX):
            return Resolved(
                "architecture",
                detail="a folder with a config.json and no weights: built from it with random "
                "weights, with its own tokenizer where it has one, else the task's tiny model's "
                "(tokenizer_name_or_path names another)",
            )
        return Resolved("architecture")
    if kind == "python":
        check_findable(name, list(python_path))
        return Resolved("function")
    path = Path(name).expanduser()
    if path.exists():
        # a model's folder, or a PEFT adapter's (transformers loads its base model)
        if not any((path / f).is_file() for f in ("config.json", "adapter_config.json")):
            raise SpecError(
                f"model '{name}': the local path {path} holds no config.json (nor a PEFT "
                "adapter's adapter_config.json)"
            )
        return Resolved("local folder")
    if name.startswith(("/", ".", "~")):
        raise SpecError(f"model '{name}': no such local folder ({path})")
    try:
        from huggingface_hub import try_to_load_from_cache
        from huggingface_hub.utils import HFValidationError, validate_repo_id
    except ImportError:  # without the hub client, the loader says what it says
        return Resolved("hub", detail="not checked: huggingface_hub is not installed")
    try:
        validate_repo_id(name)
    except HFValidationError:
        raise SpecError(
            f"model '{name}' is neither a local folder nor a hub id; "
            + _INSTEAD.format(tiny=TINY_NAME, shipped=", ".join(shipped_architectures()))
        ) from None
    cached = isinstance(try_to_load_from_cache(name, "config.json", revision=revision), str)
    if hub_offline(env):
        if cached:
            return Resolved("hub cache")
        raise SpecError(
            f"model '{name}' is neither a local folder nor in the hub cache, and the hub is offline "
            "(HF_HUB_OFFLINE=1); "
            + _INSTEAD.format(tiny=TINY_NAME, shipped=", ".join(shipped_architectures()))
        )
    probe = hub or HubProbe()
    problem = probe.ask(name, revision)
    if problem is None:
        return Resolved("hub cache" if cached else "hub")
    if cached:  # what the hub lacks or will not say, the cache has: run from it
        return Resolved("hub cache", offline=True, detail=f"{problem}: its jobs run offline")
    if problem == probe.silent:
        raise SpecError(
            f"model '{name}' is neither a local folder nor in the hub cache, and {problem}; "
            "on a machine without the hub set HF_HUB_OFFLINE=1 and "
            + _INSTEAD.format(tiny=TINY_NAME, shipped=", ".join(shipped_architectures())).replace(
                "a hub id", "a cached hub id"
            )
        )
    raise SpecError(f"model '{name}': {problem}")
