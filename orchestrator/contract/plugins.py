"""fms-acceleration's plugin configurations, as both sides read them.

The predecessor selects fms-acceleration's framework for a job by
``ACCELERATION_FRAMEWORK_CONFIG_FILE`` (``CONFIG_ENV``), a YAML file whose
``plugins:`` tree holds one section for each plugin it asks for
(``training.fused_ops_and_kernels``, ``peft.quantization.bitsandbytes``, ...).
A job given such a file either trains with those plugins active, or is
refused before launch: it never trains as the plain baseline under the
plugin's name. The child decides which (``trainer_entry.models.acceleration``,
from the installed framework); this module names the sections, the package
that claims each, and the nearest setting tunematrix runs without them, so a
refusal can say what to do instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: the variable that names a job's fms-acceleration configuration
CONFIG_ENV = "ACCELERATION_FRAMEWORK_CONFIG_FILE"


@dataclass(frozen=True)
class SectionKind:
    """What one kind of section asks for."""

    #: the fms-acceleration plugin package that claims it
    package: str
    #: what it does, in a few words
    what: str
    #: the nearest setting tunematrix runs without fms-acceleration (None: none)
    nearest: str | None


#: a section's last key -> what it asks for (fms-acceleration 0.6's sample configurations)
KINDS: Mapping[str, SectionKind] = {
    "fused_ops_and_kernels": SectionKind(
        "fms-acceleration-foak", "fused Triton kernels", "use_liger_kernel: true"
    ),
    "bitsandbytes": SectionKind(
        "fms-acceleration-peft", "4-bit bitsandbytes LoRA", "peft_method: qlora"
    ),
    "auto_gptq": SectionKind("fms-acceleration-peft", "GPTQ-quantized LoRA", "peft_method: qlora"),
    "padding_free": SectionKind(
        "fms-acceleration-aadp", "padding-free batches", "padding_free: true"
    ),
    "multipack": SectionKind("fms-acceleration-aadp", "multipack sampling", "packing: true"),
    "scattermoe": SectionKind("fms-acceleration-moe", "ScatterMoE expert kernels", None),
}


def sections(plugins: Any, prefix: tuple[str, ...] = ()) -> list[str]:
    """The dotted paths of a configuration's ``plugins:`` sections: each mapping that
    holds a setting (anything but a mapping), or nothing at all, is one."""
    if not isinstance(plugins, Mapping):
        return []
    found: list[str] = []
    for key, value in plugins.items():
        path = (*prefix, str(key))
        if (
            isinstance(value, Mapping)
            and value
            and all(isinstance(v, Mapping) for v in value.values())
        ):
            found.extend(sections(value, path))
        else:
            found.append(".".join(path))
    return found


def kind_of(section: str) -> SectionKind | None:
    return KINDS.get(section.rsplit(".", 1)[-1])


def nearest(section_paths: list[str]) -> list[str]:
    """The nearest settings tunematrix runs for these sections, each once, in order."""
    out: list[str] = []
    for path in section_paths:
        kind = kind_of(path)
        if kind is not None and kind.nearest and kind.nearest not in out:
            out.append(kind.nearest)
    return out


def refusal(file: str, section_paths: list[str], why: str) -> str:
    """One line: the configuration, its sections, why it cannot run, what to use instead."""
    asked = ", ".join(
        f"{p} ({k.what}, {k.package})" if (k := kind_of(p)) else p for p in section_paths
    )
    instead = nearest(section_paths)
    hint = (
        f"; the nearest setting tunematrix runs without it: {' / '.join(instead)}"
        if instead
        else ""
    )
    return (
        f"fms-acceleration configuration {file} asks for {asked or 'no plugin'}: {why}; "
        f"the cell is refused rather than measured as the plain baseline under its name{hint}"
    )
