"""Inside the Ray task: the same ``run_experiment`` as on this machine and in a SLURM job.

The task records where it runs (``ray.json``: node id, IP, host, the worker's
pid), takes its GPUs from what Ray assigned (``CUDA_VISIBLE_DEVICES``, set by
Ray in the worker), and runs the experiment through ``run_experiment``
(process group, sidecar, time limit, outcome.json).

A cancelled task gets ``KeyboardInterrupt`` (``ray.cancel``), which
``run_experiment`` answers by stopping the job's process group and writing an
``interrupted`` outcome. A worker that dies without cleaning up (``ray.cancel``
with ``force``, Ray's memory monitor, its node's raylet gone) leaves a
watchdog behind: a small process in a session of its own that kills every
process of the launch (by its launch id) once the worker is gone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager
from typing import Any

from orchestrator.contract.layout import ResultsLayout, RunPaths, write_atomic
from orchestrator.contract.result import LAUNCH_ID_ENV
from orchestrator.executors.raycluster.settings import NAME
from orchestrator.job.execute import Placement, RunOptions, run_experiment
from orchestrator.matrix.experiment import Experiment

#: the watchdog: reads its stdin, a pipe from the worker; "done" is a clean end, and an
#: end of file without it (the worker died) kills every process that carries the launch id
_WATCHDOG = """
import os, signal, sys, time
key = sys.argv[1].encode()
if sys.stdin.read() == "done":
    sys.exit(0)
for _ in range(3):
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                found = key in f.read().split(b"\\0")
        except OSError:
            continue
        if found:
            try:
                os.kill(int(entry), signal.SIGKILL)
            except OSError:
                pass
    time.sleep(0.5)
"""


def where_here() -> dict[str, Any]:
    """This task's place in the cluster: task, node, IP, host, worker pid, GPUs."""
    import ray

    context = ray.get_runtime_context()
    return {
        "task_id": context.get_task_id(),
        "node_id": context.get_node_id(),
        "node_ip": ray.util.get_node_ip_address(),
        "hostname": os.uname().nodename,
        "worker_pid": os.getpid(),
        "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
        "started_at": time.time(),
    }


def record_start(run: RunPaths, where: dict[str, Any]) -> None:
    """Add to ``ray.json`` (written at submission): where the task runs, later its end."""
    path = run.job_record(NAME)
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        record = {}
    record.update(where)
    write_atomic(path, json.dumps(record) + "\n")


@contextmanager
def watchdog(launch_id: str) -> Iterator[None]:
    """Kill the launch's processes should this worker die before ``run_experiment`` cleans up."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _WATCHDOG, f"{LAUNCH_ID_ENV}={launch_id}"],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        text=True,
    )
    try:
        yield
    finally:
        try:
            proc.communicate("done", timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def devices_here(experiment: Experiment) -> list[str]:
    """The GPUs Ray assigned this task, as ``CUDA_VISIBLE_DEVICES`` entries."""
    if experiment.device != "gpu":
        return []
    return [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]


def driver_threads(environ: MutableMapping[str, str], threads: str | None) -> None:
    """Give ``environ`` the driver's ``OMP_NUM_THREADS`` (``threads``; None: it had none).

    Ray sets ``OMP_NUM_THREADS`` in a worker to the task's CPUs where the raylet's
    environment has none, and the job's child keeps a value it finds: without this a
    Ray run's threads would differ from the same experiment run from the driver.
    """
    if threads is None:
        environ.pop("OMP_NUM_THREADS", None)
    else:
        environ["OMP_NUM_THREADS"] = threads


def ray_task(
    experiment: Experiment,
    run: RunPaths,
    layout: ResultsLayout,
    options: RunOptions,
    attempt: int,
    cwd: str,
    threads: str | None,
) -> str:
    """What the Ray task runs (on the node Ray chose); returns the status.

    ``threads``: the driver's ``OMP_NUM_THREADS`` (None where it had none).
    """
    if os.path.isdir(cwd):
        os.chdir(cwd)  # relative paths of the plan mean the driver's folder, as in a SLURM job
    driver_threads(os.environ, threads)
    where = where_here()
    record_start(run, where)
    launch_id = f"{NAME}-{where['task_id']}-{attempt}"
    placement = Placement(
        executor=NAME,
        job_id=str(where["task_id"]),
        devices=devices_here(experiment),
        launch_id=launch_id,
    )
    with watchdog(launch_id):
        outcome = run_experiment(experiment, run, layout, options, placement, attempt=attempt)
    # the end by this node's clock, as the start: what packed marking compares
    record_start(run, {"ended_at": time.time()})
    return outcome.status
