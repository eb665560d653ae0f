"""Every cell checked against the installed training stack, once per run, before launching.

A setting the installed libraries do not take (transformers 5.17 has no
``activation_checkpointing``), a model that is nowhere to be found, a dataset
file that is missing: each would otherwise fail every job of the matrix, one
launch at a time, after the imports and the model's build. Here the plan's
cells go, once per interpreter they run under, to the child's own check
(``python -m trainer_entry.check``, in that interpreter), and the first
problem comes back as one line naming the file, line and key that set it, and
the library and version that refused it, before anything is written or
started.

Each distinct model is resolved once as well; one found only in the hub cache
while the hub does not answer runs offline (``Experiment.hub_offline``), so
its jobs do not each wait out the hub's retries.

A cell's verdict is kept (``orchestrator.running.checkverdicts``): a rerun, a
resume or another matrix on the same stack, code, settings and files asks the
child only about the cells it has not seen.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestrator.contract.checking import ANSWER
from orchestrator.contract.errors import UserError
from orchestrator.contract.gpumemory import MemoryPrediction
from orchestrator.contract.layout import file_mode, project_pythonpath
from orchestrator.matrix.experiment import Experiment
from orchestrator.matrix.plan import Plan
from orchestrator.running.checkverdicts import open_verdicts

#: how long the check may take in one interpreter (the imports alone take 5 s on a
#: laptop and 15 s on some GPU machines; a hub that does not answer adds 5 s)
CHECK_TIMEOUT_S = 300.0
#: the versions named in the summary line, in this order
SHOWN = ("torch", "transformers", "trl", "peft", "accelerate", "datasets")


@dataclass(frozen=True)
class Checked:
    """What the check found in one interpreter."""

    #: the interpreter (its path), and the ``environments:`` entry it is (None: this one)
    python: str
    environment: str | None
    versions: Mapping[str, str | None]
    #: model name -> where it was found (``where``, ``offline``) or why not (``error``)
    models: Mapping[str, Mapping[str, Any]]
    cells: int
    #: GPU cells whose trainer configuration was not built here (no GPU on this machine)
    unbuilt: int
    seconds: float
    #: the cells whose verdict was kept from an earlier check (not asked again)
    kept: int = 0

    def line(self) -> str:
        """``checked 6 cells against torch 2.13.0, transformers 5.17.0, … (5.1 s)``."""
        shown = ", ".join(f"{n} {self.versions[n]}" for n in SHOWN if self.versions.get(n))
        where = f" in environment '{self.environment}'" if self.environment else ""
        unbuilt = (
            f"; {self.unbuilt} GPU cell(s) had their names checked, not their values (no GPU here)"
            if self.unbuilt
            else ""
        )
        kept = (
            f"; {'all' if self.kept == self.cells else self.kept} kept from an earlier check "
            "of this stack, code and settings"
            if self.kept
            else ""
        )
        return (
            f"checked {self.cells} cell(s){where} against {shown} "
            f"({self.seconds:.1f} s{kept}){unbuilt}"
        )

    def model_lines(self) -> list[str]:
        return [
            f"model {name}: {found['where']}"
            for name, found in self.models.items()
            if "where" in found
        ]


@dataclass
class StackCheck:
    """The check of every interpreter of a plan, and the plan it leaves."""

    plan: Plan
    checked: list[Checked] = field(default_factory=list)
    #: ``--no-check``: nothing was checked
    skipped: bool = False
    #: cell id -> its predicted GPU memory, for the cells it was asked for
    memory: dict[str, MemoryPrediction] = field(default_factory=dict)
    #: cell id -> why it is refused before launch, at the place that set it (only where
    #: the check was asked not to stop at the first problem: ``plan --memory``)
    refused: dict[str, str] = field(default_factory=dict)

    def lines(self) -> list[str]:
        """What the run's header says about it."""
        if self.skipped:
            return ["not checked against the installed libraries (--no-check)"]
        out = []
        for one in self.checked:
            out.append(one.line())
            out.extend(f"  {line}" for line in one.model_lines())
        return out


#: the variables of a framework's ``env:`` that change what the check finds (the hub,
#: its cache and token, transformers' own switches); the others (a plugin's config file)
#: do not split the check
_HUB_PREFIXES = ("HF_", "HUGGINGFACE_", "TRANSFORMERS_")


def _hub_env(experiment: Experiment) -> tuple[tuple[str, str], ...]:
    """What of the experiment's framework ``env:`` the check must run with."""
    return tuple(sorted((k, v) for k, v in experiment.env.items() if k.startswith(_HUB_PREFIXES)))


def _group(experiment: Experiment) -> tuple[str | None, tuple[tuple[str, str], ...]]:
    """The experiments one check answers for: one interpreter, one hub environment."""
    return experiment.python, _hub_env(experiment)


def _environment(overlay: Mapping[str, str]) -> dict[str, str]:
    """The check's environment: a job's (this one's, with the hub settings of its
    framework's ``env:``), less what only a launch sets."""
    return {
        **os.environ,
        **overlay,
        "PYTHONPATH": project_pythonpath(),
        "TOKENIZERS_PARALLELISM": "false",
    }


def run_check(
    python: str,
    cells: Sequence[Experiment],
    timeout_s: float = CHECK_TIMEOUT_S,
    memory: Sequence[str] = (),
) -> dict[str, Any]:
    """The child's answer for ``cells`` (which share an interpreter and hub settings,
    ``_group``) from interpreter ``python``; ``UserError`` when it cannot give one.
    ``memory``: the cell ids whose GPU memory it predicts too."""
    request = {
        "cells": [{"id": e.cell_id, "spec": e.spec()} for e in cells],
        "memory": list(memory),
    }
    try:
        proc = subprocess.run(
            [python, "-m", "trainer_entry.check"],
            input=json.dumps(request),
            capture_output=True,
            text=True,
            env=_environment(dict(_hub_env(cells[0])) if cells else {}),
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        raise UserError(
            f"the check of the training stack ({python} -m trainer_entry.check) did not finish "
            f"in {timeout_s:.0f} s; nothing was started"
        ) from None
    except OSError as exc:
        raise UserError(
            f"{python} cannot be run ({exc.strerror or exc}); nothing was started"
        ) from None
    marked = [line for line in proc.stdout.splitlines() if line.startswith(ANSWER)]
    try:
        answer = json.loads(marked[-1].removeprefix(ANSWER)) if marked else None
    except ValueError:
        answer = None
    if proc.returncode != 0 or not isinstance(answer, dict):
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        with tempfile.NamedTemporaryFile(
            "w", prefix="tunematrix-check-", suffix=".log", delete=False
        ) as log:
            log.write(proc.stderr)
        os.chmod(log.name, file_mode())
        raise UserError(
            f"the check of the training stack failed in {python} (exit {proc.returncode}: "
            f"{last}; its stderr is in {log.name}); nothing was started"
        )
    return answer


def _problem_line(
    problems: Sequence[Mapping[str, Any]],
    by_cell: Mapping[str, Experiment],
    environment: str | None,
) -> UserError:
    """The first problem at the place that set it, with how many cells share it."""
    first = problems[0]
    same = [
        p for p in problems if (p.get("key"), p["message"]) == (first.get("key"), first["message"])
    ]
    scenarios = sorted({by_cell[p["cell"]].scenario for p in same})
    context = f"{len(same)} cell(s) of {', '.join(scenarios)}"
    if environment:
        context += f", environment '{environment}'"
    others = len(problems) - len(same)
    more = f"; {others} other problem(s) after it" if others else ""
    return _placed(first, by_cell[first["cell"]], f" ({context}{more}); nothing was started")


def _placed(problem: Mapping[str, Any], experiment: Experiment, after: str = "") -> UserError:
    """One problem (and ``after``) at the place that set it."""
    key = problem.get("key")
    message = str(problem["message"])
    if key and not experiment.has_place(key):
        message = f"{key}: {message}"  # a setting tunematrix sets: named, as no line is
    return experiment.place(key).error(message + after)


def _check_group(
    done: StackCheck,
    group: tuple[str | None, tuple[tuple[str, str], ...]],
    cells: list[Experiment],
    *,
    run: Callable[[str, Sequence[Experiment]], dict[str, Any]],
    keep: bool,
    recheck: bool,
    memory: Callable[[Experiment], bool] | None,
    stop: bool,
) -> set[tuple[object, str]]:
    """The cells of one interpreter and environment checked into ``done`` (see
    ``check_stack``); the (group, model) pairs found only offline."""
    python = group[0] or sys.executable
    environment = cells[0].environment.name if cells[0].environment is not None else None
    started = time.monotonic()
    kept = open_verdicts(python, _environment(dict(group[1]))) if keep else None
    wanted = {e.cell_id for e in cells if memory is not None and memory(e)}
    earlier = {} if kept is None or recheck else kept.found(cells)
    # a kept verdict without the prediction asked for is asked again
    earlier = {
        cell: verdict
        for cell, verdict in earlier.items()
        if cell not in wanted or "memory" in verdict or "problems" in verdict
    }
    asked = [e for e in cells if e.cell_id not in earlier]
    predict = [e.cell_id for e in asked if e.cell_id in wanted]
    answer = run(python, asked, **({"memory": predict} if predict else {})) if asked else {}
    predicted = {**(answer.get("memory") or {})}
    predicted.update(
        (cell, verdict["memory"])
        for cell, verdict in earlier.items()
        if cell in wanted and "memory" in verdict
    )
    done.memory.update(
        (cell, MemoryPrediction.from_answer(found)) for cell, found in predicted.items()
    )
    by_cell = {e.cell_id: e for e in cells}
    models: dict[str, Mapping[str, Any]] = dict(answer.get("models") or {})
    # a model that leads nowhere: one problem for each cell that names it
    failed = [
        {"cell": e.cell_id, "key": "model_name_or_path", "message": models[name]["error"]}
        for name in models
        if "error" in models[name]
        for e in asked
        if e.model_name_or_path == name
    ]
    found = [p for p in answer.get("problems") or [] if p["cell"] in by_cell]
    if kept is not None and asked:
        # what passed is kept before a problem stops the run, and so is what the child
        # found wrong with a cell (asked again once its settings or files change)
        refusals: dict[str, list[Mapping[str, Any]]] = {}
        for p in found:
            refusals.setdefault(p["cell"], []).append(p)
        kept.keep(
            asked, answer, failed={p["cell"] for p in failed} | set(refusals), refusals=refusals
        )
    problems = [
        *failed,
        *(dict(p, cell=cell) for cell, v in earlier.items() for p in v.get("problems", [])),
        *found,
    ]
    if problems and stop:
        raise _problem_line(problems, by_cell, environment)
    for problem in problems:
        done.refused.setdefault(problem["cell"], str(_placed(problem, by_cell[problem["cell"]])))
    offline: set[tuple[object, str]] = {
        (group, name) for name, found in models.items() if found.get("offline")
    }
    for verdict in earlier.values():
        models.setdefault(verdict["model"], verdict["found"])
    unbuilt = int(answer.get("unbuilt") or 0) + sum(
        1 for verdict in earlier.values() if not verdict.get("built", True)
    )
    done.checked.append(
        Checked(
            python=python,
            environment=environment,
            versions=answer.get("versions") or (kept.versions if kept else {}),
            models=models,
            cells=len(cells),
            unbuilt=unbuilt,
            seconds=time.monotonic() - started,
            kept=len(earlier),
        )
    )
    return offline


def check_stack(
    plan: Plan,
    *,
    skip: bool = False,
    run: Callable[[str, Sequence[Experiment]], dict[str, Any]] = run_check,
    keep: bool = False,
    recheck: bool = False,
    memory: Callable[[Experiment], bool] | None = None,
    stop: bool = True,
) -> StackCheck:
    """Check the plan's cells in each interpreter they run under; return the plan with
    each model's resolution applied. The first problem raises ``ConfigError`` (one line
    at the place that set it); ``run`` asks one interpreter (a test may answer instead).
    ``skip`` (``--no-check``): check nothing, and say so. ``keep``: use and keep the
    verdicts of earlier checks (``checkverdicts``); ``recheck`` (``--recheck``): ask
    about every cell again, and keep what it finds. ``memory``: which cells' GPU memory
    to predict as well (``StackCheck.memory``; kept with the verdicts). ``stop=False``:
    a problem refuses its cell (``StackCheck.refused``) instead of raising, and the other
    cells are checked and predicted (``plan --memory`` shows them all)."""
    if skip:
        return StackCheck(plan, skipped=True)
    groups: dict[tuple[str | None, tuple[tuple[str, str], ...]], list[Experiment]] = {}
    for e in plan.cells():
        groups.setdefault(_group(e), []).append(e)
    done = StackCheck(plan)
    offline: set[tuple[object, str]] = set()
    for group, cells in groups.items():
        offline |= _check_group(
            done, group, cells, run=run, keep=keep, recheck=recheck, memory=memory, stop=stop
        )
    if offline:
        experiments = tuple(
            dataclasses.replace(e, hub_offline=True)
            if (_group(e), e.model_name_or_path) in offline
            else e
            for e in plan.experiments
        )
        done.plan = dataclasses.replace(plan, experiments=experiments)
    return done
