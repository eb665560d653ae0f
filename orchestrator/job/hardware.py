"""What GPUs this machine has, found without importing torch.

NVML (``nvidia-ml-py``) when it is installed and a driver answers, else the
driver's ``/proc`` entries; ``CUDA_VISIBLE_DEVICES`` narrows either.
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path

_PROC_DRIVER = Path("/proc/driver/nvidia")


def _nvml_count() -> int | None:
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    try:
        return int(pynvml.nvmlDeviceGetCount())
    except pynvml.NVMLError:
        return None
    finally:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()


def _proc_count() -> int:
    return len(proc_gpus()[0])


def proc_gpus(driver: Path = _PROC_DRIVER) -> tuple[list[str], str | None]:
    """GPU models and the driver version from the driver's ``/proc`` entries, without NVML.

    ``gpus/<bus id>/information`` has a ``Model:`` line; ``version`` reads
    ``NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  <date>``.
    """
    names: list[str] = []
    try:
        buses = sorted(p for p in (driver / "gpus").iterdir() if p.is_dir())
    except OSError:
        buses = []
    for bus in buses:
        model = "unknown model"
        with contextlib.suppress(OSError):
            for line in (bus / "information").read_text().splitlines():
                key, _, value = line.partition(":")
                if key.strip() == "Model":
                    model = value.strip()
                    break
        names.append(model)
    version = None
    with contextlib.suppress(OSError):
        found = re.search(
            r"NVRM version:.*?\s(\d+\.\d+(?:\.\d+)?)\s", (driver / "version").read_text()
        )
        version = found.group(1) if found else None
    return names, version


def visible_devices(env: dict[str, str] | os._Environ[str] | None = None) -> list[str] | None:
    """Entries of ``CUDA_VISIBLE_DEVICES`` up to the first invalid one; None if unset.

    CUDA stops at the first entry it cannot use, so ``0,-1,1`` exposes one GPU;
    an empty value exposes none.
    """
    value = (os.environ if env is None else env).get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return None
    out: list[str] = []
    for entry in value.split(","):
        entry = entry.strip()
        if not entry or entry.startswith("-"):
            break
        out.append(entry)
    return out


def gpu_count() -> int:
    """Number of GPUs a job started from here could use (0 on a CPU machine)."""
    count = _nvml_count()
    if count is None:
        count = _proc_count()
    visible = visible_devices()
    if visible is not None:
        count = min(count, len(visible))
    return count
