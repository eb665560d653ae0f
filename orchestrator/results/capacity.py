"""A device's memory, and which failed runs likely ran out of it.

A failed run without metrics whose memory reached ``LIKELY_OOM_FRACTION`` of the
device's is shown as *likely* out of memory: likely, as the row records no cause
(the predecessor wrote OOMs as rows without metrics). The device's memory is
given, else read from the run's ``env.json``, else the nominal memory of a GPU
the rows or the file name name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from orchestrator.contract import columns as registry
from orchestrator.contract.columns import PEAK_MEMORY
from orchestrator.contract.devices import GIB as GIB
from orchestrator.contract.devices import KNOWN_GPU_MEMORY as DEVICE_MEMORY
from orchestrator.results.envfile import read_env
from orchestrator.results.tablecolumns import numeric

#: a failed run without metrics whose memory reached this share of the device's is
#: likely out of memory. In the predecessor's published A100 80GB tables every row
#: without metrics reached 77,734-81,214 MiB of 81,920 (95-99%). Finished runs get as
#: high (up to 98.6%), so memory alone is no verdict: only runs without metrics qualify.
LIKELY_OOM_FRACTION = 0.9
#: figures whose absence means a run left no metrics
RUN_FIGURES = registry.with_role("run_figure")
#: nominal memory of GPUs known by name, for a table that does not record it: a name
#: matched (lower case) in the rows' ``gpu_device_name``, else in the file or folder
#: name (the device table, orchestrator/contract/devices.py)
KNOWN_GPU_MEMORY = DEVICE_MEMORY


@dataclass(frozen=True)
class Capacity:
    """The memory of one device of a run, and where that figure came from."""

    bytes: float
    #: for summary.md: "given with --gpu-memory-gib", "from the file name …"
    source: str
    #: a GPU's memory (likely-OOM applies); else the machine's, for a CPU run
    gpu: bool = True


def gib(value: float) -> str:
    """GiB to one decimal, without a trailing ``.0`` (``80``, ``79.3``)."""
    text = f"{value / GIB:.1f}"
    return text.removesuffix(".0")


def capacity_from_env(source: Path, cells: pd.DataFrame) -> Capacity | None:
    """The memory of one device of the run: a GPU's, or the machine's for CPU runs."""
    env = read_env(source) if source.is_dir() else None
    if env is None:
        return None
    devices = (env.get("gpus") or {}).get("devices") or []
    on_gpu = "device" in cells.columns and (cells["device"].astype(str) == "gpu").any()
    if on_gpu and devices:
        name = devices[0].get("name") or "the GPU"
        return Capacity(float(devices[0]["memory_bytes"]), f"{name}, from env.json")
    memory = (env.get("cpu") or {}).get("memory_bytes")
    if memory and not on_gpu:
        return Capacity(float(memory), "the machine's memory, from env.json", gpu=False)
    return None


def known_gpu_memory(text: str) -> tuple[float, str] | None:
    """The nominal memory and name of a GPU named in ``text`` (``a100_80gb`` -> 80 GiB)."""
    lowered = text.lower()
    for pattern, memory, name in KNOWN_GPU_MEMORY:
        if re.search(pattern, lowered):
            return memory, name
    return None


def resolve_capacity(
    source: Path, rows: pd.DataFrame, gpu_memory_bytes: float | None = None
) -> Capacity | None:
    """A device's memory: given, else the run's env.json, else a GPU named in the rows'
    ``gpu_device_name`` (all alike), else one named in the file or folder name."""
    if gpu_memory_bytes is not None:
        return Capacity(float(gpu_memory_bytes), "given with --gpu-memory-gib")
    from_env = capacity_from_env(source, rows)
    if from_env is not None:
        return from_env
    if "gpu_device_name" in rows.columns:
        names = sorted({str(n) for n in rows["gpu_device_name"].dropna() if str(n).strip()})
        first = known_gpu_memory(names[0]) if names else None
        if first is not None and all(known_gpu_memory(n) == first for n in names):
            return Capacity(
                first[0],
                f"nominal for the {first[1]} (from the rows' gpu_device_name {names[0]!r})",
            )
    found = known_gpu_memory(source.name)
    if found is not None:
        return Capacity(
            found[0], f"nominal for the {found[1]} (from the file name `{source.name}`)"
        )
    return None


def mark_likely_oom(table: pd.DataFrame, capacity: Capacity | None) -> pd.DataFrame:
    """``likely_oom`` and ``failed_peak_memory_bytes`` per row; likely OOMs say so in ``error``.

    ``failed_peak_memory_bytes``: the memory a run that did not finish and left none
    of ``RUN_FIGURES`` reached. Such a run is likely out of memory when it failed
    (a confirmed ``oom`` says so itself), ran on a GPU and its memory reached
    ``LIKELY_OOM_FRACTION`` of the device's.
    """
    table = table.copy()
    no_figures = pd.Series(True, index=table.index)
    for column in RUN_FIGURES:
        no_figures &= numeric(table, column).isna()
    on_gpu = table["device"].astype(str) != "cpu"
    memory = numeric(table, PEAK_MEMORY)
    unfinished = ~table["status"].isin(["ok", "skipped", "planned"]) & no_figures
    table["failed_peak_memory_bytes"] = memory.where(unfinished & memory.notna())
    candidate = unfinished & (table["status"] == "failed") & on_gpu & memory.notna()
    likely = pd.Series(False, index=table.index)
    if capacity is not None and capacity.gpu:
        likely = candidate & (memory >= LIKELY_OOM_FRACTION * capacity.bytes)
        note = [
            f"memory reached {gib(m)} of {gib(capacity.bytes)} GiB "
            f"(≥ {100 * LIKELY_OOM_FRACTION:.0f}%): likely out of memory"
            for m in memory[likely]
        ]
        errors = table.loc[likely, "error"].astype(object)
        table.loc[likely, "error"] = [
            f"{e}; {n}" if isinstance(e, str) and e else n
            for e, n in zip(errors, note, strict=True)
        ]
    table["likely_oom"] = likely
    return table


def cells_likely_oom(cells: pd.DataFrame, table: pd.DataFrame) -> pd.DataFrame:
    """A cell is likely OOM when it failed and every repeat is; its memory, the largest."""
    if cells.empty:
        return cells
    by_cell = table.groupby("cell_id", sort=False)
    likely = by_cell["likely_oom"].all()
    memory = by_cell["failed_peak_memory_bytes"].max()
    cells = cells.copy()
    ids = cells["cell_id"]
    cells["likely_oom"] = (ids.map(likely).fillna(False).astype(bool)) & (
        cells["status"] == "failed"
    )
    reached = ids.map(memory)
    cells["failed_peak_memory_bytes"] = reached.astype(object).where(reached.notna(), None)
    return cells
