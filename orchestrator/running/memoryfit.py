"""Each GPU cell's memory, predicted before launch, against the device's memory.

The check before launch (``orchestrator.running.stackcheck``) asks the child for
each GPU cell's predicted peak (``trainer_entry.run.memoryplan``: the training
step on fake tensors; cells that differ in nothing a step holds are predicted
once, and each prediction is kept with the check's verdicts). Here each
experiment gets it, with the device's memory, as ``Experiment.memory``
(``orchestrator.contract.gpumemory``: ``over``, ``close`` or ``fits``):

- ``tunematrix plan --memory`` prints the table, and its ``--output`` CSV has
  the ``predicted_*`` columns;
- ``tunematrix run`` prints the cells that are ``close`` or ``over``, writes
  the columns into the folder's ``plan.csv`` (summary.md sets them against what
  each run measured), and records an ``over`` cell as pruned without launching
  it, unless ``--no-prune``.

The device's memory is ``--gpu-memory-gib``, else that of the smallest GPU this
machine's NVML lists (not for an executor whose jobs run on other machines); without
either, a prediction has no verdict and prunes nothing.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

from orchestrator.contract.devices import GIB
from orchestrator.contract.gpumemory import (
    NVML_LOWER_BOUND,
    MemoryPrediction,
    MemoryVerdict,
    gb,
    nvml_text,
)
from orchestrator.contract.trainers import task_line
from orchestrator.matrix.experiment import Experiment
from orchestrator.matrix.plan import Plan


def predicted(experiment: Experiment) -> bool:
    """Whether the check predicts the cell's memory: GPU cells (a CPU cell's is the host's)."""
    return experiment.device == "gpu"


def device_capacity(gib: float | None, *, here: bool = True) -> tuple[float | None, str]:
    """(one device's memory in bytes, where that figure came from); (None, "") unknown.
    ``here`` False: the jobs run on other machines (a cluster's), whose GPUs NVML here
    does not see: only ``gib`` says."""
    if gib is not None:
        return gib * GIB, f"--gpu-memory-gib {gib:g}"
    if not here:
        return None, ""
    from orchestrator.running.envinfo import nvml_gpus

    devices = [d for d in nvml_gpus().get("devices") or [] if d.get("memory_bytes")]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:  # the jobs' GPUs: by index or UUID, as CUDA reads them
        names = {v.strip() for v in visible.split(",") if v.strip()}
        devices = [d for d in devices if str(d.get("index")) in names or d.get("uuid") in names]
    if not devices:
        return None, ""
    smallest = min(devices, key=lambda d: d["memory_bytes"])
    return float(smallest["memory_bytes"]), f"this machine's {smallest.get('name') or 'GPU'}"


def with_memory(
    plan: Plan,
    predictions: Mapping[str, MemoryPrediction],
    capacity: float | None,
    source: str,
) -> Plan:
    """``plan`` with each predicted experiment's ``memory`` set (by its cell)."""
    experiments = tuple(
        dataclasses.replace(
            e,
            memory=MemoryVerdict(
                predictions[e.cell_id],
                capacity,
                source,
                # unpacked rows pad to the longest: full-length ones are a bound; packed
                # blocks and a fixed-shape task's batches are what runs
                certain=e.packing is True or _fixed_shape(e.task),
            ),
        )
        if e.cell_id in predictions
        else e
        for e in plan.experiments
    )
    return dataclasses.replace(plan, experiments=experiments)


def _fixed_shape(task: str) -> bool:
    line = task_line(task)
    return line is not None and line.fixed_shape


def _predicted_cells(plan: Plan) -> list[Experiment]:
    """One experiment per cell that has a prediction."""
    return [e for e in plan.cells() if e.memory is not None]


def memory_table(plan: Plan) -> list[str]:
    """``plan --memory``'s table: each predicted cell against the device's memory."""
    cells = _predicted_cells(plan)
    if not cells:
        return ["memory: no GPU cell to predict"]
    first = cells[0].memory
    assert first is not None
    capacity = (
        f"{first.capacity_bytes / GIB:.0f} GiB per GPU ({first.capacity_source})"
        if first.capacity_bytes
        else "unknown here: give --gpu-memory-gib to compare"
    )
    lines = [
        "memory, predicted before launch (torch's peak on the busiest GPU; NVML adds the "
        f"allocator's headroom and the CUDA context); device: {capacity}",
    ]
    rows = [("cell", "torch peak", "NVML", "largest term", "verdict")]
    for e in cells:
        m = e.memory
        assert m is not None
        p = m.prediction
        if p.refused is not None:
            rows.append((e.experiment_id, "-", "-", f"refused before launch: {p.refused}", ""))
            continue
        if p.peak_bytes is None:
            rows.append((e.experiment_id, "-", "-", f"not predicted: {p.error}", ""))
            continue
        rows.append(
            (
                e.experiment_id,
                gb(p.peak_bytes),
                nvml_text(p.nvml_bytes, p.nvml_lower_bound),
                p.largest_line(),
                _verdict_text(m),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows:
        lines.append(
            "  " + "  ".join(c.ljust(w) for c, w in zip(r[:4], widths, strict=True)) + "  " + r[4]
        )
    if any(e.memory and e.memory.prediction.nvml_lower_bound for e in cells):
        lines.append(f"  {NVML_LOWER_BOUND}")
    formulas = sorted({f for e in cells if e.memory for f in e.memory.prediction.formulas})
    if formulas:
        lines.append(
            "  where the CPU cannot run the GPU's way, formulas stand in: " + "; ".join(formulas)
        )
    return lines


def _verdict_text(m: MemoryVerdict) -> str:
    verdict = m.verdict
    if m.prunes:
        return "OVER: pruned before launch (--no-prune launches it)"
    if verdict == "over":
        return "over at full-length rows: launched (unpacked rows may be shorter)"
    if verdict == "close":
        return "close to the limit"
    return verdict or ""


def flagged_lines(plan: Plan) -> list[str]:
    """What the run's header says: the cells ``over`` (pruned) or ``close``."""
    cells = _predicted_cells(plan)
    out = []
    for e in cells:
        m = e.memory
        assert m is not None
        if m.verdict in ("over", "close"):
            p = m.prediction
            out.append(
                f"memory: {e.experiment_id} predicted {gb(p.peak_bytes or 0)} torch peak, "
                f"{gb(p.nvml_bytes or 0)} NVML, of {(m.capacity_bytes or 0) / GIB:.0f} GiB: "
                + (
                    "over, pruned before launch"
                    if m.prunes
                    else "over at full-length rows, launched: unpacked rows may be shorter"
                    if m.verdict == "over"
                    else "close to the limit"
                )
            )
    if cells and not out:
        first = cells[0].memory
        if first is not None and first.capacity_bytes:
            out.append(f"memory: {len(cells)} GPU cell(s) predicted to fit")
    return out
