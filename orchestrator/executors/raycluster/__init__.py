"""The Ray executor: every experiment a Ray task, placed and packed by Ray's scheduler.

``settings`` (the scenarios file's ``ray:`` section and the flags),
``cluster`` (connecting, the nodes, the checks before submitting, the
results-folder check on every node), ``submit`` (submitting, waiting,
cancelling; Ray's endings mapped to our statuses), ``task`` (what runs inside
the task: the same ``run_experiment`` as on this machine) and ``doctor``
(what ``tunematrix doctor`` looks at). Each run folder gets a ``ray.json``:
the task's id, and the node, IP and worker that ran it.

A Ray task, not a Ray job: the task's resource request (GPUs on one node,
CPUs) is what Ray's scheduler places and packs, a task is cancelled on its
own (gracefully, then by force), and a task needs no job server on the head
(``ray start --head --include-dashboard=false`` serves tasks, not jobs).
The orchestrator stays connected while its tasks run, as with SLURM's
default (waiting) mode.

Named ``raycluster``, not ``ray``, so that ``import ray`` finds Ray.
"""

from __future__ import annotations

import argparse
from typing import Any

from orchestrator.contract.choices import positive_int
from orchestrator.executors.base import (
    Executor,
    ExecutorSection,
    Flags,
    Need,
    Preflight,
    Readiness,
    RunContext,
)
from orchestrator.executors.raycluster import doctor
from orchestrator.executors.raycluster.cluster import (
    NodeInfo,
    check_cluster,
    check_shared,
    requests,
    unfit,
)
from orchestrator.executors.raycluster.settings import (
    INSTALL,
    NAME,
    RayModel,
    RaySettings,
    settings_from,
)
from orchestrator.executors.raycluster.submit import failure_status, run_on_ray

__all__ = [
    "NodeInfo",
    "RayExecutor",
    "RayModel",
    "RaySettings",
    "failure_status",
    "requests",
    "settings_from",
    "unfit",
]


class RayExecutor(Executor):
    name = NAME
    title = "Ray"
    env_prefixes = ("RAY_",)
    summary = "run every experiment as a Ray task on a Ray cluster (ray start, KubeRay)"
    flags_title = "Ray (--executor ray; defaults from the file's ray: section)"
    examples = (
        "tunematrix run --executor ray  # the cluster of `ray start --head` here, or RAY_ADDRESS",
        "tunematrix run --executor ray --ray-address 10.0.0.5:6379 --results /shared/results",
    )
    section = RayModel
    needs = (Need("ray", "--executor ray", INSTALL),)
    #: Ray packs tasks onto a node where their resources fit; each row says how its job ran
    mode = "scheduled by Ray (run_mode per row: alone or packed)"

    def __init__(self, settings: RaySettings | None = None) -> None:
        self.settings = settings or RaySettings()
        #: the cluster's alive nodes, as ``check`` found them
        self.nodes: list[NodeInfo] | None = None

    @classmethod
    def add_flags(cls, flags: Flags) -> None:
        flags.add_argument(
            "--ray-address",
            metavar="ADDRESS",
            help="the Ray cluster: HOST:PORT of its head, ray://HOST:10001, or auto "
            "(default: RAY_ADDRESS, else auto: the cluster `ray start --head` started here)",
        )
        flags.add_argument(
            "--ray-cpus-per-gpu",
            type=positive_int,
            metavar="N",
            help="CPUs a GPU experiment asks for per GPU (default 1; a CPU experiment: "
            "one per process)",
        )
        flags.add_argument(
            "--ray-resource",
            action="append",
            default=[],
            metavar="NAME=AMOUNT",
            help="a further Ray resource every experiment asks for "
            "(--ray-resource accelerator_type:A100=0.001); repeatable",
        )

    @classmethod
    def from_args(cls, args: argparse.Namespace, section: ExecutorSection | None) -> Executor:
        assert section is None or isinstance(section, RayModel)
        return cls(settings_from(args, section))

    def check(self, preflight: Preflight) -> None:
        self.nodes = check_cluster(preflight, self.settings)
        if preflight.experiments:
            # before the results folder is opened: a folder a node cannot see is refused
            # in one line, and nothing is moved aside or submitted
            check_shared(preflight.layout.root)

    def parallel(self, plan: Any) -> int:
        return max(1, len(self.nodes or ()))

    def run(self, ctx: RunContext) -> None:
        if self.nodes is None:
            raise RuntimeError("RayExecutor.run before check: the cluster is not known")
        import ray

        try:
            run_on_ray(ctx, self.settings)
        finally:
            ray.shutdown()

    @classmethod
    def probe(cls) -> doctor.RayFacts:
        return doctor.probe()

    @classmethod
    def readiness(cls, probe: Any) -> Readiness | None:
        return doctor.readiness(probe)
