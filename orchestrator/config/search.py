"""A scenario's ``search:`` key: what ``tunematrix fit`` searches, checked where it is written.

``search: {max: per_device_train_batch_size}`` (or ``max_seq_len``), with an
optional lower bound that fits (``min``), an upper bound to stop at
(``limit``) and a safety ``margin``. It never changes the matrix: the planned
cells run as configured, and the search only reports.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.config.schema import SearchModel
from orchestrator.config.yamlio import Loc, YamlDoc

#: where a search starts when ``min`` is not given: one sample, or a short sequence
DEFAULT_MIN = {"per_device_train_batch_size": 1, "max_seq_len": 64}
#: steps of a probe: enough for the optimizer's state to exist (its memory is counted)
DEFAULT_PROBE_STEPS = 3


@dataclass(frozen=True)
class Search:
    """What to search and between which bounds (``None``: the default, or no limit)."""

    key: str
    low: int | None = None
    limit: int | None = None
    margin: float | None = None

    @property
    def start(self) -> int:
        """The lower bound the search probes first."""
        return self.low if self.low is not None else DEFAULT_MIN[self.key]


@dataclass(frozen=True)
class FitOptions:
    """How to search; ``None`` fields take the scenario's ``search:``, else the defaults."""

    probe_steps: int = DEFAULT_PROBE_STEPS
    #: what to search in every selected scenario (``--max``), overriding ``search:``
    search: str | None = None
    low: int | None = None
    limit: int | None = None
    margin: float | None = None
    #: one device's memory in GiB, where it is known better than here (``--memory-gib``)
    memory_gib: float | None = None


def resolve_search(doc: YamlDoc, model: SearchModel | None, loc: Loc) -> Search | None:
    """The checked ``search:`` of a scenario; a bound above the limit names its line."""
    if model is None:
        return None
    low = model.min if model.min is not None else DEFAULT_MIN[model.max]
    if model.limit is not None and low > model.limit:
        raise doc.error(
            f"min {low} is above limit {model.limit}; the search needs min <= limit",
            (*loc, "limit"),
        )
    return Search(key=model.max, low=model.min, limit=model.limit, margin=model.margin)
