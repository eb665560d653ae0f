"""Inside the job: what each node of a SLURM allocation runs (submitit calls ``slurm_task``).

A job that needs more GPUs than a node has (or, on the CPU, more processes
than a node has CPUs) spans nodes: one task per node, each running
``accelerate launch`` with ``--num_machines``, its ``--machine_rank``
(``SLURM_NODEID``) and the first host of the allocation as
``--main_process_ip``. The experiment itself runs through the same
``run_experiment`` as on this machine (process group, sidecar, time limit,
outcome.json), so results land in the same folder layout. Node 0 writes the
run's files; node ``k`` its own logs (``stderr.node<k>.log``) and verdict
(``outcome.node<k>.json``), merged into the run's outcome when the job is
collected (``orchestrator.job.nodes``).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from typing import Any

from orchestrator.contract.layout import ResultsLayout, RunPaths
from orchestrator.executors.slurm.settings import NAME
from orchestrator.job.command import LaunchSite
from orchestrator.job.execute import Interrupted, Placement, RunOptions, run_experiment
from orchestrator.matrix.experiment import Experiment


def job_id_here() -> str:
    """This job's id as SLURM names it (``<array>_<task>`` for an array task)."""
    array, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    if array and task:
        return f"{array}_{task}"
    return os.environ.get("SLURM_JOB_ID", "unknown")


def _first_host() -> str | None:
    nodelist = os.environ.get("SLURM_JOB_NODELIST") or os.environ.get("SLURM_NODELIST")
    if not nodelist:
        return None
    try:
        hosts = subprocess.run(
            ["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, timeout=30
        ).stdout.split()
    except (OSError, subprocess.TimeoutExpired):
        hosts = []
    return hosts[0] if hosts else nodelist.split(",")[0]


def placement_here(experiment: Experiment, attempt: int) -> Placement:
    """Where this node's launch runs, from the allocation's environment."""
    job_id = job_id_here()
    machines = int(os.environ.get("SLURM_JOB_NUM_NODES") or os.environ.get("SLURM_NNODES") or 1)
    rank = int(os.environ.get("SLURM_NODEID", "0"))
    devices = (
        [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d]
        if experiment.device == "gpu"
        else []
    )
    # every node must agree on the port without talking: derive it from the job id
    digits = int(re.sub(r"\D", "", job_id) or "0")
    return Placement(
        executor=NAME,
        job_id=job_id,
        devices=devices,
        site=LaunchSite(
            num_machines=machines,
            machine_rank=rank,
            main_process_ip=_first_host() if machines > 1 else None,
        ),
        port=20000 + digits % 20000,
        # every node of the job gets the same one, so a rank that the launcher
        # stops on node 1 cannot replace node 0's report of the real failure
        launch_id=f"{NAME}-{job_id}-{os.environ.get('SLURM_RESTART_COUNT', '0')}-{attempt}",
    )


def slurm_task(
    experiment: Experiment, run: RunPaths, layout: ResultsLayout, options: RunOptions, attempt: int
) -> str:
    """What each node of the job runs (called by submitit inside the allocation)."""

    def on_term(signum: int, frame: Any) -> None:
        raise Interrupted(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_term)
    # no early USR2 is asked for (submit.py); one a site sends anyway is ignored: a
    # benchmark is not resumable, so it runs to SLURM's limit and stops on TERM
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    placement = placement_here(experiment, attempt)
    outcome = run_experiment(experiment, run, layout, options, placement, attempt=attempt)
    return outcome.status
