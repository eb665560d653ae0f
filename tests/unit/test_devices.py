"""One table of devices: the child's peaks and the report's memory read the same rows."""

from __future__ import annotations

from orchestrator.contract.devices import DEVICES, PEAK_TFLOPS
from orchestrator.results.capacity import known_gpu_memory
from trainer_entry.measure.flops import peak_tflops


def test_every_named_device_reads_its_own_row_on_both_sides() -> None:
    names = [name for device in DEVICES for name in device.names]
    assert len(names) == len(set(names)), "a device name in two rows"
    for device in DEVICES:
        for name in device.names:
            # the child: the device's bf16 peak by the name torch reports
            expected = device.peaks.bf16 if device.peaks else None
            assert peak_tflops(name, "bf16") == expected, name
            assert (name in PEAK_TFLOPS) == (device.peaks is not None)
            # the report: the same name, as a table's gpu_device_name, gives its memory
            found = known_gpu_memory(name)
            if device.memory_bytes is not None:
                assert found is not None and found[0] == device.memory_bytes, name
