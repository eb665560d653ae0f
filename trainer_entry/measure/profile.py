"""Opt-in profiles: a few steps after the warm-up recorded with ``torch.profiler``.

``StepProfiler`` is called by the measurement hooks (``trainer_entry.measure.hooks``)
at each step end, on both sides of the step clock. It starts the profiler just
after the clock of the last warm-up step, marks each profiled step with a
``ProfilerStep#<n>`` span (the name TensorBoard and Perfetto know as a step),
and in the last profiled step, before its clock stops, stops the profiler,
writes the rank's Chrome/Perfetto trace (``RunSpec.profile_dir``/``rank<k>.json``)
and waits for every rank at a barrier. So the start, the stop, the export and
the ranks' different export times all fall inside the profiled steps, which the
measured window leaves out (``trainer_entry.measure.steps.measured_window``); the
window starts with every rank past its export.

After training, each rank reads its own trace back and ``analyze_events``
derives the figures the result reports (the trace is their source of truth):

- the profiled time: the sum of the ``ProfilerStep#`` spans of the rank;
- communication: on a GPU, the collective kernels (NCCL's ``nccl*`` kernels,
  or kernels the profiler tags with a collective); on the CPU, gloo's
  ``gloo:<collective>`` spans on gloo's own threads, which last as long as the
  collective does (the ``c10d::`` ops on the training thread only enqueue it);
- compute: on a GPU, every other kernel; on the CPU, every other operator
  (``cpu_op`` events);
- each as the length of the union of its intervals within the profiled steps
  over the profiled time, so nested or concurrent events count once. Overlap is
  not subtracted: communication hidden behind compute counts in both, so the
  two shares may sum above 100%; ``comm_exposed_time_pct`` is the part of
  communication during which no compute ran;
- the top operators by self time (an operator's time less its children's; on a
  GPU, the kernel time each operator launched), as shares of all the operators'
  self time, summed over the ranks.

Nothing here runs, nor is torch's profiler imported, unless the spec asks for a
profile.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.contract.layout import profile_trace
from orchestrator.contract.window import profile_problem, warmup_of

if TYPE_CHECKING:
    from orchestrator.contract.spec import RunSpec
    from trainer_entry.settings.parsed import ParsedArguments

#: the span name of a profiled step (TensorBoard's and Perfetto's step marker)
STEP_SPAN = "ProfilerStep#"
#: operators shown in ``top_ops``
TOP_OPS = 5
#: the result's columns from a profile (``profile_figures``)
PROFILE_COLUMNS = (
    "comm_time_pct",
    "compute_time_pct",
    "comm_exposed_time_pct",
    "comm_time_per_step_ms",
    "profiled_step_time_ms",
    "profile_export_s",
    "top_ops",
)
#: CPU events that are a collective itself (gloo runs each on a thread of its own)
CPU_COLLECTIVE_PREFIXES = ("gloo:",)
#: operators that enqueue or wrap a collective: neither compute nor its duration
_COLLECTIVE_OP_PREFIXES = ("c10d::", "gloo:", "nccl:", "record_param_comms")

Interval = tuple[float, float]


# ---------------------------------------------------------------------------
# Recording
# ---------------------------------------------------------------------------


class StepProfiler:
    """Records ``steps`` steps after the warm-up on one rank and writes its trace.

    ``barrier``: waits for every rank (None alone); ``sync``: waits for the
    device (None on the CPU), so a step's span ends when its kernels have.
    """

    def __init__(
        self,
        steps: int,
        folder: Path,
        rank: int,
        *,
        warmup: int | None,
        on_gpu: bool,
        barrier: Callable[[], None] | None = None,
        sync: Callable[[], None] | None = None,
    ) -> None:
        self.steps = steps
        self.trace = profile_trace(folder, rank)
        self.rank = rank
        self.warmup = warmup
        self.on_gpu = on_gpu
        self._barrier = barrier
        self._sync = sync
        #: the first step to record; None until training begins, or when it will not
        self.first: int | None = None
        #: steps recorded so far
        self.recorded = 0
        #: wall seconds of the stop and the trace export
        self.export_s: float | None = None
        self.notes: list[str] = []
        self._profiler: Any = None
        self._span: Any = None

    @property
    def profiled(self) -> tuple[int, int] | None:
        """(first step, count) of the recorded steps; None when none were."""
        return (self.first, self.recorded) if self.first is not None and self.recorded else None

    def train_begin(self, max_steps: int) -> None:
        """Choose the steps: right after the warm-up, leaving at least one step measured."""
        if max_steps <= 0:
            self.notes.append("no profile: the run's number of steps is not known in advance")
            return
        problem = profile_problem(max_steps, self.warmup, self.steps)
        if problem is not None:
            self.notes.append(f"no profile: {problem}")
            return
        first = warmup_of(max_steps, self.warmup)
        self.first = first
        if first == 0:
            self._start()

    def step_ending(self) -> None:
        """A step is ending; its clock has not stopped yet."""
        if self._profiler is None:
            return
        if self._sync is not None:
            self._sync()
        self._span.__exit__(None, None, None)
        self._span = None
        self.recorded += 1
        if self.recorded == self.steps:
            self._finish()

    def step_ended(self, index: int) -> None:
        """Step ``index`` ended and its clock stopped: the next step begins."""
        if self._profiler is not None:
            self._enter_span()
        elif self.first is not None and self.recorded == 0 and index + 1 == self.first:
            self._start()

    def train_end(self) -> None:
        """Training ended; a profile still running (a short run) is written as it is."""
        if self._profiler is None:
            return
        if self._span is not None:
            self._span.__exit__(None, None, None)
            self._span = None
        self.notes.append(
            f"the profile was cut short: training ended after {self.recorded} of "
            f"{self.steps} profiled steps"
        )
        self._finish(barrier=False)

    def _start(self) -> None:
        import torch.profiler

        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.on_gpu:
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self._profiler = torch.profiler.profile(activities=activities)
        self._profiler.start()
        self._enter_span()

    def _enter_span(self) -> None:
        import torch.profiler

        self._span = torch.profiler.record_function(f"{STEP_SPAN}{self.recorded}")
        self._span.__enter__()

    def _finish(self, *, barrier: bool = True) -> None:
        t = time.perf_counter()
        profiler, self._profiler = self._profiler, None
        profiler.stop()
        self.trace.parent.mkdir(parents=True, exist_ok=True)
        # written beside and renamed: a reader sees no trace or a whole one
        tmp = self.trace.with_name(f".{self.trace.name}.tmp")
        profiler.export_chrome_trace(str(tmp))
        os.replace(tmp, self.trace)
        del profiler
        self.export_s = time.perf_counter() - t
        if barrier and self._barrier is not None:
            # every rank leaves the profiled steps together: a rank still exporting
            # would otherwise hold the others up in the first measured step
            self._barrier()

    def figures(self) -> RankProfile | None:
        """This rank's figures from its trace (read back after training); None without one."""
        if self.profiled is None or not self.trace.is_file():
            return None
        figures = analyze_events(read_trace(self.trace))
        if figures is not None:
            figures.export_s = self.export_s
        return figures


def _barrier() -> None:
    import torch.distributed

    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()


def step_profiler(
    spec: RunSpec, parsed: ParsedArguments, *, rank: int, world: int, on_gpu: bool
) -> StepProfiler | None:
    """The profiler the spec asks for (``profile_steps``); None when it asks for none, or
    when the run measures nothing (``instrumentation: false``: no step clock to keep out)."""
    if not spec.profile_steps or not spec.profile_dir or not parsed.measure.instrumentation:
        return None
    sync = None
    if on_gpu:
        import torch

        sync = torch.cuda.synchronize
    return StepProfiler(
        spec.profile_steps,
        Path(spec.profile_dir),
        rank,
        warmup=parsed.measure.warmup_steps_excluded,
        on_gpu=on_gpu,
        barrier=_barrier if world > 1 else None,
        sync=sync,
    )


@dataclass(frozen=True)
class ProfileOutcome:
    """What the result takes from a profile: the steps it recorded, its figures, notes."""

    #: (first step, count); None when no step was recorded
    profiled: tuple[int, int] | None = None
    figures: Mapping[str, Any] = field(default_factory=dict)
    notes: Sequence[str] = ()

    def columns(self) -> dict[str, Any]:
        """Every profile column of the result: the figures, the others None (not profiled:
        all None), so a result always reports each column the registry declares."""
        return {**dict.fromkeys(PROFILE_COLUMNS), **self.figures}


def profile_outcome(
    spec: RunSpec, profiler: StepProfiler | None, ranks: Sequence[RankProfile | None]
) -> ProfileOutcome:
    """The profile's part of the result, from this rank's profiler and every rank's figures."""
    if not spec.profile_steps:
        return ProfileOutcome()
    if profiler is None:
        return ProfileOutcome(
            notes=("no profile: instrumentation is off, so no step is measured or profiled",)
        )
    notes = [*profiler.notes]
    figures = profile_figures(ranks)
    if profiler.profiled is not None and not figures:
        notes.append("no profile figures: the traces have no profiled step")
    notes += profile_notes(ranks) if figures else []
    return ProfileOutcome(profiler.profiled, figures, notes)


# ---------------------------------------------------------------------------
# Analysis: pure functions of the trace's events
# ---------------------------------------------------------------------------


@dataclass
class RankProfile:
    """One rank's figures over its profiled steps (times in microseconds, the trace's unit)."""

    steps: int
    #: the profiled steps' time: the sum of their spans
    step_us: float
    comm_us: float
    compute_us: float
    #: communication while no compute ran
    comm_exposed_us: float
    #: operator name -> self time
    op_self_us: dict[str, float] = field(default_factory=dict)
    #: what the figures were read from: ``kernels`` (GPU) or ``cpu ops``
    source: str = "cpu ops"
    export_s: float | None = None


def read_trace(path: Path) -> list[dict[str, Any]]:
    """The events of a Chrome trace file (a ``traceEvents`` object or a bare list)."""
    import gzip

    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        data = json.load(f)
    events = data.get("traceEvents", []) if isinstance(data, dict) else data
    return [e for e in events if isinstance(e, dict)]


def union(intervals: Iterable[Interval]) -> list[Interval]:
    """The intervals merged: sorted, disjoint."""
    out: list[Interval] = []
    for start, end in sorted(intervals):
        if end <= start:
            continue
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def intersect(a: Sequence[Interval], b: Sequence[Interval]) -> list[Interval]:
    """The intersection of two sorted, disjoint interval lists."""
    out: list[Interval] = []
    i = j = 0
    while i < len(a) and j < len(b):
        start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if start < end:
            out.append((start, end))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def subtract(a: Sequence[Interval], b: Sequence[Interval]) -> list[Interval]:
    """``a`` less ``b``, both sorted and disjoint."""
    out: list[Interval] = []
    j = 0
    for start, end in a:
        while j < len(b) and b[j][1] <= start:
            j += 1
        k = j
        cursor = start
        while k < len(b) and b[k][0] < end:
            if b[k][0] > cursor:
                out.append((cursor, b[k][0]))
            cursor = max(cursor, b[k][1])
            k += 1
        if cursor < end:
            out.append((cursor, end))
    return out


def length(intervals: Iterable[Interval]) -> float:
    return sum(end - start for start, end in intervals)


def _span(event: Mapping[str, Any]) -> Interval | None:
    ts, dur = event.get("ts"), event.get("dur")
    if isinstance(ts, bool) or isinstance(dur, bool):
        return None
    if not isinstance(ts, (int, float)) or not isinstance(dur, (int, float)):
        return None
    return (float(ts), float(ts) + float(dur))


def _overlaps(event: Mapping[str, Any], window: Sequence[Interval]) -> bool:
    span = _span(event)
    return span is not None and bool(intersect([span], window))


def is_comm_kernel(event: Mapping[str, Any]) -> bool:
    """A GPU kernel that is a collective: NCCL's, or one tagged with a collective's name."""
    args = event.get("args")
    tagged = isinstance(args, Mapping) and "Collective name" in args
    return tagged or str(event.get("name", "")).lower().startswith("nccl")


def _collective_op(name: str) -> bool:
    return name.startswith(_COLLECTIVE_OP_PREFIXES)


def _self_times(events: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Operator name -> self time (its duration less its direct children's), per thread."""
    threads: dict[tuple[Any, Any], list[tuple[float, float, str]]] = {}
    for e in events:
        span = _span(e)
        if span is not None:
            threads.setdefault((e.get("pid"), e.get("tid")), []).append(
                (span[0], span[1], str(e.get("name", "")))
            )
    out: dict[str, float] = {}
    for spans in threads.values():
        # parents first: earlier start, then the longer one
        spans.sort(key=lambda s: (s[0], -(s[1] - s[0])))
        stack: list[list[Any]] = []  # [end, name, self time]

        def close(entry: list[Any]) -> None:
            out[entry[1]] = out.get(entry[1], 0.0) + max(0.0, entry[2])

        for start, end, name in spans:
            while stack and stack[-1][0] <= start:
                close(stack.pop())
            if stack:
                # a child: its time is not its parent's own
                stack[-1][2] -= min(end, stack[-1][0]) - start
            stack.append([end, name, end - start])
        while stack:
            close(stack.pop())
    return out


def analyze_events(events: Iterable[Mapping[str, Any]]) -> RankProfile | None:
    """One rank's communication, compute and operator figures from its trace's events.

    None when the trace has no profiled step (no ``ProfilerStep#`` span).
    """
    complete = [e for e in events if e.get("ph") == "X" and _span(e) is not None]
    steps = [e for e in complete if str(e.get("name", "")).startswith(STEP_SPAN)]
    if not steps:
        return None
    window = union(s for e in steps if (s := _span(e)) is not None)
    step_us = length(window)
    if step_us <= 0:
        return None
    within = [e for e in complete if _overlaps(e, window)]
    kernels = [e for e in within if e.get("cat") == "kernel"]
    if kernels:
        comm = [e for e in kernels if is_comm_kernel(e)]
        compute = [e for e in kernels if not is_comm_kernel(e)]
        ops = _kernel_time_by_op(kernels, within)
        source = "kernels"
    else:
        comm = [e for e in within if str(e.get("name", "")).startswith(CPU_COLLECTIVE_PREFIXES)]
        compute = [
            e
            for e in within
            if e.get("cat") == "cpu_op" and not _collective_op(str(e.get("name", "")))
        ]
        ops = _self_times([e for e in within if e.get("cat") == "cpu_op"] + comm)
        source = "cpu ops"
    comm_in = intersect(union(s for e in comm if (s := _span(e)) is not None), window)
    compute_in = intersect(union(s for e in compute if (s := _span(e)) is not None), window)
    return RankProfile(
        steps=len(steps),
        step_us=step_us,
        comm_us=length(comm_in),
        compute_us=length(compute_in),
        comm_exposed_us=length(subtract(comm_in, compute_in)),
        op_self_us=ops,
        source=source,
    )


def _kernel_time_by_op(
    kernels: Sequence[Mapping[str, Any]], events: Sequence[Mapping[str, Any]]
) -> dict[str, float]:
    """Kernel time per operator that launched it (linked by the trace's ``External id``);
    a collective's kernel, or one whose operator is not in the trace, counts under its own
    name (``ncclDevKernel_AllReduce_Sum_f32_RING_LL`` says more than the wrapping op)."""
    op_of: dict[Any, str] = {}
    for e in events:
        args = e.get("args")
        if e.get("cat") == "cpu_op" and isinstance(args, Mapping) and "External id" in args:
            op_of[args["External id"]] = str(e.get("name", ""))
    out: dict[str, float] = {}
    for k in kernels:
        span = _span(k)
        args = k.get("args")
        ext = args.get("External id") if isinstance(args, Mapping) else None
        own = _short_kernel_name(str(k.get("name", "")))
        name = own if is_comm_kernel(k) else op_of.get(ext) or own
        if span is not None:
            out[name] = out.get(name, 0.0) + span[1] - span[0]
    return out


def _short_kernel_name(name: str) -> str:
    """A kernel's name without its template and argument lists."""
    for stop in ("(", "<"):
        name = name.split(stop, 1)[0]
    return name.strip() or "kernel"


def top_ops(op_self_us: Mapping[str, float], n: int = TOP_OPS) -> str | None:
    """``aten::mm 31%, aten::bmm 12%, …``: the ``n`` operators with the most self time,
    each as a share of all the operators' self time."""
    total = sum(op_self_us.values())
    if total <= 0:
        return None
    ranked = sorted(op_self_us.items(), key=lambda kv: (-kv[1], kv[0]))[:n]
    return ", ".join(f"{name.replace(',', ' ')} {100 * t / total:.0f}%" for name, t in ranked)


def profile_figures(ranks: Sequence[RankProfile | None]) -> dict[str, Any]:
    """The result's profile columns from every rank's figures (their mean over the ranks;
    ``top_ops`` from the self times summed over the ranks). Empty without a figure."""
    present = [r for r in ranks if r is not None]
    if not present:
        return {}

    def mean(values: Iterable[float]) -> float:
        values = list(values)
        return sum(values) / len(values)

    summed: dict[str, float] = {}
    for r in present:
        for name, t in r.op_self_us.items():
            summed[name] = summed.get(name, 0.0) + t
    return {
        "comm_time_pct": mean(100 * r.comm_us / r.step_us for r in present),
        "compute_time_pct": mean(100 * r.compute_us / r.step_us for r in present),
        "comm_exposed_time_pct": mean(100 * r.comm_exposed_us / r.step_us for r in present),
        "comm_time_per_step_ms": mean(r.comm_us / r.steps / 1000 for r in present),
        "profiled_step_time_ms": mean(r.step_us / r.steps / 1000 for r in present),
        # the slowest rank's stop and export (inside the last profiled step)
        "profile_export_s": max(
            (r.export_s for r in present if r.export_s is not None), default=None
        ),
        "top_ops": top_ops(summed),
    }


def profile_notes(ranks: Sequence[RankProfile | None]) -> list[str]:
    """What a reader of the profile columns needs to know: missing ranks, the source.

    ``ranks``: every rank's figures (None for a rank that left no trace)."""
    world = len(ranks)
    present = [r for r in ranks if r is not None]
    notes = []
    if present and len(present) < world:
        notes.append(
            f"profile figures from {len(present)} of {world} ranks (the others left no trace)"
        )
    if present:
        sources = sorted({r.source for r in present})
        notes.append(
            "profile: communication and compute are from "
            + " and ".join(sources)
            + "; they overlap, so their shares may sum above 100%"
        )
    return notes
