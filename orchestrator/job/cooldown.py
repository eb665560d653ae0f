"""Cool-down between cells (opt in: ``tunematrix run --cool-down SECONDS``).

Back-to-back cells heat the GPUs, and a hot GPU boosts less: the later cells
of a matrix would run slower for their place in it. With ``--cool-down``, the
first cell records the hottest of its GPUs' temperatures before it launches
(``cooldown.json`` in the results folder); each later cell waits, before its
launch, until every GPU it will use is back within ``MARGIN_C`` of that, for at
most the given seconds. The wait is recorded on the cell's outcome
(``cooldown``: ``wait_s``, ``start_c``, ``target_c``, and a ``note`` where the
wait ran out or the temperature cannot be read: on the CPU, or without NVML).

A launch shared by several experiments (``--launch family``) waits once, before
it starts: its runs follow each other in one process.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from orchestrator.contract.layout import write_atomic

#: a GPU within this many degrees of the first cell's start is cool enough
MARGIN_C = 3
#: how often the temperature is read while waiting
POLL_S = 1.0

#: the temperature of each GPU the job will use, or None where it cannot be read
Reader = Callable[[], Mapping[str, int] | None]


def nvml_reader(entries: Sequence[str]) -> Reader:
    """A reader of the GPUs ``CUDA_VISIBLE_DEVICES`` entries name, through NVML."""

    def read() -> dict[str, int] | None:
        try:
            import pynvml

            from orchestrator.job.sidecar import NvmlDevice, map_visible_to_nvml

            pynvml.nvmlInit()
            try:
                found = []
                for i in range(pynvml.nvmlDeviceGetCount()):
                    h = pynvml.nvmlDeviceGetHandleByIndex(i)
                    found.append(
                        NvmlDevice(
                            index=i,
                            uuid=_text(pynvml.nvmlDeviceGetUUID(h)),
                            pci_bus_id=_text(pynvml.nvmlDeviceGetPciInfo(h).busId),
                        )
                    )
                return {
                    str(d.index): int(
                        pynvml.nvmlDeviceGetTemperature(
                            pynvml.nvmlDeviceGetHandleByIndex(d.index), pynvml.NVML_TEMPERATURE_GPU
                        )
                    )
                    for d in map_visible_to_nvml(entries, found)
                }
            finally:
                pynvml.nvmlShutdown()
        except Exception:  # no NVML, no permission, a bad entry: no temperature
            return None

    return read


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _baseline(path: Path) -> float | None:
    try:
        value = json.loads(path.read_text()).get("start_c")
    except (OSError, ValueError, AttributeError):
        return None
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def wait(
    baseline: Path,
    devices: Sequence[str],
    limit_s: float,
    *,
    read: Reader | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> dict[str, Any]:
    """Wait until the job's GPUs are within ``MARGIN_C`` of the first cell's start (the
    first cell records it in ``baseline``), at most ``limit_s``; returns the record
    for the outcome's ``cooldown``."""
    if not devices:
        return {"wait_s": 0.0, "note": "no GPU temperature on the CPU: no wait"}
    read = read or nvml_reader(devices)
    temps = read()
    if not temps:
        return {"wait_s": 0.0, "note": "the GPUs' temperature cannot be read (NVML): no wait"}
    start = _baseline(baseline)
    if start is None:  # the first cell: what the others come back to
        start = float(max(temps.values()))
        write_atomic(baseline, json.dumps({"start_c": start}) + "\n")
        return {"wait_s": 0.0, "start_c": start, "target_c": start + MARGIN_C}
    target = start + MARGIN_C
    began = clock()
    while max(temps.values()) > target and clock() - began < limit_s:
        sleep(min(POLL_S, max(0.0, limit_s - (clock() - began))))
        temps = read() or temps
    out: dict[str, Any] = {
        "wait_s": round(clock() - began, 3),
        "start_c": float(max(temps.values())),
        "target_c": target,
    }
    if max(temps.values()) > target:
        out["note"] = (
            f"still {max(temps.values()) - start:.0f} °C above the first cell's start after "
            f"{limit_s:g} s: launched warm"
        )
    return out
