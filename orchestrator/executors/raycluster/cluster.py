"""The cluster, asked before anything is submitted: its address, its nodes, their GPUs and CPUs,
and whether every node sees the results folder.

Everything Ray would leave pending forever (an experiment no node can hold)
is refused here, in one line, before a results folder is touched.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from orchestrator.contract.errors import UserError
from orchestrator.contract.layout import PROJECT_ROOT
from orchestrator.executors import sharedfs
from orchestrator.executors.base import Preflight
from orchestrator.executors.raycluster.settings import INSTALL, NAME, RaySettings
from orchestrator.matrix.experiment import Experiment

#: seconds the head's port may take to accept a connection before the cluster counts as down
CONNECT_TIMEOUT_S = 5.0
#: seconds every node has to answer the shared-folder check; a node that does not (busy,
#: short of workers) is skipped, said in one line
SHARED_TIMEOUT_S = 20.0


@dataclass(frozen=True)
class NodeInfo:
    """One alive node of the cluster, as Ray reports it."""

    node_id: str
    ip: str
    hostname: str
    resources: Mapping[str, float] = field(default_factory=dict)

    @property
    def cpus(self) -> float:
        return self.resources.get("CPU", 0.0)

    @property
    def gpus(self) -> float:
        return self.resources.get("GPU", 0.0)

    def describe(self) -> str:
        return f"Ray node {self.ip} ({self.hostname}, id {self.node_id[:12]})"


def requests(experiment: Experiment, settings: RaySettings) -> dict[str, float]:
    """What the experiment's Ray task asks for: its GPUs (and CPUs per GPU), or one CPU per
    process, plus the settings' further resources."""
    if experiment.device == "gpu":
        wanted = {
            "GPU": float(experiment.num_gpus),
            "CPU": float(settings.cpus_per_gpu * experiment.num_gpus),
        }
    else:
        wanted = {"CPU": float(experiment.processes)}
    return {**wanted, **settings.resources}


def runtime_env() -> dict[str, Any]:
    """The tasks' environment: this project importable on the node, as SLURM's jobs get it."""
    return {"env_vars": {"PYTHONPATH": f"{PROJECT_ROOT}:${{PYTHONPATH}}"}}


def _reachable(address: str) -> str | None:
    """Why the head at ``HOST:PORT`` cannot be reached (None: its port accepts connections)."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        return None  # not host:port: let Ray say what it makes of it
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT_S):
            return None
    except OSError as exc:
        return exc.strerror or str(exc) or type(exc).__name__


def web_address(address: str) -> str | None:
    """The one line for an http(s):// address (the dashboard's job-submission address that
    KubeRay's guides export as RAY_ADDRESS); None for any other (pure)."""
    parts = urlsplit(address.strip())
    if parts.scheme.lower() not in ("http", "https"):
        return None
    host = parts.hostname or "HOST"
    return (
        f"--executor ray: {address} is the HTTP address of Ray's dashboard (job submission); "
        f"tunematrix connects to the cluster itself: give its head as HOST:6379 "
        f"(--ray-address {host}:6379 or RAY_ADDRESS={host}:6379), or ray://{host}:10001"
    )


def _bootstrap(address: str) -> str:
    """``auto`` -> the HOST:PORT of the cluster started here (``ray start``'s record)."""
    if address != "auto":
        return address.removeprefix("ray://")
    from ray._private import services

    try:
        found = services.canonicalize_bootstrap_address(address)
    except Exception as exc:
        raise UserError(
            f"--executor ray: no Ray cluster found on this machine ({_first_line(exc)}); "
            "start one with `ray start --head`, or give --ray-address / RAY_ADDRESS"
        ) from None
    if not found:
        raise UserError(
            "--executor ray: no Ray cluster found on this machine; start one with "
            "`ray start --head`, or give --ray-address / RAY_ADDRESS"
        )
    return str(found)


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return (lines[0] if lines else type(exc).__name__)[:300]


def reason(exc: BaseException) -> str:
    """One line for a Ray exception: its cause's, where Ray wrapped one (a task's error)."""
    cause = getattr(exc, "cause", None)
    source = cause if isinstance(cause, BaseException) else exc
    head = _first_line(source) if str(source).strip() else ""
    return f"{type(source).__name__}: {head}"[:400] if head else type(source).__name__


def connect(settings: RaySettings) -> None:
    """Connect this process to the cluster (once); refuse in one line where there is none."""
    try:
        import ray
    except ImportError:
        raise UserError(f"--executor ray needs ray: {INSTALL}") from None
    if ray.is_initialized():
        return
    web = web_address(settings.address)
    if web is not None:
        raise UserError(web)
    target = _bootstrap(settings.address)
    why = _reachable(target)
    if why is not None:
        raise UserError(
            f"--executor ray: no Ray cluster at {settings.address} ({target}: {why}); "
            "start one with `ray start --head`, or give its head's address (--ray-address)"
        )
    try:
        ray.init(
            address=settings.address,
            logging_level=logging.ERROR,
            log_to_driver=False,
            configure_logging=True,
        )
    except Exception as exc:
        raise UserError(
            f"--executor ray: cannot connect to the Ray cluster at {settings.address}: "
            f"{_first_line(exc)}"
        ) from None


def alive_nodes() -> list[NodeInfo]:
    """The cluster's alive nodes."""
    import ray

    found = []
    listed: list[dict[str, Any]] = ray.nodes()
    for node in listed:
        if not node.get("Alive"):
            continue
        found.append(
            NodeInfo(
                node_id=str(node["NodeID"]),
                ip=str(node.get("NodeManagerAddress", "?")),
                hostname=str(node.get("NodeManagerHostname", "?")),
                resources={k: float(v) for k, v in (node.get("Resources") or {}).items()},
            )
        )
    return found


def unfit(
    experiment: Experiment, wanted: Mapping[str, float], nodes: Sequence[NodeInfo], where: str
) -> str | None:
    """Why no single node can hold the experiment's task (None: one can)."""
    if any(all(n.resources.get(k, 0.0) >= v for k, v in wanted.items()) for n in nodes):
        return None
    eid = experiment.experiment_id
    count = len(nodes)
    for key, label in (("GPU", "GPUs"), ("CPU", "CPUs")):
        need = wanted.get(key, 0.0)
        most = max((n.resources.get(key, 0.0) for n in nodes), default=0.0)
        if need > most:
            extra = (
                f" ({int(need / max(1, experiment.num_gpus))} per GPU: --ray-cpus-per-gpu)"
                if key == "CPU" and experiment.device == "gpu"
                else ""
            )
            return (
                f"{eid} needs {need:g} {label}{extra} on one node; the largest node of {where} "
                f"has {most:g} ({count} node(s)); Ray runs an experiment on one node"
            )
    for key, need in wanted.items():
        if key not in ("GPU", "CPU") and not any(n.resources.get(key, 0.0) >= need for n in nodes):
            return f"{eid} asks for Ray resource {key}={need:g}; no node of {where} has that much"
    return f"{eid} needs {dict(wanted)} on one node; no node of {where} has all of it at once"


def check_cluster(preflight: Preflight, settings: RaySettings) -> list[NodeInfo]:
    """Connect, and refuse what no node of the cluster can run."""
    connect(settings)
    nodes = alive_nodes()
    where = f"the Ray cluster at {settings.address}"
    if not nodes:
        raise UserError(f"--executor ray: {where} has no alive node")
    for e in preflight.experiments:
        why = unfit(e, requests(e, settings), nodes, where)
        if why is not None:
            raise UserError(why)
    return nodes


def _describe(node_id: str, nodes: Sequence[NodeInfo]) -> str:
    for n in nodes:
        if n.node_id == node_id:
            return n.describe()
    return f"Ray node {node_id[:12]}"


def check_shared(root: Path, say: Callable[[str], None] = sharedfs.say_stderr) -> None:
    """A token in the results folder, looked for by a zero-CPU task pinned to each alive node;
    refuse in one line (``sharedfs.not_shared``) where a node does not see it. A node that gives
    no answer within ``SHARED_TIMEOUT_S`` (busy, short of workers) is skipped, said in one
    line through ``say``."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = alive_nodes()
    look = ray.remote(sharedfs.seen)
    with sharedfs.token(root) as token:
        refs: dict[Any, str] = {}
        for node in nodes:
            ref = look.options(
                num_cpus=0,
                name="tunematrix:shared-check",
                max_retries=0,
                runtime_env=runtime_env(),
                scheduling_strategy=NodeAffinitySchedulingStrategy(node.node_id, soft=False),
            ).remote(token.path, token.content)
            refs[ref] = node.node_id
        ready, pending = ray.wait(list(refs), num_returns=len(refs), timeout=SHARED_TIMEOUT_S)
        for ref in pending:
            ray.cancel(ref, force=True)
        for ref in ready:
            where = _describe(refs[ref], nodes)
            try:
                seen = ray.get(ref)
            except ray.exceptions.TaskUnschedulableError:
                continue  # the node died since it was listed: no job will run there
            except Exception as exc:
                raise UserError(
                    f"--executor ray: the results-folder check failed on {where}: "
                    f"{reason(exc)} (is tunematrix installed at the same path on every node?)"
                ) from None
            if not seen:
                raise sharedfs.not_shared(NAME, root, where)
    for ref in pending:
        say(
            sharedfs.skipped(
                root,
                _describe(refs[ref], nodes),
                f"no answer in {SHARED_TIMEOUT_S:g} s: busy, or short of workers?",
            )
        )
