"""A scenario's ``allocator:`` (or the file's) read into the allocator its cells run under.

``allocator: jemalloc`` or ``allocator: {name, library, settings}`` resolves to
``orchestrator.contract.allocators.Allocator``: the settings checked against the
variables that allocator reads and made strings, and a preloaded allocator's
library given (relative to the scenarios file's folder) or found on this machine.
A library that is not there is refused here, at plan time, before anything runs.
"""

from __future__ import annotations

import functools
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from orchestrator.config.schema import AllocatorModel
from orchestrator.config.yamlio import Loc, YamlDoc
from orchestrator.contract.allocators import (
    LIBRARIES,
    PACKAGES,
    Allocator,
    setting_allowed,
    settings_text,
)

#: the folders a preloaded allocator's library is looked for in, after ``ldconfig -p``
LIBRARY_DIRS = (
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/usr/local/lib",
    "/lib/x86_64-linux-gnu",
)
#: how long ``ldconfig -p`` may take before the folders alone are searched
LDCONFIG_TIMEOUT_S = 5.0


def resolve_allocator(doc: YamlDoc, model: AllocatorModel | None, loc: Loc) -> Allocator | None:
    """The allocator ``model`` (at ``loc`` in ``doc``) states; None where it is not given.

    Every problem is a ``ConfigError`` at its line: a setting the allocator does not
    read, a library for glibc, a library given that is not there, or none found.
    """
    if model is None:
        return None
    for variable in model.settings:
        if not setting_allowed(model.name, variable):
            raise doc.error(
                f"'{variable}' is not a setting of {model.name}; "
                f"{model.name} reads {settings_text(model.name)}",
                (*loc, "settings", variable),
            )
    settings = {k: str(v) for k, v in sorted(model.settings.items())}
    if model.name == "glibc":
        if model.library is not None:
            raise doc.error(
                "library applies to jemalloc and tcmalloc; glibc is the system's malloc, "
                "preloaded by nothing",
                (*loc, "library"),
            )
        return Allocator(name="glibc", settings=settings)
    if model.library is not None:
        path = Path(doc.file).parent / Path(model.library).expanduser()
        if not path.is_file():
            raise doc.error(
                f"{model.name} library {model.library}: no such file "
                f"(a relative path is relative to {Path(doc.file).parent})",
                (*loc, "library"),
            )
        return Allocator(name=model.name, library=str(path.resolve()), settings=settings)
    found = find_library(model.name)
    if found is None:
        raise doc.error(
            f"{model.name} is not installed on this machine (no {' or '.join(LIBRARIES[model.name])} "
            f"in ldconfig -p or {', '.join(LIBRARY_DIRS)}): install it "
            f"(apt-get install {PACKAGES[model.name]}) or give its path as library:",
            loc,
        )
    return Allocator(name=model.name, library=found, settings=settings)


def find_library(
    name: str,
    *,
    dirs: Sequence[str] = LIBRARY_DIRS,
    listed: Mapping[str, str] | None = None,
) -> str | None:
    """The path of allocator ``name``'s shared library on this machine; None if not found.

    Each of its file names in turn (``LIBRARIES``, the preferred first) is looked up
    in ``listed`` (file name -> path; default: ``ldconfig -p``'s), then in ``dirs``.
    """
    listing = ldconfig_listing() if listed is None else listed
    for file in LIBRARIES[name]:
        known = listing.get(file)
        if known is not None and Path(known).is_file():
            return known
        for folder in dirs:
            path = Path(folder) / file
            if path.is_file():
                return str(path)
    return None


@functools.lru_cache(maxsize=1)
def ldconfig_listing() -> Mapping[str, str]:
    """The dynamic linker's cache, file name -> path (``ldconfig -p``; empty where it
    cannot run). Where a name is there twice, this interpreter's word size wins."""
    command = shutil.which("ldconfig") or next(
        (p for p in ("/sbin/ldconfig", "/usr/sbin/ldconfig") if Path(p).is_file()), None
    )
    if command is None:
        return {}
    try:
        done = subprocess.run(
            [command, "-p"],
            capture_output=True,
            text=True,
            timeout=LDCONFIG_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return {}
    return parse_ldconfig(done.stdout, wide=sys.maxsize > 2**32)


def parse_ldconfig(text: str, *, wide: bool = True) -> dict[str, str]:
    """``ldconfig -p``'s lines (``\\tlibjemalloc.so.2 (libc6,x86-64) => /lib/.../libjemalloc.so.2``)
    as file name -> path; a 64-bit entry (its flags name 64) wins where ``wide``."""
    found: dict[str, str] = {}
    #: the names whose entry is of this word size: a later one does not replace it
    settled: set[str] = set()
    for line in text.splitlines():
        head, arrow, path = line.partition("=>")
        file, _, flags = head.strip().partition(" ")
        path = path.strip()
        if not arrow or not file or not path or file in settled:
            continue
        # a library of the other word size preloaded into a process is skipped by ld.so
        if ("64" in flags) == wide:
            found[file] = path
            settled.add(file)
        else:
            found.setdefault(file, path)
    return found
