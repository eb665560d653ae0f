"""``env.json``: what a run ran on — hardware, driver, versions, code — without importing torch."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from contextlib import suppress
from importlib import metadata
from pathlib import Path
from typing import Any

from orchestrator.contract.allocators import PRELOAD
from orchestrator.contract.allocators import SETTINGS as ALLOCATOR_SETTINGS
from orchestrator.contract.clock import now
from orchestrator.contract.layout import PROJECT_ROOT, write_atomic

PACKAGES = (
    "torch",
    "transformers",
    "trl",
    "peft",
    "accelerate",
    "datasets",
    "tokenizers",
    "bitsandbytes",
    "flash-attn",
    "liger-kernel",
    "nvidia-ml-py",
    "pandas",
)


def write(path: Path, env: dict[str, Any]) -> None:
    write_atomic(path, json.dumps(env, indent=2) + "\n")


def version(name: str) -> str | None:
    """The installed version of a distribution, read from its metadata (nothing is imported)."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def torch_build(torch_version: str | None) -> str | None:
    """The build torch names in its version: ``cu128`` in 2.13.0+cu128, ``cpu`` in +cpu.

    None where the version names none (PyPI's default wheels, macOS builds).
    """
    if torch_version and "+" in torch_version:
        return torch_version.split("+", 1)[1]
    return None


def _cpu_model() -> str | None:
    with suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or None


def nvml_gpus() -> dict[str, Any]:
    """NVML's view: ``driver``, ``cuda_driver`` and ``devices``; or only ``nvml``, why not."""
    try:
        import pynvml
    except ImportError:
        return {"nvml": "nvidia-ml-py is not installed"}
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return {"nvml": f"unavailable ({exc})"}
    try:

        def text(v: Any) -> str:
            return v.decode() if isinstance(v, bytes) else str(v)

        devices = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            devices.append(
                {
                    "index": i,
                    "name": text(pynvml.nvmlDeviceGetName(h)),
                    "uuid": text(pynvml.nvmlDeviceGetUUID(h)),
                    "pci_bus_id": text(pynvml.nvmlDeviceGetPciInfo(h).busId),
                    "memory_bytes": int(pynvml.nvmlDeviceGetMemoryInfo(h).total),
                }
            )
        cuda = pynvml.nvmlSystemGetCudaDriverVersion()
        return {
            "driver": text(pynvml.nvmlSystemGetDriverVersion()),
            "cuda_driver": f"{cuda // 1000}.{cuda % 1000 // 10}",
            "devices": devices,
        }
    except pynvml.NVMLError as exc:
        return {"nvml": f"error ({exc})"}
    finally:
        with suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()


def _git_sha() -> str | None:
    try:
        out = subprocess.run(
            ["git", "-C", str(PROJECT_ROOT), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
        )
        dirty = subprocess.run(
            ["git", "-C", str(PROJECT_ROOT), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=5,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def _pip_freeze() -> list[str]:
    seen = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            seen[name.lower()] = f"{name}=={dist.version}"
    return [seen[k] for k in sorted(seen)]


def _secret(name: str) -> bool:
    bare = name.removeprefix("TOKENIZERS_")
    return any(word in bare for word in ("TOKEN", "KEY", "SECRET", "PASSWORD"))


#: environment variables recorded in ``env.json`` (besides the executors' own prefixes);
#: the host allocators' change CPU step times (``orchestrator.contract.allocators``)
ENV_PREFIXES = (
    "CUDA_",
    "NCCL_",
    "HF_",
    "OMP_",
    "TORCH",
    "PYTORCH_",
    "TOKENIZERS_",
    *sorted({name for names in ALLOCATOR_SETTINGS.values() for name in names}),
    PRELOAD,
)


def collect(argv: list[str]) -> dict[str, Any]:
    from orchestrator.executors import registry

    torch_version = version("torch")
    memory = None
    with suppress(ValueError, OSError):
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return {
        "started_at": now(),
        "finished_at": None,
        "command": argv,
        "host": platform.node(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "cpu": {"model": _cpu_model(), "cores": os.cpu_count(), "memory_bytes": memory},
        "gpus": nvml_gpus(),
        "torch_cuda_build": torch_build(torch_version),
        "versions": {name: version(name) for name in PACKAGES},
        "tunematrix_git_sha": _git_sha(),
        "environment": {
            k: v
            for k, v in os.environ.items()
            if k.startswith(ENV_PREFIXES + registry.env_prefixes()) and not _secret(k)
        },
        "pip_freeze": _pip_freeze(),
    }
