"""The measurement hooks every trainer backend calls while it trains.

One object gathers what a run measures while the trainer runs: the step
clock and token counts (``trainer_entry.measure.steps.StepRecorder``), the GPU
memory counters at the start and end of training, and the progress file.
A backend calls it at four moments (see ``trainer_entry.backends.trainer_protocol``), so
every backend is measured by the same code.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trainer_entry.data.collate import BatchCounts
from trainer_entry.measure.flops import FlopsUnavailable, matmul_modules, sliding_windows
from trainer_entry.measure.memory import MemoryCounters
from trainer_entry.measure.progressfile import ProgressFile
from trainer_entry.measure.recompute import RecomputeWatch
from trainer_entry.measure.steps import StepRecorder

if TYPE_CHECKING:
    from trainer_entry.measure.profile import StepProfiler
    from trainer_entry.measure.steadystop import SteadyStop


class StepHooks:
    """Feeds a run's recorder, memory counters and progress file from the trainer's events."""

    def __init__(
        self,
        recorder: StepRecorder,
        memory: MemoryCounters | None = None,
        *,
        reset_peak_at_begin: bool = True,
        progress: ProgressFile | None = None,
        profiler: StepProfiler | None = None,
        steady: SteadyStop | None = None,
        recompute: RecomputeWatch | None = None,
    ) -> None:
        self.recorder = recorder
        self.memory = memory
        self.reset_peak_at_begin = reset_peak_at_begin
        self.progress = progress
        #: records a few steps after the warm-up (``profile_steps``); None: no profile
        self.profiler = profiler
        #: stops training at steady state (``measure: {until: steady}``); None: max_steps
        self.steady = steady
        #: watches the first optimizer step for what activation checkpointing reruns
        self.recompute = recompute

    def train_begin(self, max_steps: int) -> None:
        """Training is about to take its first step."""
        if self.memory is not None:
            # ends the loading interval; the reset makes torch's peak after training
            # training's own, without the load and wrapping spike
            self.memory.mark("train_begin", reset=self.reset_peak_at_begin)
        if self.progress is not None:
            # before the first step's clock starts
            self.progress.begin(max_steps)
        self.recorder.train_begin()
        if self.profiler is not None:
            # after the clock started: a profile from step 0 is in the profiled steps' time
            self.profiler.train_begin(max_steps)

    def batch(self, model: Any, counts: BatchCounts) -> None:
        """One micro-batch is about to be fed to ``model`` (the model as the trainer holds it)."""
        if self.recorder.windows is None:
            # before the first batch: which sliding windows to sum r·min(r, w) for
            try:
                self.recorder.windows = sliding_windows(model)
            except FlopsUnavailable:
                self.recorder.windows = ()
            if self.recompute is not None:
                # the first step (normally a warm-up step, left out of the measured
                # window) only: detached at its end. A model the watch cannot hook is no
                # reason to fail the run: its hardware figure says why it has none
                try:
                    self.recompute.attach(model, matmul_modules(model))
                except Exception as exc:
                    self.recompute.unwatched = f"the watch could not hook the model ({exc})"
                    self.recompute.detach()
        self.recorder.add_batch(
            counts.real, counts.padded, counts.lengths, counts=counts.counts, dims=counts.dims
        )

    def step_end(self, global_step: int) -> bool:
        """An optimizer step ended; True: training should stop now (steady state reached,
        the same answer on every rank)."""
        index = len(self.recorder.stats.step_times_s)
        if self.recompute is not None and self.recompute.attached:
            self.recompute.detach()
        if self.profiler is not None:
            # the profiler's stop and export before the clock: inside the profiled step
            self.profiler.step_ending()
        self.recorder.step_end()
        if self.profiler is not None:
            self.profiler.step_ended(index)
        # after the clock: its all-reduce is in the next step's time, like the progress write
        stop = self.steady is not None and self.steady.step_ended(
            self.recorder.stats.step_times_s[-1]
        )
        if self.progress is not None:
            # inside the next step's time, like everything between step ends; a write
            # (about once a second) is a small file replaced, see trainer_entry.measure.progressfile
            stats = self.recorder.stats
            self.progress.step(global_step, stats.step_tokens[-1], stats.step_times_s[-1])
        return stop

    def train_end(self, global_step: int) -> None:
        """Training ended after ``global_step`` steps."""
        if self.profiler is not None:
            self.profiler.train_end()
        if self.memory is not None:
            # no reset: the run reads the training peak after training returns
            self.memory.mark("train_end", reset=False)
        if self.progress is not None:
            self.progress.end(global_step)
