"""Show a plan: the table, the exact commands, and ``plan.csv``."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from orchestrator.contract.columns import KEY_COLUMNS
from orchestrator.contract.layout import write_atomic
from orchestrator.contract.wording import workers
from orchestrator.matrix.plan import Axis, Plan


def plan_rows(plan: Plan) -> list[dict[str, Any]]:
    """One row per experiment: the key columns, then one column per swept argument."""
    extra = [k for k in plan.swept_keys if k not in KEY_COLUMNS]
    rows = []
    for e in plan.experiments:
        row: dict[str, Any] = {
            "experiment_id": e.experiment_id,
            "scenario": e.scenario,
            "framework_config": e.framework,
            "model_name_or_path": e.model_name_or_path,
            "task": e.task,
            "trainer": e.trainer,
            "num_gpus": e.num_gpus,
            "processes": e.processes,
            "per_device_train_batch_size": e.per_device_train_batch_size,
            "gradient_accumulation_steps": e.gradient_accumulation_steps,
            "effective_batch_size": e.effective_batch_size,
            "max_seq_len": e.max_seq_len,
            "packing": e.packing,
            "peft_method": e.peft_method,
            "torch_dtype": e.torch_dtype,
            "device": e.device,
            "repeat": e.repeat,
            "position": e.position,
            "cell_id": e.cell_id,
            "status": "planned",
        }
        if plan.environments:  # a column only where the file lists environments
            row["environment"] = e.environment.name if e.environment is not None else None
        for key in extra:
            row[key] = e.swept.get(key)
        if e.memory is not None:  # predicted (plan --memory, the run's check)
            row.update(e.memory.row())
        rows.append(row)
    return rows


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, (list, tuple, dict)):
        return json.dumps(value, sort_keys=True)
    return str(value)


def plan_csv(plan: Plan) -> str:
    rows = plan_rows(plan)
    columns = list(dict.fromkeys(c for row in rows for c in row)) if rows else list(KEY_COLUMNS)
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(columns)
    for row in rows:
        writer.writerow([_cell(row.get(c)) for c in columns])
    return buf.getvalue()


def write_plan_csv(plan: Plan, path: Path) -> None:
    write_atomic(path, plan_csv(plan))


def format_header(
    plan: Plan, scenarios_file: Path, defaults_file: Path | None, notes: Sequence[str] = ()
) -> str:
    """The plan's header: where it comes from, each axis and its source, and the notes."""
    n = len(plan.experiments)
    lines = [
        f"tunematrix plan: {n} experiment{'s' if n != 1 else ''} from {scenarios_file}"
        + (f" (defaults: {defaults_file})" if defaults_file else " (no defaults file)"),
        f"  device:    {plan.device} ({plan.device_source})",
        f"  scenarios: {', '.join(plan.scenarios)}",
    ]
    unit = workers(plan.device == "cpu")
    for name, axis in plan.axes.items():
        label = f"num_gpus ({unit})" if name == "num_gpus" else name
        lines.append(f"  {label + ':':<24} {_axis_values(plan, name, axis)}")
    lines.append(f"  {'repeats:':<24} {plan.repeats.values[0]}  [{plan.repeats.source}]")
    for env in plan.environments:
        lines.append(f"  {'environment ' + env.name + ':':<24} {env.python}  [scenarios file]")
        lines.append(f"  {'':<24} {env.label()}")
    lines.extend(f"note: {note}" for note in (*plan.notes, *notes))
    return "\n".join(lines)


def _axis_values(plan: Plan, name: str, axis: Axis) -> str:
    """An axis as the rows use it: its values and source for the scenarios that take
    them, then on lines of their own the values of the scenarios that pin their own
    (``max_seq_len: 128`` in a scenario's arguments), with where they are set."""
    used: dict[str, list[Any]] = {}
    for e in plan.experiments:
        value = getattr(e, name)
        if value is not None and value not in used.setdefault(e.scenario, []):
            used[e.scenario].append(value)
    pins = {s: axes[name] for s, axes in plan.pinned_axes.items() if name in axes}
    following = [s for s in plan.scenarios if used.get(s) and s not in pins]
    text = f"{', '.join(_cell(v) for v in axis.values)}  [{axis.source}]"
    pinned: dict[tuple[str, str], list[str]] = {}
    for scenario in plan.scenarios:
        where = pins.get(scenario)
        if where and used.get(scenario):
            values = ", ".join(_cell(v) for v in used[scenario])
            pinned.setdefault((values, where), []).append(scenario)
    if not pinned:
        return text
    lines = [f"{text}: {', '.join(following)}" if following else f"({text}: used by none)"]
    lines += [
        f"{values}  [{where}: {', '.join(scenarios)}]"
        for (values, where), scenarios in pinned.items()
    ]
    return ("\n" + " " * 27).join(lines)


def format_table(plan: Plan) -> str:
    """The matrix as a fixed-width text table, one line per experiment."""
    unit = "procs" if plan.device == "cpu" else "gpus"
    columns: list[tuple[str, str]] = [
        ("#", "#"),
        ("experiment_id", "experiment_id"),
        ("scenario", "scenario"),
        ("framework_config", "framework"),
        ("model_name_or_path", "model"),
        ("task", "task"),
        ("trainer", "trainer"),
        ("num_gpus", unit),
        ("per_device_train_batch_size", "per_dev_bs"),
        ("gradient_accumulation_steps", "grad_acc"),
        ("effective_batch_size", "eff_bs"),
        ("max_seq_len", "seq_len"),
        ("packing", "packing"),
    ]
    if any(e.processes != e.num_gpus for e in plan.experiments):
        # dp: one process for all the GPUs of its cell
        columns.insert(columns.index(("num_gpus", unit)) + 1, ("processes", "procs"))
    columns += [(k, k) for k in plan.swept_keys if k not in dict(columns)]
    if plan.environments:
        columns.append(("environment", "environment"))
    if plan.repeats.values[0] > 1:
        columns.append(("repeat", "repeat"))
    rows = plan_rows(plan)
    cells = [[h for _, h in columns]]
    for i, row in enumerate(rows, 1):
        cells.append([str(i) if k == "#" else _cell(row.get(k)) or "-" for k, _ in columns])
    widths = [max(len(r[c]) for r in cells) for c in range(len(columns))]
    lines = []
    for r, row_cells in enumerate(cells):
        line = "  ".join(
            cell.rjust(w) if c == 0 else cell.ljust(w)
            for c, (cell, w) in enumerate(zip(row_cells, widths, strict=True))
        )
        lines.append(line.rstrip())
        if r == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)
