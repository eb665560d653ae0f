"""Eval after training (``eval: true``), and the loss trend every run gets.

**Eval.** The task holds out part of the prepared data (``trainer_entry.data.holdout``:
documents chosen by a hash of their position, 10% at most 256 by default,
``holdout`` to change it) and trains on the rest. After ``train()`` has
returned, and after the run has read its training figures (step clock,
memory peaks), every rank calls the trainer's own ``evaluate()`` on the
held-out part, so DDP, FSDP, DeepSpeed and DataParallel evaluate as the
Trainer does under them. Nothing of it is timed as training: the step hooks
are fed by ``training_step`` and the step-end callback, which evaluation never
calls, and the progress file was closed at the end of training.

The batches are made as the training ones are (the task's collator, or TRL's
under trainer ``sft``, which also packs and truncates the held-out part as it
did the training set), with the token counts taken out before the model sees
them. The eval batch per device is the training one unless the scenario sets
``per_device_eval_batch_size``, so eval needs no more memory than training.

What ``eval_loss`` is: the Trainer's. Each eval step's loss is its batch's
mean over the batch's loss items (causal-lm: the label tokens after the shift;
classification: the samples; with several ranks, the step's batches together
under trainer ``hf``, each rank's batch under ``sft`` and then the ranks'
means averaged); ``eval_loss`` is the mean of those batch means, each weighted
by the rows (samples) of its batch. ``perplexity`` is ``exp(eval_loss)``
(causal-lm only). Where every held-out row holds as many label tokens (trainer
``hf``'s packed rows, without prompt masking), that is the exact per-token
perplexity of the held-out tokens (``tests/unit/test_eval.py`` checks both
against the cross-entropy computed directly); otherwise a batch's token mean
counts by its rows, not its tokens, as in the Hugging Face examples'
perplexity. For classification the weighting makes it the mean over samples.

**Loss trend** (always, from the trainer's log): the least-squares slope of the
logged training loss over the measured steps (the throughput window
``trainer_entry.measure.steps.summarize`` reports), and how many logged steps had a loss or
gradient norm that is NaN or infinite. The Trainer's ``logging_nan_inf_filter``
(on by default) logs a non-finite step's loss as a finite stand-in, so the
gradient norm is what shows such a step.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeGuard

from orchestrator.contract.applicability import CLASSIFICATION_TASKS
from trainer_entry.data.collate import pop_counts
from trainer_entry.measure.steps import first_measured_step

if TYPE_CHECKING:
    from trainer_entry.backends.trainer_protocol import TrainerBackend
    from trainer_entry.settings.parsed import ParsedArguments
    from trainer_entry.tasks.task_protocol import Task, TaskData

#: the task whose eval loss is a mean over tokens, so that its exp is a perplexity
PERPLEXITY_TASKS = ("causal-lm",)


def _finite(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def loss_points(
    log_history: Sequence[Mapping[str, Any]], first_step: int, last_step: int
) -> list[tuple[int, float]]:
    """(step, loss) of the finite training losses logged at steps ``first_step`` < step ≤ ``last_step``."""
    logged = [(e["step"], e["loss"]) for e in log_history if "loss" in e and "step" in e]
    return window_points(logged, first_step, last_step)


def window_points(
    losses: Iterable[Sequence[Any]], first_step: int, last_step: int
) -> list[tuple[int, float]]:
    """(step, loss) of the finite losses of ``losses`` (step, loss) at steps
    ``first_step`` < step ≤ ``last_step``."""
    return [
        (int(step), float(loss))
        for step, loss in losses
        if first_step < int(step) <= last_step
        if _finite(loss)
    ]


def slope(points: Sequence[tuple[float, float]]) -> float | None:
    """The least-squares slope of ``points`` (x, y); None for fewer than two distinct x."""
    if len(points) < 2:
        return None
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    sxx = sum((x - mean_x) ** 2 for x, _ in points)
    if sxx == 0:
        return None
    return sum((x - mean_x) * (y - mean_y) for x, y in points) / sxx


def nonfinite_steps(log_history: Sequence[Mapping[str, Any]]) -> int:
    """Logged training steps whose loss or gradient norm is NaN or infinite."""
    return sum(
        1
        for e in log_history
        if "loss" in e
        and any(k in e and e[k] is not None and not _finite(e[k]) for k in ("loss", "grad_norm"))
    )


def loss_trend(
    log_history: Sequence[Mapping[str, Any]],
    summary: Mapping[str, Any],
    *,
    losses: Iterable[Sequence[Any]] | None = None,
) -> dict[str, Any]:
    """``loss_slope_per_step`` and ``loss_nonfinite_steps`` of a run.

    ``summary``: ``trainer_entry.measure.steps.summarize``'s figures. The slope is
    fitted over the window they measured throughput in, its last
    ``steps_measured`` of ``steps`` (after the warm-up and any profiled steps);
    None without step records (``instrumentation: false``) or with fewer than
    two logged losses in the window. ``losses``: the (step, loss) pairs of
    ``log_history`` already read from it (``trainer_entry.measure.steps.loss_summary``'s
    ``loss_history``); None: read them here.
    """
    steps, measured = summary.get("steps"), summary.get("steps_measured")
    first = first_measured_step(summary)
    if not (steps and measured) or first is None:
        fitted = None
    elif losses is None:
        fitted = slope(loss_points(log_history, first, int(steps)))
    else:
        fitted = slope(window_points(losses, first, int(steps)))
    return {"loss_slope_per_step": fitted, "loss_nonfinite_steps": nonfinite_steps(log_history)}


# ---------------------------------------------------------------------------
# Eval after training
# ---------------------------------------------------------------------------


@dataclass
class EvalResult:
    """The eval figures (``ChildMetrics``' ``eval_*`` and ``perplexity``) and notes on them."""

    figures: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


@dataclass
class WithoutCounts:
    """A collator whose batches lose the token counts the training collators add
    (``trainer_entry.data.collate``): the model's forward would refuse them."""

    inner: Any

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        batch = dict(self.inner(features))
        pop_counts(batch)
        return batch


def accuracy(prediction: Any) -> dict[str, float]:
    """Share of samples whose highest logit is their class (``compute_metrics``)."""
    import numpy as np

    logits = prediction.predictions
    if isinstance(logits, (tuple, list)):
        logits = logits[0]
    labels = np.asarray(prediction.label_ids)
    return {"accuracy": float((np.asarray(logits).argmax(axis=-1) == labels).mean())}


def evaluate(
    built: Any, *, task: Task, data: TaskData, parsed: ParsedArguments, backend: TrainerBackend
) -> EvalResult:
    """Run the trainer's ``evaluate()`` on the held-out examples (every rank calls it).

    ``built``: ``backend``'s trainer after ``train()``. A backend without a
    Hugging Face ``Trainer`` gets no figures and a note saying so.
    """
    from transformers import Trainer

    trainer = getattr(built, "trainer", None)
    if not isinstance(trainer, Trainer):
        return EvalResult(
            notes=[f"eval: trainer {parsed.backend} has no Trainer.evaluate(); no eval figures"]
        )
    if data.eval_examples is None:
        raise RuntimeError("eval: the task prepared no held-out examples")
    dataset = backend.eval_dataset(task, data, parsed)
    args = trainer.args
    saved = (trainer.data_collator, trainer.compute_metrics, args.per_device_eval_batch_size)
    trainer.data_collator = WithoutCounts(trainer.data_collator)
    if task.name in CLASSIFICATION_TASKS:
        trainer.compute_metrics = accuracy
    if "per_device_eval_batch_size" not in parsed.training:
        args.per_device_eval_batch_size = args.per_device_train_batch_size
    t = time.perf_counter()
    try:
        out = trainer.evaluate(eval_dataset=dataset)
    finally:
        trainer.data_collator, trainer.compute_metrics = saved[0], saved[1]
        args.per_device_eval_batch_size = saved[2]
    runtime = time.perf_counter() - t
    return eval_figures(out, task=task.name, samples=len(dataset), runtime_s=runtime)


#: the columns eval fills (empty in a run without eval)
EVAL_FIGURES = ("eval_loss", "perplexity", "eval_accuracy", "eval_runtime", "eval_samples")


def eval_figures(
    metrics: Mapping[str, Any], *, task: str, samples: int, runtime_s: float
) -> EvalResult:
    """The columns from the Trainer's eval metrics (``eval_loss``, ``eval_accuracy``)."""
    result = EvalResult()
    loss = metrics.get("eval_loss")
    finite = float(loss) if _finite(loss) else None
    if loss is not None and finite is None:
        result.notes.append(f"eval: the eval loss is {loss}: the model diverged")
    perplexity = None
    if finite is not None and task in PERPLEXITY_TASKS:
        try:
            perplexity = math.exp(finite)
        except OverflowError:
            result.notes.append(f"eval: perplexity exp({loss}) overflows; left empty")
    acc = metrics.get("eval_accuracy")
    result.figures = {
        "eval_loss": finite,
        "perplexity": perplexity,
        "eval_accuracy": float(acc) if _finite(acc) else None,
        "eval_runtime": runtime_s,
        "eval_samples": samples,
    }
    return result
