"""The SLURM executor: every experiment a SLURM job, submitted through submitit.

``settings`` (the scenarios file's ``slurm:`` section and the flags),
``cluster`` (the checks before submitting, the job's shape: nodes, GPUs and
CPUs), ``visible`` (a job on the cluster sees the results folder, checked
before submitting), ``submit`` (submission, waiting,
cancelling), ``task`` (what runs inside the job: the same ``run_experiment``
as on this machine), ``jobs`` (job states; SLURM's endings mapped to our
statuses; ``settle`` for ``--no-wait`` runs) and ``doctor`` (what
``tunematrix doctor`` looks at). The logs SLURM keeps of each job go to the
results folder's ``slurm/<job id>/``.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from orchestrator.contract.choices import positive_int
from orchestrator.contract.layout import ResultsLayout
from orchestrator.executors import sharedfs
from orchestrator.executors.base import (
    Executor,
    ExecutorSection,
    Flags,
    Need,
    Preflight,
    Readiness,
    RunContext,
    Settled,
)
from orchestrator.executors.slurm import doctor
from orchestrator.executors.slurm.cluster import (
    ClusterInfo,
    check_cluster,
    cluster_gpus,
    gres_gpus,
    job_minutes,
    shape,
)
from orchestrator.executors.slurm.jobs import Unreachable, final_outcome, settle, states
from orchestrator.executors.slurm.settings import (
    INSTALL,
    NAME,
    SlurmModel,
    SlurmSettings,
    parse_time,
    settings_from,
)
from orchestrator.executors.slurm.submit import run_on_slurm
from orchestrator.executors.slurm.visible import check_shared

__all__ = [
    "ClusterInfo",
    "SlurmExecutor",
    "SlurmModel",
    "SlurmSettings",
    "Unreachable",
    "final_outcome",
    "gres_gpus",
    "job_minutes",
    "parse_time",
    "settings_from",
    "settle",
    "shape",
    "states",
]


class SlurmExecutor(Executor):
    name = NAME
    title = "SLURM"
    env_prefixes = ("SLURM_",)
    summary = "submit every experiment as a SLURM job"
    flags_title = "SLURM (--executor slurm; defaults from the file's slurm: section)"
    examples = (
        "tunematrix run --executor slurm --slurm-partition gpu --slurm-time 2:00:00",
        "tunematrix run --executor slurm --array --array-parallelism 8 --no-wait",
    )
    section = SlurmModel
    needs = (Need("submitit", "--executor slurm", INSTALL),)
    keeps_logs = True

    def __init__(self, settings: SlurmSettings | None = None) -> None:
        self.settings = settings or SlurmSettings()
        #: what ``check`` found out about the cluster
        self.cluster: ClusterInfo | None = None

    @classmethod
    def add_flags(cls, flags: Flags) -> None:
        flags.add_argument(
            "--slurm-partition", metavar="NAME", help="partition (default: the cluster's)"
        )
        flags.add_argument("--slurm-account", metavar="NAME", help="account to charge")
        flags.add_argument(
            "--slurm-time",
            metavar="TIME",
            help="time limit per job: minutes or [D-]HH:MM:SS (default: --timeout + 5 min)",
        )
        flags.add_argument(
            "--slurm-gpus-per-node",
            type=positive_int,
            metavar="N",
            help="GPUs per node; a job needing more spans nodes (default: a node's GPUs)",
        )
        flags.add_argument(
            "--slurm-cpus-per-task",
            type=positive_int,
            metavar="N",
            help="CPUs per node of a job (default: 4 per GPU; a CPU job: its processes)",
        )
        flags.add_argument("--slurm-mem", metavar="SIZE", help="memory per node, e.g. 200G")
        flags.add_argument(
            "--slurm-exclusive",
            action="store_true",
            help="whole nodes for each job (sbatch --exclusive): no other job beside it",
        )
        flags.add_argument(
            "--slurm-option",
            action="append",
            default=[],
            metavar="NAME=VALUE",
            help="any further sbatch option (--slurm-option qos=high); repeatable",
        )
        flags.add_argument("--array", action="store_true", help="submit the matrix as job arrays")
        flags.add_argument(
            "--array-parallelism",
            type=positive_int,
            metavar="N",
            help="at most N array tasks at once",
        )
        flags.add_argument(
            "--no-wait",
            action="store_true",
            help="return after submitting; `tunematrix report RESULT_DIR` collects the results",
        )

    @classmethod
    def from_args(cls, args: argparse.Namespace, section: ExecutorSection | None) -> Executor:
        assert section is None or isinstance(section, SlurmModel)
        return cls(settings_from(args, section))

    def gpu_counter(self) -> Callable[[], int] | None:
        # the jobs run on the cluster's nodes, not here: count a node's GPUs there
        partition = self.settings.partition
        return lambda: cluster_gpus(partition)

    def check(self, preflight: Preflight) -> None:
        self.cluster = check_cluster(preflight, self.settings)
        if preflight.experiments:
            # before the results folder is opened: a folder the nodes cannot see is
            # refused in one line, and nothing is moved aside or submitted
            check_shared(preflight.layout.root, self.settings, sharedfs.say_stderr)

    def run(self, ctx: RunContext) -> None:
        if self.cluster is None:
            raise RuntimeError("SlurmExecutor.run before check: the cluster is not known")
        run_on_slurm(ctx, self.settings, self.cluster)

    @classmethod
    def settle(cls, layout: ResultsLayout) -> Settled | None:
        collected, running = settle(layout)
        return Settled(collected, running, noun="SLURM job", cancel="scancel them")

    @classmethod
    def probe(cls) -> doctor.SlurmFacts:
        return doctor.probe()

    @classmethod
    def readiness(cls, probe: Any) -> Readiness | None:
        return doctor.readiness(probe)
