"""The host memory allocator in force in this process, as a run records it.

Every row says which allocator served the child's ``malloc`` (``allocator``:
``glibc 2.36``, ``jemalloc /usr/lib/x86_64-linux-gnu/libjemalloc.so.2``, ...) and
the allocator variables of its environment (``allocator_settings``), whatever the
scenario's ``allocator:`` asked: what is in force is read here, in the child's own
process. A later run of a shared launch whose glibc may have moved its mmap
threshold gets a note. The functions of the maps' text and the environment are
pure; ``in_force`` reads both.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import PurePath

from orchestrator.contract.allocators import allocator_variable, fixed_threshold

#: the allocators found by their library's file name, and what a row calls them
_KNOWN = (("jemalloc", "jemalloc"), ("tcmalloc", "tcmalloc"))


def _mappings(maps: str) -> list[tuple[int, int, str]]:
    """(start, end, file) of each file mapped in ``maps`` (``/proc/self/maps``'s text)."""
    out = []
    for line in maps.splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) < 6 or not parts[5].startswith("/"):
            continue
        start, _, end = parts[0].partition("-")
        try:
            out.append((int(start, 16), int(end, 16), parts[5].removesuffix(" (deleted)")))
        except ValueError:
            continue
    return out


def _known(path: str) -> str | None:
    name = PurePath(path).name
    return next((label for part, label in _KNOWN if part in name), None)


def _is_libc(path: str) -> bool:
    name = PurePath(path).name
    return name.startswith("libc.so") or name.startswith("libc-")


def allocator_of(maps: str, malloc_address: int | None, libc_version: str | None) -> str | None:
    """What serves ``malloc`` in a process with these mappings: the library whose mapping
    holds ``malloc_address`` (the address the process resolves ``malloc`` to), named
    ``jemalloc <path>``, ``tcmalloc <path>`` or ``<name> <path>`` for another; the C
    library's ``libc_version`` (``glibc 2.36``) where that is the C library. Without the
    address, a mapped jemalloc or tcmalloc (a preload's), else the C library's. None
    where nothing says."""
    mapped = _mappings(maps)
    if malloc_address is not None:
        holder = next((f for lo, hi, f in mapped if lo <= malloc_address < hi), None)
        if holder is not None and not _is_libc(holder):
            label = _known(holder)
            if label is None:
                label = PurePath(holder).name.removeprefix("lib").partition(".so")[0]
            return f"{label} {holder}"
        if holder is not None:
            return libc_version
    preloaded = next((f for _, _, f in mapped if _known(f)), None)
    if preloaded is not None:
        return f"{_known(preloaded)} {preloaded}"
    return libc_version


def settings_of(environ: Mapping[str, str]) -> str | None:
    """The allocator variables of ``environ``, ``NAME=value`` joined by ``; ``, sorted by
    name; None where none is set (the allocator's defaults)."""
    found = sorted((k, v) for k, v in environ.items() if allocator_variable(k))
    return "; ".join(f"{k}={v}" for k, v in found) or None


#: the note of a later run of a shared launch under glibc's dynamic mmap threshold
SHARED_HEAP_NOTE = (
    "this run started in a process where the launch's earlier runs had allocated and "
    "freed memory: glibc's dynamic mmap threshold, which they may have raised, changes how "
    "often memory is faulted in (host_page_faults_per_step), so its step times can differ "
    "from a launch of its own; allocator: {settings: {MALLOC_MMAP_THRESHOLD_: 4294967296}} "
    "fixes the threshold for both launch modes"
)


def shared_heap_note(allocator: str | None, environ: Mapping[str, str]) -> str | None:
    """The note of a run that is not its launch's first, where ``allocator`` (as
    ``allocator_of`` names it) is glibc and ``environ`` leaves its mmap threshold
    dynamic; None otherwise."""
    if allocator is None or not allocator.startswith("glibc") or fixed_threshold(environ):
        return None
    return SHARED_HEAP_NOTE


def _malloc_address() -> int | None:
    """Where this process resolves ``malloc``: a preloaded allocator's comes first."""
    try:
        import ctypes

        address = ctypes.cast(ctypes.CDLL(None).malloc, ctypes.c_void_p).value
    except (OSError, AttributeError, ValueError):
        return None
    return int(address) if address else None


def _libc_version() -> str | None:
    try:
        return os.confstr("CS_GNU_LIBC_VERSION")  # "glibc 2.36"
    except (ValueError, OSError, AttributeError):
        return None


def in_force(environ: Mapping[str, str] | None = None) -> tuple[str | None, str | None]:
    """(the allocator, its variables) in force in this process, as a row records them."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            maps = f.read()
    except OSError:
        maps = ""
    env = os.environ if environ is None else environ
    return allocator_of(maps, _malloc_address(), _libc_version()), settings_of(env)
