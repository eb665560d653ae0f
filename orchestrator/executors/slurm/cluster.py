"""The cluster, asked before anything is submitted: partitions, nodes, their GPUs and CPUs.

Everything SLURM would refuse (or kill) after the submission is refused here,
in one line, before a results folder is touched.
"""

from __future__ import annotations

import math
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator.contract.errors import UserError
from orchestrator.executors.base import Preflight
from orchestrator.executors.slurm.settings import SlurmSettings, parse_time
from orchestrator.matrix.experiment import Experiment
from orchestrator.matrix.frameworks import cpu_launch_flag


def _run(argv: Sequence[str]) -> str:
    try:
        proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        raise UserError(f"{argv[0]} did not answer in 60 s; is the SLURM controller up?") from None
    if proc.returncode != 0:
        lines = [line.strip() for line in proc.stderr.splitlines() if line.strip()]
        last = lines[-1][:300] if lines else f"exit code {proc.returncode}"
        raise UserError(
            f"{argv[0]} failed ({last}); is this machine a node of a SLURM cluster "
            "(its slurm.conf, or SLURM_CONF)?"
        )
    return proc.stdout


def gres_gpus(gres: str) -> int:
    """GPUs in a node's gres string (``gpu:a100:4(S:0-1),shard:8`` -> 4)."""
    total = 0
    for item in gres.split(","):
        parts = item.split("(")[0].split(":")
        if parts[0] == "gpu" and len(parts) >= 2 and parts[-1].isdigit():
            total += int(parts[-1])
    return total


@dataclass(frozen=True)
class NodeInfo:
    name: str
    cpus: int
    gpus: int


def nodes(partition: str | None) -> list[NodeInfo]:
    argv = ["sinfo", "-h", "-N", "-o", "%N %c %G"]
    if partition:
        argv += ["-p", partition]
    seen: dict[str, NodeInfo] = {}
    for line in _run(argv).splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[1].isdigit():
            seen[parts[0]] = NodeInfo(
                parts[0], int(parts[1]), gres_gpus(parts[2]) if len(parts) > 2 else 0
            )
    return list(seen.values())


def cpu_nodes(processes: int, cpus_per_node: int | None) -> int:
    """How many nodes a CPU experiment spans: one where its processes fit a node's CPUs,
    else the fewest nodes (at least processes / CPUs per node) that split them evenly."""
    if not cpus_per_node or processes <= cpus_per_node:
        return 1
    count = math.ceil(processes / cpus_per_node)
    while processes % count:
        count += 1
    return count


def shape(
    experiment: Experiment,
    settings: SlurmSettings,
    gpus_per_node: int,
    cpus_per_node: int | None = None,
) -> tuple[int, int | None, int]:
    """(nodes, GPUs per node, CPUs per task) of an experiment's job.

    A CPU experiment whose processes exceed ``cpus_per_node`` (the largest
    node's CPUs) spans nodes: one task per node, the processes split evenly.
    """
    if experiment.device == "gpu":
        per_node = settings.gpus_per_node or gpus_per_node or experiment.num_gpus
        per_node = min(per_node, experiment.num_gpus)
        if experiment.processes == 1:
            # one process (dp's DataParallel) drives all its GPUs: they share one node
            per_node = experiment.num_gpus
        count = math.ceil(experiment.num_gpus / per_node)
        cpus = settings.cpus_per_task or max(1, 4 * per_node)
        return count, per_node, cpus
    count = cpu_nodes(experiment.processes, cpus_per_node)
    return count, None, settings.cpus_per_task or experiment.processes // count


def require_slurm() -> None:
    if shutil.which("sbatch") is None or shutil.which("sinfo") is None:
        raise UserError("--executor slurm: sbatch is not on the PATH (is this a SLURM login node?)")


def cluster_gpus(partition: str | None) -> int:
    """The most GPUs one node of the partition has (what ``--num-gpus`` defaults are capped at)."""
    require_slurm()
    return max((n.gpus for n in nodes(partition)), default=0)


@dataclass(frozen=True)
class ClusterInfo:
    """What the checks found out, and what the submission uses."""

    #: the most GPUs one node has
    most_gpus: int
    #: the partition's MaxTime in minutes (None: unlimited)
    max_time_min: int | None
    #: the most CPUs one node has (None: not known; a CPU experiment stays on one node)
    most_cpus: int | None = None


def _partitions() -> dict[str, int | None]:
    """Partition -> MaxTime in minutes (None: infinite); the default partition first."""
    found: dict[str, int | None] = {}
    default: list[str] = []
    for line in _run(["sinfo", "-h", "-o", "%P %l"]).splitlines():
        parts = line.split()
        if not parts:
            continue
        name = parts[0].rstrip("*")
        if parts[0].endswith("*"):
            default.append(name)
        limit = parts[1] if len(parts) > 1 else "infinite"
        try:
            found[name] = None if limit in ("infinite", "UNLIMITED", "n/a") else parse_time(limit)
        except UserError:
            found[name] = None
    return {**{d: found[d] for d in default}, **found}


def job_minutes(settings: SlurmSettings, timeout_s: float, max_time_min: int | None) -> int:
    """The SLURM time limit of a job: the user's, else the experiment's own limit + 5 minutes
    (capped at the partition's maximum, so our limit, not SLURM's, stops a job first)."""
    if settings.time_min is not None:
        return settings.time_min
    derived = math.ceil(timeout_s / 60) + 5
    return min(derived, max_time_min) if max_time_min else derived


def check_cluster(preflight: Preflight, settings: SlurmSettings) -> ClusterInfo:
    """Refuse, in one line, what SLURM would refuse (or kill) after the submission."""
    require_slurm()
    try:
        import submitit  # noqa: F401
    except ImportError:
        raise UserError("--executor slurm needs submitit: pip install submitit") from None
    partitions = _partitions()
    if settings.partition and settings.partition not in partitions:
        raise UserError(
            f"unknown SLURM partition {settings.partition!r}; partitions: {', '.join(partitions) or 'none'}"
        )
    partition = settings.partition or next(iter(partitions), None)
    max_time = partitions.get(partition) if partition else None
    if settings.time_min is not None and max_time is not None and settings.time_min > max_time:
        raise UserError(
            f"SLURM time limit of {settings.time_min} min is above partition {partition}'s "
            f"maximum of {max_time} min"
        )
    available = nodes(settings.partition)
    if not available:
        raise UserError(f"no nodes in SLURM partition {settings.partition or '(default)'}")
    most_gpus = max(n.gpus for n in available)
    total_gpus = sum(n.gpus for n in available)
    most_cpus = max(n.cpus for n in available)
    where = f"partition {partition}" if partition else "the cluster"
    for e in preflight.experiments:
        count, per_node, cpus = shape(e, settings, most_gpus, most_cpus)
        if e.device == "gpu":
            if e.num_gpus > total_gpus:
                raise UserError(
                    f"{e.experiment_id} needs {e.num_gpus} GPUs; {where} has {total_gpus} "
                    f"({len(available)} node(s), at most {most_gpus} per node)"
                )
            if per_node and per_node > most_gpus:
                raise UserError(
                    f"{e.experiment_id} needs {per_node} GPUs per node; nodes of {where} have at most {most_gpus}"
                )
            if count > len(available):
                raise UserError(
                    f"{e.experiment_id} needs {count} nodes; {where} has {len(available)}"
                )
        if e.device == "cpu" and count > 1:
            per = e.processes // count
            fitting = sum(1 for n in available if n.cpus >= per)
            if count > fitting:
                raise UserError(
                    f"{e.experiment_id}: {e.processes} CPU processes do not fit one node of "
                    f"{where} (at most {most_cpus} CPUs) and need {count} nodes of {per} "
                    f"CPUs to split evenly; {where} has {fitting}"
                )
            if cpu_launch_flag(e.accelerate, single=False) is None:
                raise UserError(
                    f"{e.experiment_id}: {e.processes} CPU processes need {count} nodes, and "
                    "its framework's own launcher (DeepSpeed) runs on one node on the CPU; "
                    "use fewer processes or a DDP framework"
                )
        if cpus > most_cpus:
            raise UserError(
                f"{e.experiment_id} needs {cpus} CPUs per task; nodes of {where} have at most {most_cpus}"
            )
        limit = job_minutes(settings, preflight.timeout_s(e), max_time)
        expected = preflight.expected_s(e)
        if expected is not None and limit * 60 < expected:
            raise UserError(
                f"SLURM time limit of {limit} min is below the expected run of "
                f"{expected / 60:.1f} min ({e.experiment_id} took that long before in "
                f"{preflight.layout.root}); raise --slurm-time"
            )
    return ClusterInfo(most_gpus=most_gpus, max_time_min=max_time, most_cpus=most_cpus)
