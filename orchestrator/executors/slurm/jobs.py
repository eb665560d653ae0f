"""Job states, and a finished job's outcome: SLURM's ending mapped to our statuses.

Job states are read from ``squeue``/``scontrol`` while SLURM remembers the
job, then from ``sacct`` (accounting) or ``sacct --completion`` (a job
completion log), so a cluster without a SLURM database works too.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterable

from orchestrator.contract.jsonio import read_json_object
from orchestrator.contract.layout import ResultsLayout, RunPaths, write_atomic
from orchestrator.contract.outcome import Outcome, Status, read_outcome, write_outcome
from orchestrator.contract.result import read_result
from orchestrator.executors.slurm.settings import NAME
from orchestrator.job import nodes

ACTIVE_STATES = {
    "PENDING",
    "CONFIGURING",
    "RUNNING",
    "COMPLETING",
    "SUSPENDED",
    "REQUEUED",
    "RESIZING",
    "STAGE_OUT",
    "SIGNALING",
}
#: SLURM's ending -> our status, where SLURM's word decides
ENDINGS: dict[str, Status] = {
    "TIMEOUT": "timeout",
    "DEADLINE": "timeout",
    "OUT_OF_MEMORY": "oom",
    "CANCELLED": "interrupted",
    "PREEMPTED": "interrupted",
    "NODE_FAIL": "failed",
    "BOOT_FAIL": "failed",
    "FAILED": "failed",
}


class Unreachable(Exception):
    """squeue could not ask the controller; no state is known."""


def states(job_ids: Iterable[str]) -> dict[str, str]:
    """The current or final state of each job (``RUNNING``, ``COMPLETED``, ``TIMEOUT``, ...).

    A job SLURM no longer knows of (no accounting, no completion log, past
    ``MinJobAge``) is ``UNKNOWN``. Raises ``Unreachable`` when the controller
    does not answer, so a slow controller never passes for ended jobs.
    """
    ids = [j for j in job_ids if j]
    out: dict[str, str] = {}
    if not ids:
        return out
    try:
        proc = subprocess.run(
            ["squeue", "-h", "-j", ",".join(ids), "-o", "%i %T"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise Unreachable(str(exc)) from None
    if proc.returncode != 0 and "invalid job id" not in proc.stderr.lower():
        raise Unreachable(" ".join(proc.stderr.split())[:300])
    for line in proc.stdout.splitlines():
        parts = line.split()
        if len(parts) == 2:
            out[parts[0]] = parts[1]
    for job in ids:
        if job in out:
            continue
        out[job] = (
            _scontrol_state(job)
            or _sacct_state(job, completion=False)
            or _sacct_state(job, completion=True)
            or "UNKNOWN"
        )
    return out


def active(state: str | None) -> bool:
    return state is not None and state.split("+")[0] in ACTIVE_STATES


def _scontrol_state(job: str) -> str | None:
    try:
        text = subprocess.run(
            ["scontrol", "show", "job", "-o", job], capture_output=True, text=True, timeout=30
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r"\bJobState=(\S+)", text)
    return match.group(1) if match else None


def _sacct_state(job: str, *, completion: bool) -> str | None:
    argv = ["sacct", "-n", "-P", "-X", "-o", "JobID,State", "-j", job]
    if completion:
        argv.insert(1, "--completion")
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in proc.stdout.splitlines():
        parts = line.split("|")
        if len(parts) >= 2 and parts[0].strip() == job:
            return parts[1].split()[0] if parts[1].strip() else None
    return None


def job_log(layout: ResultsLayout, job_id: str) -> str:
    """SLURM's own stderr of a job (submitit's ``<job>_0_log.err``), relative to the folder."""
    return layout.relative(layout.job_logs(NAME, job_id) / f"{job_id}_0_log.err")


def final_outcome(run: RunPaths, layout: ResultsLayout, job_id: str, state: str | None) -> Outcome:
    """The outcome of a finished job: the task's own, unless SLURM's ending says more."""
    recorded = read_outcome(run)
    others = nodes.read_node_outcomes(run)
    if recorded is not None and others:
        # a multi-node job: the node whose own rank died first explains the run
        recorded = nodes.merge(recorded, others)
    outcome = recorded.model_copy() if recorded is not None else Outcome(status="failed")
    outcome.executor, outcome.job_id = NAME, job_id
    outcome.log = outcome.log or layout.relative(run.stderr)
    base = (state or "UNKNOWN").split("+")[0]
    own = recorded.status if recorded is not None else None
    # SLURM's word decides where it stopped the job; the job's own diagnosis where
    # it finished (ok, or a CUDA OOM it classified), or where SLURM only says FAILED
    if base in ENDINGS and own not in ("ok", "oom") and not (base == "FAILED" and recorded):
        outcome.status = ENDINGS[base]
        detail = (
            f"; the job's own record: {recorded.error}"
            if recorded is not None and recorded.error
            else ""
        )
        outcome.error = f"SLURM ended job {job_id} as {base}{detail}"
    elif recorded is None:
        outcome.status = "failed"
        outcome.error = f"SLURM job {job_id} ended {base} without an outcome"
    if recorded is None:
        # the task never wrote its files: SLURM's own log of the job says why
        log = job_log(layout, job_id)
        if (layout.root / log).is_file():
            outcome.log = log
    write_outcome(run, outcome)
    mark_collected(run)
    return outcome


def record_submission(run: RunPaths, job_id: str, array: bool) -> None:
    """``slurm.json``: the job that will write this run's outcome, not collected yet."""
    record = {"job_id": job_id, "submitted_at": time.time(), "array": array, "collected": False}
    write_atomic(run.job_record(NAME), json.dumps(record) + "\n")


def mark_collected(run: RunPaths) -> None:
    """``slurm.json`` says the job's outcome is final (SLURM's ending and every node's
    verdict merged in)."""
    record = read_result(run.job_record(NAME))
    if record:
        write_atomic(run.job_record(NAME), json.dumps({**record, "collected": True}) + "\n")


def submitted_without_outcome(layout: ResultsLayout) -> dict[str, RunPaths]:
    """Job id -> run folder, for every submitted job not collected yet.

    Node 0 writes ``outcome.json`` as its part of the job ends; the job is
    collected only once SLURM says it ended (its ending, and the other nodes'
    verdicts, may change that outcome). Folders from before ``collected`` was
    recorded count a run with an ``outcome.json`` as collected.
    """
    pending: dict[str, RunPaths] = {}
    record_name = RunPaths.job_record_name(NAME)
    for name in layout.run_names():
        # most runs of a large folder ran elsewhere: one open each, no path objects
        record = read_json_object(os.path.join(layout.runs, name, record_name))
        if not record or not record.get("job_id"):
            continue
        run = RunPaths(layout.runs / name)
        if record.get("collected") is not False and run.outcome.exists():
            continue
        pending[str(record["job_id"])] = run
    return pending


def settle(layout: ResultsLayout) -> tuple[int, list[str]]:
    """Give every submitted job that has ended an outcome (``tunematrix report`` calls this).

    Returns how many were collected and the ids of the jobs still queued or running.
    """
    pending = submitted_without_outcome(layout)
    if not pending or shutil.which("squeue") is None:
        return 0, []
    try:
        found = states(pending)
    except Unreachable:
        return 0, sorted(pending)
    done, running = 0, []
    for job, run in pending.items():
        state = found.get(job)
        if active(state):
            running.append(job)
            continue
        final_outcome(run, layout, job, state)
        done += 1
    return done, sorted(running)
