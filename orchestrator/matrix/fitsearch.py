"""The largest value that fits: the bisection over probes, searches, probe experiments. Pure.

A search raises one value of a cell (its per-device batch or its sequence
length) until a fresh launch no longer fits. It first probes the lower bound
(when that does not fit, nothing does), or the value the memory prediction
puts highest within the margin (and the lower bound only where that one does
not fit), then doubles until the first probe that does not fit (or the
limit), then bisects between the largest value that
fitted and the smallest that did not. The next value depends only on the
verdicts so far (:func:`decide`), so a resumed search asks for exactly the
probes it still lacks.

A probe that ends for a reason other than memory (a crash, a time limit) is
no verdict on memory: the search stops there and says why, rather than taking
it for "does not fit".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from orchestrator.config.values import canonical_json
from orchestrator.contract.choices import SEARCH_KEYS
from orchestrator.matrix.experiment import Experiment
from orchestrator.matrix.ids import experiment_id, spec_digest, spec_hash

#: ``fits``: ran and stayed within the margin; ``too_big``: out of memory, or above
#: the margin; ``stop``: ended for another reason (no verdict on memory)
Verdict = Literal["fits", "too_big", "stop"]
#: why a search ended
Ending = Literal["bracketed", "limit", "nothing fits", "stopped"]
#: the batch arithmetic a probe sets itself (accumulation 1: one micro-batch per step)
_BATCH_ARGUMENTS = ("per_device_train_batch_size", "gradient_accumulation_steps")


@dataclass(frozen=True)
class Decision:
    """Where a search stands after the verdicts so far."""

    #: the value to probe next; None when the search has ended
    next: int | None
    #: the largest value that fitted (below any value that did not)
    largest_fit: int | None
    #: the smallest value that did not fit
    first_too_big: int | None
    #: why it ended (None while it goes on)
    ending: Ending | None = None


def decide(
    verdicts: Mapping[int, Verdict],
    low: int,
    limit: int | None = None,
    start: int | None = None,
) -> Decision:
    """The next probe, from the verdicts so far (value -> verdict).

    ``low``: the lower bound, probed first; ``limit``: no probe goes above it.
    ``start``: a value above ``low`` predicted to fit, probed first instead: where it
    fits, ``low`` (smaller) needs no probe; where it does not, ``low`` is probed next.
    Doubling from the largest fit until a value does not fit, then bisection;
    a fit above a value that did not fit (memory is not monotone there) is
    ignored, so the answer stays below every value that did not fit.
    """
    if limit is not None and low > limit:
        raise ValueError(f"the lower bound {low} is above the limit {limit}")
    if start is not None and start > low and (limit is None or start <= limit):
        if start not in verdicts:
            return Decision(next=start, largest_fit=None, first_too_big=None)
        if verdicts[start] == "too_big" and low not in verdicts:
            return Decision(next=low, largest_fit=None, first_too_big=start)
    elif low not in verdicts:
        return Decision(next=low, largest_fit=None, first_too_big=None)
    too_big = sorted(v for v, verdict in verdicts.items() if verdict == "too_big")
    first_too_big = too_big[0] if too_big else None
    fits = [
        v
        for v, verdict in verdicts.items()
        if verdict == "fits" and (first_too_big is None or v < first_too_big)
    ]
    largest = max(fits) if fits else None
    if any(verdict == "stop" for verdict in verdicts.values()):
        return Decision(None, largest, first_too_big, "stopped")
    if largest is None:
        return Decision(None, None, first_too_big, "nothing fits")
    if first_too_big is None:
        if limit is not None and largest >= limit:
            return Decision(None, largest, None, "limit")
        step = 2 * largest
        return Decision(min(step, limit) if limit is not None else step, largest, None)
    if first_too_big - largest <= 1:
        return Decision(None, largest, first_too_big, "bracketed")
    return Decision((largest + first_too_big) // 2, largest, first_too_big)


def search(
    verdict_of: Callable[[int], Verdict], low: int, limit: int | None = None
) -> tuple[Decision, list[tuple[int, Verdict]]]:
    """Run a whole search against ``verdict_of``; the end and the probes in order."""
    verdicts: dict[int, Verdict] = {}
    probes: list[tuple[int, Verdict]] = []
    while True:
        decision = decide(verdicts, low, limit)
        if decision.next is None:
            return decision, probes
        verdicts[decision.next] = verdict_of(decision.next)
        probes.append((decision.next, verdicts[decision.next]))


def linear_scan(
    verdict_of: Callable[[int], Verdict], low: int, limit: int | None = None
) -> tuple[Decision, list[tuple[int, Verdict]]]:
    """The search without bisection: low, low+1, ... until a value does not fit."""
    probes: list[tuple[int, Verdict]] = []
    value, largest = low, None
    while limit is None or value <= limit:
        verdict = verdict_of(value)
        probes.append((value, verdict))
        if verdict == "stop":
            return Decision(None, largest, None, "stopped"), probes
        if verdict == "too_big":
            return Decision(None, largest, value, "bracketed" if largest else "nothing fits"), (
                probes
            )
        largest, value = value, value + 1
    return Decision(None, largest, None, "limit"), probes


# ---------------------------------------------------------------------------
# Searches and probes
# ---------------------------------------------------------------------------


def varied(key: str) -> tuple[str, ...]:
    """What a search leaves out: the searched value and the batch arithmetic around it.

    A batch search spans every effective batch of a setup; a sequence search keeps
    the per-device batch (memory grows with it) but not the accumulation.
    """
    if key not in SEARCH_KEYS:
        raise ValueError(f"cannot search {key!r}; one of {', '.join(SEARCH_KEYS)}")
    if key == "max_seq_len":
        return ("max_seq_len", "gradient_accumulation_steps")
    return _BATCH_ARGUMENTS


def search_key(experiment: Experiment, key: str) -> str:
    """The digest shared by every planned cell that differs only in what the search varies.

    The same model, task, framework, PEFT setup, GPU count, data, accelerate
    config's content and environment; neither the effective batch nor the repeat.
    """
    left_out = varied(key)
    arguments = {k: v for k, v in experiment.arguments.items() if k not in left_out}
    return spec_digest(
        {
            "scenario": experiment.scenario,
            "framework": experiment.framework,
            "model": experiment.model_name_or_path,
            "device": experiment.device,
            "num_gpus": experiment.num_gpus,
            "arguments": arguments,
            "max_seq_len": None if key == "max_seq_len" else experiment.max_seq_len,
            "per_device": (
                experiment.per_device_train_batch_size if key == "max_seq_len" else None
            ),
            "packing": experiment.packing,
            "accelerate": experiment.accelerate.digest if experiment.accelerate else None,
            "env": canonical_json(dict(experiment.env)),
            "data_processing": experiment.data_processing,
            "environment": experiment.environment.digest if experiment.environment else None,
            "searched": key,
            # only where the scenario names an allocator, so other probes' ids stay
            **(
                {"allocator": experiment.allocator.identity()}
                if experiment.allocator is not None
                else {}
            ),
        }
    )


def search_label(experiment: Experiment, key: str) -> str:
    """A readable name of a search: what stays fixed while ``key`` is searched."""
    parts = [
        experiment.scenario,
        experiment.model_name_or_path,
        experiment.framework,
        f"{experiment.processes if experiment.device == 'cpu' else experiment.num_gpus}"
        + (" process(es)" if experiment.device == "cpu" else " GPU(s)"),
    ]
    if experiment.peft_method:
        parts.append(str(experiment.peft_method))
    if key == "max_seq_len":
        parts.append(f"per-device batch {experiment.per_device_train_batch_size}")
    elif experiment.max_seq_len is not None:
        parts.append(f"max_seq_len {experiment.max_seq_len}")
    if experiment.packing is not None:
        parts.append("packed" if experiment.packing else "not packed")
    if experiment.environment is not None:
        parts.append(experiment.environment.name)
    return ", ".join(parts)


def search_problem(experiment: Experiment, key: str) -> str | None:
    """Why ``key`` cannot be searched on this cell; None when it can."""
    if key == "max_seq_len" and experiment.max_seq_len is None:
        return f"task {experiment.task} takes no max_seq_len"
    return None


def probe_experiment(experiment: Experiment, key: str, value: int, steps: int) -> Experiment:
    """A short run of ``experiment``'s setup with ``key`` set to ``value``: its own id.

    One micro-batch per step (accumulation 1), ``steps`` steps, no profile, no
    eval and the fixed step count: a probe measures whether it fits, and the
    id's hash covers the probed value, so every probe has its own folder.
    """
    if value <= 0 or steps <= 0:
        raise ValueError(f"a probe needs a positive value and step count, got {value}, {steps}")
    per_device = value if key == "per_device_train_batch_size" else None
    per_device = per_device or experiment.per_device_train_batch_size
    seq = value if key == "max_seq_len" else experiment.max_seq_len
    effective = per_device * experiment.num_gpus
    arguments: dict[str, Any] = {
        k: v for k, v in experiment.arguments.items() if k not in ("eval", "holdout")
    }
    arguments.update(
        per_device_train_batch_size=per_device, gradient_accumulation_steps=1, max_steps=steps
    )
    if seq is not None:
        arguments["max_seq_len"] = seq
    digest = spec_hash(
        {
            "fit_family": search_key(experiment, key),
            "searched": key,
            "value": value,
            "per_device_train_batch_size": per_device,
            "max_seq_len": seq,
            "probe_steps": steps,
        }
    )
    eid = experiment_id(
        scenario=experiment.scenario,
        model_name_or_path=experiment.model_name_or_path,
        framework=experiment.framework,
        num_gpus=experiment.num_gpus,
        effective_batch_size=effective,
        repeat=0,
        digest=digest,
        environment=experiment.environment.name if experiment.environment else None,
    )
    changes: dict[str, Any] = {
        "experiment_id": eid,
        "cell_id": eid,
        "effective_batch_size": effective,
        "per_device_train_batch_size": per_device,
        "gradient_accumulation_steps": 1,
        "max_seq_len": seq,
        "repeat": 0,
        "arguments": arguments,
        "swept": dict(experiment.swept),
        "profile_steps": 0,
    }
    # fields other features add to a cell: a probe runs the fixed step count, alone
    names = {f.name for f in dataclasses.fields(Experiment)}
    changes.update({name: None for name in ("measure", "position") if name in names})
    return dataclasses.replace(experiment, **changes)
