"""The host memory allocators a cell may run under (``allocator:``), known by name.

A process's allocator changes its CPU step times: glibc's malloc raises its mmap
threshold as large blocks are freed (its dynamic threshold), so how often memory is
handed back to the kernel and faulted in again depends on what the process did
before; jemalloc and tcmalloc keep memory differently again. A scenario states the
allocator its cells run under; ``Allocator`` is that statement resolved (the
library found, the settings as strings), and its ``environment`` is what the job
sets. One module for the planner (which checks the settings and finds the
library), the job (which sets the environment) and the child (which records the
allocator and the variables in force, and notes a later run of a shared launch
whose glibc threshold may have moved).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import PurePath
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

AllocatorName = Literal["glibc", "jemalloc", "tcmalloc"]
ALLOCATORS: tuple[AllocatorName, ...] = ("glibc", "jemalloc", "tcmalloc")
#: the allocator of a process that preloads none: the C library's malloc
DEFAULT_ALLOCATOR: AllocatorName = "glibc"

#: the shared libraries each preloaded allocator may be, the preferred first
LIBRARIES: Mapping[str, tuple[str, ...]] = {
    "jemalloc": ("libjemalloc.so.2", "libjemalloc.so"),
    "tcmalloc": ("libtcmalloc.so.4", "libtcmalloc_minimal.so.4", "libtcmalloc.so"),
}
#: the Debian/Ubuntu package that installs each one
PACKAGES: Mapping[str, str] = {"jemalloc": "libjemalloc2", "tcmalloc": "libtcmalloc-minimal4"}

#: the variables each allocator reads: exact names, and prefixes (ending in ``_``)
#: that name a family. glibc's ``MALLOC_*`` are its tunables' old names
#: (``MALLOC_MMAP_THRESHOLD_``); ``MALLOC_CONF`` is jemalloc's, though it starts alike
SETTINGS: Mapping[str, tuple[str, ...]] = {
    "glibc": ("MALLOC_", "GLIBC_TUNABLES"),
    "jemalloc": ("MALLOC_CONF", "_RJEM_MALLOC_CONF"),
    "tcmalloc": ("TCMALLOC_",),
}
#: read by jemalloc, never by glibc, for all its ``MALLOC_`` prefix
_JEMALLOC_ONLY = ("MALLOC_CONF",)

#: the variable that preloads a library into every process of the job
PRELOAD = "LD_PRELOAD"

#: glibc's settings that fix its mmap threshold, as variables and as tunables: setting any
#: of them turns the dynamic threshold off (glibc's malloc.c sets ``no_dyn_threshold``
#: for each of M_MMAP_THRESHOLD, M_TRIM_THRESHOLD, M_TOP_PAD and M_MMAP_MAX)
FIXING_VARIABLES = (
    "MALLOC_MMAP_THRESHOLD_",
    "MALLOC_TRIM_THRESHOLD_",
    "MALLOC_TOP_PAD_",
    "MALLOC_MMAP_MAX_",
)
FIXING_TUNABLES = (
    "glibc.malloc.mmap_threshold",
    "glibc.malloc.trim_threshold",
    "glibc.malloc.top_pad",
    "glibc.malloc.mmap_max",
)


def _matches(variable: str, names: tuple[str, ...]) -> bool:
    return any(
        variable.startswith(name) if name.endswith("_") else variable == name for name in names
    )


def setting_allowed(allocator: str, variable: str) -> bool:
    """Whether ``allocator`` reads ``variable`` (a setting a scenario may give it)."""
    if allocator == "glibc" and variable in _JEMALLOC_ONLY:
        return False
    return _matches(variable, SETTINGS.get(allocator, ()))


def settings_text(allocator: str) -> str:
    """The variables ``allocator`` reads, as an error lists them (``MALLOC_* and GLIBC_TUNABLES``)."""
    names = [name + "*" if name.endswith("_") else name for name in SETTINGS[allocator]]
    text = " and ".join(names)
    if allocator == "glibc":
        text += f" ({', '.join(_JEMALLOC_ONLY)} is jemalloc's)"
    return text


def allocator_variable(variable: str) -> bool:
    """Whether any allocator known here reads ``variable`` (what a run records as in force)."""
    return any(_matches(variable, names) for names in SETTINGS.values())


def fixed_threshold(environ: Mapping[str, str]) -> bool:
    """Whether glibc's mmap threshold is fixed in a process with ``environ``: one of its
    fixing variables is set, or ``GLIBC_TUNABLES`` sets one of the fixing tunables."""
    if any(name in environ for name in FIXING_VARIABLES):
        return True
    tunables = environ.get("GLIBC_TUNABLES", "")
    names = {item.partition("=")[0].strip() for item in tunables.split(":")}
    return any(name in names for name in FIXING_TUNABLES)


class Allocator(BaseModel):
    """``allocator:`` resolved: the allocator, its library (found or given; None for glibc)
    and its settings, each a variable of the job's environment."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: AllocatorName = DEFAULT_ALLOCATOR
    #: the shared library preloaded into the job, an absolute path (jemalloc, tcmalloc)
    library: str | None = None
    #: variable -> value, sorted by name
    settings: dict[str, str] = {}

    def __hash__(self) -> int:
        # a frozen value, a family's key among others: its settings hashed as sorted pairs
        return hash((self.name, self.library, tuple(sorted(self.settings.items()))))

    def identity(self) -> dict[str, Any]:
        """What experiment ids hash: the library by its file name, so that the same file
        found in another folder of another machine gives the same ids."""
        return {
            "name": self.name,
            "library": PurePath(self.library).name if self.library else None,
            "settings": dict(sorted(self.settings.items())),
        }

    def environment(self, preloaded: str | None = None) -> dict[str, str]:
        """The variables the job sets: every setting and, for a preloaded allocator,
        ``LD_PRELOAD`` with its library first, before ``preloaded`` (what the job's
        environment preloads already, kept)."""
        env = dict(sorted(self.settings.items()))
        if self.library is not None:
            # ld.so reads LD_PRELOAD's entries split at colons or spaces
            rest = [p for p in re.split(r"[:\s]+", preloaded or "") if p and p != self.library]
            env[PRELOAD] = ":".join([self.library, *rest])
        return env
