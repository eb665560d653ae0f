"""fms-acceleration's framework in the job that trains, or the cell refused.

A spec whose job environment names a plugin configuration
(``ACCELERATION_FRAMEWORK_CONFIG_FILE``, ``orchestrator.contract.plugins``)
gets fms-acceleration's ``AccelerationFramework`` built from that file, as the
predecessor's trainer builds it, or a ``SpecError`` that says why it cannot:

- fms-acceleration does not import here (not installed; or a plugin package
  that imports what this stack no longer has: fms-acceleration-aadp 0.2 needs
  TRL < 0.20's ``DataCollatorForCompletionOnlyLM``, and while it is installed
  ``import fms_acceleration`` itself fails);
- the framework refuses the file (a plugin's package missing, no plugin claims it);
- a section of the file that no active plugin claims (its plugin package is not
  installed: the framework itself would skip the section without a word);
- a CPU cell: every plugin's work is a CUDA kernel (foak and moe: Triton;
  peft: bitsandbytes or auto_gptq's 4-bit layers; aadp: flash-attn's varlen).

The check before launch (``trainer_entry.check``) calls ``load_acceleration``
for every such cell, so a refusal is one line before anything starts; the
child calls it again before loading the model (a run with ``--no-check``
fails instead of training the baseline). On a GPU the child then applies it
as fms-hf-tuning does: the framework's model loader where a plugin loads the
model, its augmentation before LoRA (a plugin that applies its own adapters
takes the LoRA configuration), its callbacks once the trainer is built. The
result names the plugins that were active (``acceleration_plugins``), read
from the framework, not from the shortname.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.contract.plugins import CONFIG_ENV, refusal, sections
from trainer_entry.spec_errors import SpecError


@dataclass(frozen=True)
class Acceleration:
    """fms-acceleration's framework for one configuration file, built."""

    path: str
    framework: Any
    #: the active plugins' class names, in the framework's order
    plugins: tuple[str, ...]
    #: whether a plugin loads the model itself (the 4-bit PEFT plugins)
    custom_loading: bool
    #: the file's sections (``orchestrator.contract.plugins.sections``)
    sections: tuple[str, ...] = ()
    #: the job's ``TrainingArguments``, which the plugins read as they augment
    training_args: Any = None

    def load(self, name: str, *, dtype: Any, attn: str) -> Any:
        """The model as the plugin that loads models loads it (its keywords are
        fms-hf-tuning's: ``torch_dtype``, ``attn_implementation``)."""
        return self.framework.model_loader(name, torch_dtype=dtype, attn_implementation=attn)

    def augment(self, model: Any, lora: Any) -> tuple[Any, Any]:
        """The framework's augmentation of ``model`` before LoRA wraps it: (the model, the
        LoRA configuration still to apply; None where a plugin applied its own)."""
        if not self.framework.requires_augmentation:
            return model, lora
        model, modifiable = self.framework.augmentation(
            model, self.training_args, modifiable_args=(lora,)
        )
        return model, modifiable[0]

    def callbacks(self, model: Any, accelerator: Any) -> list[Any]:
        """The framework's callbacks, its patches applied to the built model and its
        accelerator."""
        return list(self.framework.get_callbacks_and_ready_for_train(model, accelerator) or [])


def requested(env: Mapping[str, str]) -> str | None:
    """The plugin configuration a job's environment names (None: none)."""
    value = env.get(CONFIG_ENV)
    return value or None


def _plugin_sections(path: str) -> list[str]:
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f) or {}
    except OSError as exc:
        raise SpecError(f"{CONFIG_ENV}={path}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise SpecError(f"{CONFIG_ENV}={path}: not YAML ({exc})") from None
    return sections(data.get("plugins") if isinstance(data, Mapping) else None)


def _claimed(section: str, registrations: list[Any], active: set[str]) -> bool:
    """Whether an active plugin registered a path that ``section`` is in."""
    for reg in registrations:
        if getattr(reg.plugin, "__name__", None) not in active:
            continue
        for key in [*(reg.AND or []), *(reg.OR or [])]:
            if section == key or section.startswith(f"{key}.") or key.startswith(f"{section}."):
                return True
    return False


def _refused(path: str, asked: list[str], why: str) -> SpecError:
    """The cell's refusal, blaming its framework_config."""
    return SpecError(refusal(Path(path).name, asked, why), key="framework_config")


@functools.lru_cache(maxsize=16)
def _built(path: str) -> Acceleration:
    """The framework for ``path``, built once per process (the check asks per cell)."""
    asked = _plugin_sections(path)
    try:
        from fms_acceleration import AccelerationFramework
        from fms_acceleration.framework_plugin import PLUGIN_REGISTRATIONS
    except ImportError as exc:
        missing = getattr(exc, "name", None) == "fms_acceleration"
        why = (
            "fms-acceleration is not installed here"
            if missing
            else f"fms-acceleration does not import beside this stack ({exc})"
        )
        raise _refused(path, asked, why) from None
    # the framework keeps its active plugins in class attributes: a second build in one
    # process would add to the first's
    framework = AccelerationFramework.__new__(AccelerationFramework)
    framework.active_plugins = []
    framework.plugins_require_custom_loading = []
    try:
        framework.__init__(path)
    except (ValueError, AssertionError, KeyError, TypeError, ImportError) as exc:
        raise _refused(path, asked, f"fms-acceleration refuses it ({exc})") from None
    active = [str(plugin_name) for plugin_name, _ in framework.active_plugins]
    unclaimed = [s for s in asked if not _claimed(s, list(PLUGIN_REGISTRATIONS), set(active))]
    if unclaimed:
        raise _refused(
            path,
            unclaimed,
            "no installed plugin takes it (the framework would skip it; active: "
            f"{', '.join(active) or 'none'})",
        )
    return Acceleration(
        path=path,
        framework=framework,
        plugins=tuple(active),
        custom_loading=bool(framework.requires_custom_loading),
        sections=tuple(asked),
    )


def load_acceleration(path: str, *, on_gpu: bool) -> Acceleration:
    """The framework for ``path``, or ``SpecError`` (one line) where the cell cannot run
    it (see the module's docstring)."""
    built = _built(str(path))
    if not on_gpu:
        raise _refused(
            path,
            list(built.sections),
            f"its plugins ({', '.join(built.plugins)}) run CUDA kernels and this cell runs on "
            "the CPU",
        )
    return built
