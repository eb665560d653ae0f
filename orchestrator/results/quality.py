"""summary.md's quality column: whether a cell learnt, next to how fast it ran.

Per cell (medians over its ok repeats): the perplexity (causal-lm) or eval
loss and accuracy (classification) on the held-out split where the cell ran
with ``eval: true``, else the training loss first → last; then the slope of
the training loss over the measured steps (loss per optimizer step). A cell
whose loss diverged is flagged, so a fast cell that does not learn stands out:

- a logged loss or gradient norm was NaN or infinite (``loss_nonfinite_steps``;
  the Trainer logs a NaN step's loss as a finite stand-in, its gradient norm as
  it is), or
- the last logged loss is above ``DIVERGENCE_RATIO`` times the first.

The figures come from the child (``trainer_entry/results/evaluate.py``); this module
only reads a cell's columns.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from orchestrator.results.aggregate import has_figures
from orchestrator.results.numbers import number

#: the last logged loss above this many times the first is divergence
DIVERGENCE_RATIO = 1.5
HEADER = "quality"
#: the quality column is shown where a cell has one of these (it also reads
#: eval_accuracy, loss_last and loss_nonfinite_steps)
SHOWN_BY = ("eval_loss", "perplexity", "loss_slope_per_step", "loss_first")
NOTE = (
    f"**{HEADER}**: with `eval: true`, the perplexity (exp of the eval loss, causal-lm) or "
    "the eval loss and accuracy (classification) on the held-out split; otherwise the "
    "training loss first → last. Then the slope of the training loss over the measured "
    "steps, per optimizer step (negative: it falls). **DIVERGED**: a logged loss or "
    f"gradient norm was NaN or infinite, or the last loss is above {DIVERGENCE_RATIO:g}× "
    "the first."
)


def _text(value: float) -> str:
    return f"{value:.4g}"


def diverged(cell: Mapping[Any, Any]) -> str | None:
    """Why the cell's loss diverged (one phrase), or None when it did not or is unknown."""
    nonfinite = number(cell.get("loss_nonfinite_steps"))
    if nonfinite:
        return f"loss or grad norm NaN/inf at {nonfinite:g} logged step(s)"
    first, last = number(cell.get("loss_first")), number(cell.get("loss_last"))
    if first is not None and last is not None and first > 0 and last > DIVERGENCE_RATIO * first:
        return f"loss {_text(first)} → {_text(last)}, over {DIVERGENCE_RATIO:g}× the first"
    return None


def quality_text(cell: Mapping[Any, Any]) -> str:
    """The cell's quality column: eval figures or the loss first → last, the slope, a flag."""
    parts: list[str] = []
    perplexity = number(cell.get("perplexity"))
    eval_loss = number(cell.get("eval_loss"))
    accuracy = number(cell.get("eval_accuracy"))
    first, last = number(cell.get("loss_first")), number(cell.get("loss_last"))
    if perplexity is not None:
        parts.append(f"ppl {_text(perplexity)}")
    elif eval_loss is not None:
        text = f"eval loss {_text(eval_loss)}"
        if accuracy is not None:
            text += f", acc {100 * accuracy:.1f}%"
        parts.append(text)
    elif first is not None and last is not None:
        parts.append(f"loss {_text(first)} → {_text(last)}")
    slope = number(cell.get("loss_slope_per_step"))
    if slope is not None:
        parts.append(f"{slope:+.3g}/step")
    reason = diverged(cell)
    if reason:
        parts.insert(0, f"**DIVERGED** ({reason})")
    return "; ".join(parts) or "–"


def shows_quality(cells: pd.DataFrame) -> bool:
    """Whether any cell has a figure for the quality column."""
    return any(has_figures(cells, name) for name in SHOWN_BY)
