"""The memory predicted before launch against what the real training step allocates.

``trainer_entry.run.memoryplan.predict`` runs a cell's step on fake tensors and
counts its live bytes with ``LiveBytes``. Here the same CPU cells (from a plan)
train for real, in this process, through the child's own steps
(``trainer_entry.run.train``: configure, load, prepare_data, instrument,
build_trainer), and what they allocate is measured apart, by torch's own
``MemTracker`` (``torch.distributed._tools.mem_tracker``, another implementation
than ``LiveBytes``): the peak of the steady steps (those after the first, which
makes the optimizer's states) must be within 15% of the prediction, for full
fine-tuning and LoRA, the ``hf`` and the ``sft`` trainer, with and without
activation checkpointing. Every packed block is full and every token labelled,
the batch the prediction assumes.

A tracker of its own measures each optimizer step, entered at the step's begin
and left at its end, with the model, the optimizer's states and the micro-batch
registered (``track_external``: they were made outside it). One tracker over all
of ``train()`` would count what the tracker itself keeps alive: its module
tracker registers a gradient hook (``register_multi_grad_hook``, mode ``all``)
on every module input that requires a gradient, and for a leaf (the embeddings'
output that LoRA with checkpointing makes require one,
``enable_input_require_grads``) the hook's closure holds the leaf's gradient
accumulator, which holds the leaf: a cycle through autograd's C++ objects that
the garbage collector cannot see (torch 2.13). Each step would leave its
input activation and that one's gradient behind (2 x batch x length x hidden
fp32 bytes a step), never freed, and counted in every later step's peak; a
tracker made at a step's begin never saw the earlier steps' leftovers.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.distributed._tools.mem_tracker import MemTracker
from transformers import TrainerCallback

from orchestrator import api
from orchestrator.contract.spec import RunSpec
from trainer_entry.run import train
from trainer_entry.run.memoryplan import predict

pytestmark = pytest.mark.e2e

#: how far the prediction may be from the measured peak, either way
TOLERANCE = 0.15
BATCH, LENGTH, STEPS = 4, 256, 3
# the shipped dataset packs into 133 full blocks of 256 tokens: 3 steps of 4 use 12
SCENARIOS = f"""\
matrix:
  effective_batch_size: [{BATCH}]
  max_seq_len: [{LENGTH}]
  packing: [true]
  repeats: 1
scenarios:
  - name: full
    device: cpu
    arguments:
      model_name_or_path: tiny-llama
      max_steps: {STEPS}
      completion_only_loss: false
    sweep: {{trainer: [hf, sft], activation_checkpointing: [false, true]}}
  - name: lora
    device: cpu
    arguments:
      model_name_or_path: tiny-llama
      max_steps: {STEPS}
      completion_only_loss: false
      peft_method: lora
      r: 8
      target_modules: [q_proj, v_proj]
    sweep: {{trainer: [hf, sft], activation_checkpointing: [false, true]}}
"""
CPU = torch.device("cpu")
CASES = [
    (peft, trainer, checkpointing)
    for peft in ("full", "lora")
    for trainer in ("hf", "sft")
    for checkpointing in (False, True)
]


@pytest.fixture(scope="module", autouse=True)
def _one_thread() -> Iterator[None]:
    """Training in one thread: on a machine's few cores shared with other work, torch's
    threads wait on each other (a cell's three steps took 4-6 s instead of 0.8). What a
    step allocates does not depend on it."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def cells(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str, bool], dict[str, Any]]:
    """The plan's eight CPU cells, by (scenario, trainer, activation checkpointing)."""
    folder = tmp_path_factory.mktemp("memory-prediction")
    (folder / "scenarios.yaml").write_text(SCENARIOS, encoding="utf-8")
    (folder / "defaults.yaml").write_text("", encoding="utf-8")
    plan = api.plan(folder / "scenarios.yaml", defaults=folder / "defaults.yaml", device="cpu")
    out = {_case(e.scenario, e.arguments): e.spec() for e in plan.experiments}
    assert sorted(out) == sorted(CASES)
    return out


def _case(scenario: str, arguments: Mapping[str, Any]) -> tuple[str, str, bool]:
    return scenario, arguments["trainer"], bool(arguments["activation_checkpointing"])


class _NoHook:
    """What stands for a gradient hook on a frozen parameter (``remove`` does nothing)."""

    def remove(self) -> None:
        return None


class StepPeaks(TrainerCallback):  # type: ignore[misc]
    """Each optimizer step's peak, by ``MemTracker`` (a tracker per step: the module's
    docstring says why), with its categories: ``Total``, ``PARAM``, ``GRAD``, ``ACT``,
    ``TEMP``, ``OPT``, ``OTH`` (the micro-batch), ``BUFFER``."""

    def __init__(self, trainer: Any) -> None:
        self.tracker: MemTracker | None = None
        self.peaks: list[dict[str, int]] = []
        step: Callable[..., Any] = trainer.training_step

        def training_step(model: Any, inputs: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
            if self.tracker is not None:  # the micro-batch, collated before the step began
                batch = [v for v in inputs.values() if isinstance(v, torch.Tensor)]
                self.tracker.track_external(*batch)
            return step(model, inputs, *args, **kwargs)

        trainer.training_step = training_step

    def on_step_begin(
        self,
        args: Any,
        state: Any,
        control: Any,
        model: Any = None,
        optimizer: Any = None,
        **kw: Any,
    ) -> None:
        tracker = MemTracker()
        tracker.track_external(model, optimizer)
        # MemTracker hooks every parameter of a module it sees run, and a parameter that
        # requires no gradient (LoRA's frozen weights) refuses a hook: these are taken
        for p in model.parameters():
            if not p.requires_grad:
                tracker._param_to_grad_hook_handles[p] = (_NoHook(), _NoHook())
        tracker.__enter__()
        self.tracker = tracker

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        tracker = self.close()
        assert tracker is not None, "a step ended that did not begin"
        peak = tracker.get_tracker_snapshot("peak")
        assert set(peak) == {CPU}, f"memory outside the CPU: {sorted(map(str, peak))}"
        self.peaks.append({getattr(k, "name", str(k)): int(v) for k, v in peak[CPU].items()})

    def close(self) -> MemTracker | None:
        """Leave the step's tracker, if one is entered; it is returned."""
        tracker, self.tracker = self.tracker, None
        if tracker is not None:
            tracker.__exit__(None, None, None)
        return tracker


@dataclass
class Measured:
    #: each step's peak, by MemTracker's categories
    steps: list[dict[str, int]]
    data: dict[str, Any]

    @property
    def steady(self) -> dict[str, int]:
        """The peak of the steps after the first (the first makes the optimizer's states)."""
        return max(self.steps[1:], key=lambda s: s["Total"])


def measure(spec: RunSpec) -> Measured:
    """The cell trained for real, as the child trains it, each step's peak measured."""
    backend = train.load_backend(spec)
    job = train.configure(spec, backend)
    timings: dict[str, float] = {}
    loaded, _ = train.load(job, timings)
    data = train.prepare_data(job, loaded, timings)
    built, _ = train.build_trainer(job, loaded, data, train.instrument(job), timings)
    trainer = built.trainer  # type: ignore[attr-defined]  # hf's and sft's TrainerRun
    peaks = StepPeaks(trainer)
    trainer.add_callback(peaks)
    try:
        built.train()
    finally:
        peaks.close()  # a step that raised: its tracker is left, not kept entered
    return Measured(peaks.peaks, dict(data.meta))


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB"


#: the cases the default run holds (the plain test run stays short); tox -e floor holds
#: all eight, at the lowest versions pyproject allows (those of the GPU images)
DEFAULT_CASES = [("full", "hf", True), ("lora", "sft", False)]


def _id(case: tuple[str, str, bool]) -> str:
    peft, trainer, checkpointing = case
    return f"{peft}-{trainer}-{'ac' if checkpointing else 'noac'}"


@pytest.mark.parametrize(
    ("peft", "trainer", "checkpointing"),
    [
        *(pytest.param(*case, id=_id(case)) for case in DEFAULT_CASES),
        *(pytest.param(*case, id=f"floor-{_id(case)}", marks=pytest.mark.floor) for case in CASES),
    ],
)
def test_prediction_holds_against_the_real_step(
    cells: dict[tuple[str, str, bool], dict[str, Any]],
    tiny_path: Path,  # the tiny model, built once per session
    tmp_path: Path,
    peft: str,
    trainer: str,
    checkpointing: bool,
) -> None:
    spec = RunSpec(**cells[(peft, trainer, checkpointing)]).resolve(tmp_path)
    assert (spec.per_device_train_batch_size, spec.gradient_accumulation_steps) == (BATCH, 1)
    started = time.monotonic()
    predicted = predict(spec)
    predicted_s = time.monotonic() - started
    started = time.monotonic()
    measured = measure(spec)
    measured_s = time.monotonic() - started

    # the batch the prediction assumes: every block full, every token labelled
    data = measured.data
    assert data["tokens"] == data["sequences"] * LENGTH, data
    assert data["label_tokens"] == data["tokens"], data
    assert len(measured.steps) == STEPS

    steady = measured.steady
    peak = steady["Total"]
    ratio = predicted.peak_bytes / peak
    whole = max(s["Total"] for s in measured.steps)
    line = (
        f"{peft}/{trainer}/ac={checkpointing}: measured {peak} B ({_mib(peak)}), "
        f"predicted {predicted.peak_bytes} B ({_mib(predicted.peak_bytes)}), "
        f"ratio {ratio:.3f}; each step's peak {[s['Total'] for s in measured.steps]} "
        f"(all steps: {whole}); MemTracker at the peak {steady}; "
        f"predicted terms {predicted.terms}; {predicted_s:.1f} s predicting, "
        f"{measured_s:.1f} s training"
    )
    print(line)
    # the steady steps hold alike (nothing carried over from step to step)
    totals = [s["Total"] for s in measured.steps[1:]]
    assert max(totals) - min(totals) <= 0.01 * max(totals), line
    assert abs(ratio - 1) <= TOLERANCE, line


#: the other task families at their longest batch: every side and transcript longer than
#: max_seq_len (cut to it), so every micro-batch is the full-length one predicted
FAMILY_LENGTH = 64
FAMILY_SCENARIOS = """\
matrix:
  effective_batch_size: [4]
  max_seq_len: [64]
  repeats: 1
scenarios:
  - name: seq2seq
    device: cpu
    arguments: {{task: seq2seq-lm, model_name_or_path: tiny-t5, dataset: {pairs}, max_steps: 3}}
    sweep: {{activation_checkpointing: [false, true]}}
  - name: masked
    device: cpu
    arguments: {{task: masked-lm, model_name_or_path: tiny-bert, dataset: {texts}, max_steps: 3}}
    sweep: {{activation_checkpointing: [false, true]}}
  - name: speech
    device: cpu
    arguments: {{task: speech-recognition, model_name_or_path: tiny-whisper, dataset: {clips},
                max_steps: 3}}
    sweep: {{activation_checkpointing: [false, true]}}
"""
FAMILY_CASES = [
    (family, checkpointing)
    for family in ("seq2seq", "masked", "speech")
    for checkpointing in (False, True)
]


@pytest.fixture(scope="module")
def family_cells(
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[tuple[str, bool], dict[str, Any]]:
    import json

    folder = tmp_path_factory.mktemp("family-memory")
    long = " ".join(["alpha beta gamma delta"] * 60)
    pairs, texts, clips = (folder / n for n in ("pairs.jsonl", "texts.jsonl", "clips.jsonl"))
    pairs.write_text(
        "".join(json.dumps({"source": long, "target": long}) + "\n" for _ in range(64))
    )
    texts.write_text("".join(json.dumps({"text": long}) + "\n" for _ in range(64)))
    audio = [0.01 * (j % 13) for j in range(16000)]
    clips.write_text("".join(json.dumps({"audio": audio, "text": long}) + "\n" for _ in range(16)))
    (folder / "scenarios.yaml").write_text(
        FAMILY_SCENARIOS.format(pairs=pairs, texts=texts, clips=clips), encoding="utf-8"
    )
    (folder / "defaults.yaml").write_text("", encoding="utf-8")
    plan = api.plan(folder / "scenarios.yaml", defaults=folder / "defaults.yaml", device="cpu")
    out = {
        (e.scenario, bool(e.arguments["activation_checkpointing"])): e.spec()
        for e in plan.experiments
    }
    assert sorted(out) == sorted(FAMILY_CASES)
    return out


@pytest.mark.parametrize(
    ("family", "checkpointing"),
    [
        pytest.param("seq2seq", True, id="seq2seq-ac"),
        *(
            pytest.param(
                *case, id=f"floor-{case[0]}-{'ac' if case[1] else 'noac'}", marks=pytest.mark.floor
            )
            for case in FAMILY_CASES
        ),
    ],
)
def test_a_familys_prediction_holds_at_its_longest_batch(
    family_cells: dict[tuple[str, bool], dict[str, Any]],
    tmp_path: Path,
    family: str,
    checkpointing: bool,
) -> None:
    """seq2seq-lm, masked-lm and Whisper, predicted at the task's longest micro-batch
    (``Task.longest``) and trained on data whose every batch is that long."""
    spec = RunSpec(**family_cells[(family, checkpointing)]).resolve(tmp_path)
    predicted = predict(spec)
    measured = measure(spec)
    assert len(measured.steps) == STEPS
    peak = measured.steady["Total"]
    ratio = predicted.peak_bytes / peak
    print(f"{family}/ac={checkpointing}: measured {peak} B, predicted {predicted.peak_bytes} B")
    assert abs(ratio - 1) <= TOLERANCE, (ratio, predicted.terms, measured.steady)
