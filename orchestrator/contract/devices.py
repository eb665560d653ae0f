"""The accelerators tunematrix knows by name: each one's dense peak TFLOP/s per
precision (the child's MFU) and its nominal memory (the report's likely-OOM line for a
table that does not record it), in one table.

To add a device: one ``Device`` row: the names ``torch.cuda.get_device_name()``
reports, its datasheet's dense peaks, and, where a table or file name may name it,
the pattern and memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

GIB = 2**30

ComputeMode = Literal["fp8", "bf16", "tf32", "fp32"]


@dataclass(frozen=True)
class DevicePeaks:
    """Dense (no 2:4 sparsity) peak TFLOP/s of one device, by matrix-product precision."""

    #: bf16 and fp16 tensor cores (the same figure on every device listed)
    bf16: float
    #: TF32 tensor cores; None where the device has none
    tf32: float | None
    #: fp32 without TF32
    fp32: float
    #: FP8 tensor cores; None where the device has none
    fp8: float | None

    def for_mode(self, mode: ComputeMode) -> float | None:
        return {"fp8": self.fp8, "bf16": self.bf16, "tf32": self.tf32, "fp32": self.fp32}[mode]


@dataclass(frozen=True)
class Device:
    """One kind of accelerator."""

    #: how the report names it ("A100 80GB")
    label: str
    #: the exact names ``torch.cuda.get_device_name()`` reports for it
    names: tuple[str, ...]
    #: its dense peaks (None: no datasheet to take them from)
    peaks: DevicePeaks | None
    #: nominal memory of one device, bytes (None: not known by name)
    memory_bytes: float | None = None
    #: matched (lower case) in a table's ``gpu_device_name`` or its file name, for the
    #: memory; None where an earlier row's pattern already covers it
    pattern: str | None = None


_A100 = DevicePeaks(bf16=312.0, tf32=156.0, fp32=19.5, fp8=None)
_HOPPER_SXM = DevicePeaks(bf16=989.4, tf32=494.7, fp32=66.9, fp8=1978.9)

#: Keyed by the exact name ``torch.cuda.get_device_name()`` reports. Sources, all
#: the vendors' datasheets; where a datasheet gives figures "with sparsity" they
#: are halved to the dense figure:
#: - A100 (every form): NVIDIA A100 Tensor Core GPU datasheet — FP32 19.5,
#:   TF32 156, BF16/FP16 312; Ampere has no FP8 tensor cores.
#: - H100 SXM, H200: NVIDIA Hopper architecture whitepaper (H100 SXM5) and the
#:   H200 datasheet (the same compute) — FP32 66.9, TF32 494.7, BF16 989.4,
#:   FP8 1978.9.
#: - H100 PCIe: NVIDIA H100 datasheet — FP32 51.2, TF32 756*, BF16 1513*, FP8 3026*.
#: - H100 NVL: NVIDIA H100 NVL datasheet — FP32 60, TF32 835*, BF16 1671*, FP8 3341*.
#: - L4: NVIDIA L4 datasheet — FP32 30.3, TF32 120*, BF16 242*, FP8 485*.
#: - L40S: NVIDIA L40S datasheet — FP32 91.6, TF32 183, BF16 362.05, FP8 733.
#: - MI300X: AMD Instinct MI300X datasheet — FP32 163.4, TF32 653.7,
#:   BF16 1307.4, FP8 2614.9.
#: (* with sparsity.) The A10G is left out on purpose: NVIDIA publishes no
#: datasheet for it (the often quoted 125 TFLOPS is the A10's), so it gets no
#: MFU unless a scenario sets ``peak_tflops_per_device``.
DEVICES: tuple[Device, ...] = (
    Device(
        "A100 80GB",
        ("NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe"),
        _A100,
        80 * GIB,
        r"a100.{0,12}?80\s*gb",
    ),
    Device(
        "A100 40GB",
        ("NVIDIA A100-SXM4-40GB", "NVIDIA A100-PCIE-40GB"),
        _A100,
        40 * GIB,
        r"a100.{0,12}?40\s*gb",
    ),
    Device("H100 80GB", ("NVIDIA H100 80GB HBM3",), _HOPPER_SXM, 80 * GIB, r"h100(?![-_ ]*nvl)"),
    # the H100 row's pattern matches the PCIe card too (80 GB as well)
    Device(
        "H100 PCIe",
        ("NVIDIA H100 PCIe",),
        DevicePeaks(bf16=756.5, tf32=378.0, fp32=51.2, fp8=1513.0),
        80 * GIB,
    ),
    Device(
        "H100 NVL", ("NVIDIA H100 NVL",), DevicePeaks(bf16=835.5, tf32=417.5, fp32=60.0, fp8=1670.5)
    ),
    Device("H200", ("NVIDIA H200",), _HOPPER_SXM, 141 * GIB, r"h200"),
    Device("L4", ("NVIDIA L4",), DevicePeaks(bf16=121.0, tf32=60.0, fp32=30.3, fp8=242.5)),
    Device("L40S", ("NVIDIA L40S",), DevicePeaks(bf16=362.05, tf32=183.0, fp32=91.6, fp8=733.0)),
    Device(
        "MI300X",
        ("AMD Instinct MI300X",),
        DevicePeaks(bf16=1307.4, tf32=653.7, fp32=163.4, fp8=2614.9),
    ),
)

#: peaks by the exact name ``torch.cuda.get_device_name()`` reports
PEAK_TFLOPS: dict[str, DevicePeaks] = {
    name: device.peaks for device in DEVICES if device.peaks is not None for name in device.names
}
#: (pattern, memory, label) of the devices a table or file name may name, in order
KNOWN_GPU_MEMORY: tuple[tuple[str, float, str], ...] = tuple(
    (device.pattern, device.memory_bytes, device.label)
    for device in DEVICES
    if device.pattern is not None and device.memory_bytes is not None
)
