"""Cool-down between cells (opt in: ``tunematrix run --cool-down SECONDS``).

Back-to-back cells heat the GPUs, and a hot GPU boosts less: the later cells
of a matrix would run slower for their place in it. With ``--cool-down``, each
GPU's temperature is recorded before the first launch that uses it
(``cooldown.json`` in the results folder, by GPU); before each later launch the
job waits, at most the given seconds, until every GPU it will use is back
within ``MARGIN_C`` of its own first temperature. The wait is recorded on the
cell's outcome (``cooldown``: ``wait_s``, ``start_c``, the hottest GPU at
launch, ``target_c``, its mark, and a ``note`` where the wait ran out or the
temperature cannot be read: on the CPU, or without NVML). Ctrl-C or a
scheduler's stop ends the wait, and the launch does not happen.

Only the executors whose jobs run on this machine wait (``local``, ``packed``);
a launch shared by several experiments (``--launch family``) waits once, before
it starts.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from orchestrator.contract.layout import write_atomic

#: a GPU within this many degrees of its first temperature is cool enough
MARGIN_C = 3
#: how often the temperature is read while waiting
POLL_S = 1.0

#: the temperature of each GPU the job will use, or None where it cannot be read
Reader = Callable[[], Mapping[str, int] | None]


class Stopped(Exception):
    """Ctrl-C or a scheduler's stop came during the wait."""


def nvml_reader(entries: Sequence[str]) -> Reader:
    """A reader of the GPUs ``CUDA_VISIBLE_DEVICES`` entries name, by UUID, through NVML."""

    def read() -> dict[str, int] | None:
        try:
            import pynvml

            from orchestrator.job.sidecar import visible_nvml_devices

            pynvml.nvmlInit()
            try:
                return {
                    d.uuid: int(
                        pynvml.nvmlDeviceGetTemperature(
                            pynvml.nvmlDeviceGetHandleByIndex(d.index), pynvml.NVML_TEMPERATURE_GPU
                        )
                    )
                    for d in visible_nvml_devices(pynvml, entries)
                }
            finally:
                pynvml.nvmlShutdown()
        except Exception:  # no NVML, no permission, a bad entry: no temperature
            return None

    return read


def _baselines(path: Path) -> dict[str, float]:
    try:
        found = json.loads(path.read_text()).get("start_c")
    except (OSError, ValueError, AttributeError):
        return {}
    if not isinstance(found, dict):
        return {}
    return {
        str(k): float(v)
        for k, v in found.items()
        if isinstance(v, (int, float)) and math.isfinite(v)
    }


def wait(
    baseline: Path,
    devices: Sequence[str],
    limit_s: float,
    *,
    stop: threading.Event | None = None,
    read: Reader | None = None,
    sleep: Callable[[float], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> dict[str, Any]:
    """Wait until each of the job's GPUs is within ``MARGIN_C`` of its first temperature
    (recorded in ``baseline`` the first time the GPU is used), at most ``limit_s``;
    returns the record for the outcome's ``cooldown``. Raises ``Stopped`` when ``stop``
    is set meanwhile."""
    if not devices:
        return {"wait_s": 0.0, "note": "no GPU temperature on the CPU: no wait"}
    read = read or nvml_reader(devices)
    temps = read()
    if not temps:
        return {"wait_s": 0.0, "note": "the GPUs' temperature cannot be read (NVML): no wait"}
    known = _baselines(baseline)
    new = {d: float(t) for d, t in temps.items() if d not in known}
    if new:  # the first launch on these GPUs: what later ones come back to
        known.update(new)
        write_atomic(baseline, json.dumps({"start_c": known}, indent=1, sort_keys=True) + "\n")
    marks = {d: known[d] + MARGIN_C for d in temps}

    def over(now: Mapping[str, int]) -> float:
        """How far the hottest GPU is above its mark (<= 0: all cool)."""
        return max(now[d] - marks[d] for d in now if d in marks)

    pause = sleep or (stop.wait if stop is not None else time.sleep)
    began = clock()
    while over(temps) > 0 and clock() - began < limit_s:
        pause(min(POLL_S, max(0.0, limit_s - (clock() - began))))
        if stop is not None and stop.is_set():
            raise Stopped("stopped while the GPUs cooled")
        temps = read() or temps
    hottest = max(temps, key=lambda d: (temps[d] - marks[d], temps[d]))
    out: dict[str, Any] = {
        "wait_s": round(clock() - began, 3),
        "start_c": float(temps[hottest]),
        "target_c": marks[hottest],
    }
    if over(temps) > 0:
        out["note"] = (
            f"still {over(temps) + MARGIN_C:.0f} °C above its first temperature after "
            f"{limit_s:g} s: launched warm"
        )
    return out
