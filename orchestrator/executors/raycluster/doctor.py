"""What ``tunematrix doctor`` looks at for Ray: the package, the address, and a quick look at
the head's port (no connection: ``ray.init`` may wait a minute for a cluster that is gone)."""

from __future__ import annotations

import importlib.util
import os
import shutil
from dataclasses import dataclass

from orchestrator.executors.base import Readiness
from orchestrator.executors.raycluster.settings import DEFAULT_ADDRESS


@dataclass(frozen=True)
class RayFacts:
    #: ray is importable here
    installed: bool
    #: the ``ray`` command's path, None where it is not on the PATH
    command: str | None
    #: the address ``--executor ray`` would use by default (RAY_ADDRESS, else auto)
    address: str
    #: HOST:PORT that address names (auto: the cluster ``ray start`` recorded here); None: none
    target: str | None
    #: why the head cannot be reached (None: it accepts connections, or nothing was looked at)
    error: str | None


def probe() -> RayFacts:
    """Whether ray is installed, and whether the default address has a head that answers."""
    installed = importlib.util.find_spec("ray") is not None
    address = os.environ.get("RAY_ADDRESS") or DEFAULT_ADDRESS
    command = shutil.which("ray")
    if not installed:
        return RayFacts(False, command, address, None, None)
    from orchestrator.contract.errors import UserError
    from orchestrator.executors.raycluster.cluster import _bootstrap, _reachable

    try:
        target = _bootstrap(address)
    except UserError:
        return RayFacts(True, command, address, None, "no cluster started here (ray start --head)")
    return RayFacts(True, command, address, target, _reachable(target))


def readiness(facts: RayFacts) -> Readiness:
    """The Ray line of doctor, and what Ray use lacks here (besides the ray package)."""
    # worth a miss for ray only where a cluster is named or found
    present = facts.target is not None or facts.address != DEFAULT_ADDRESS
    if not facts.installed:
        where = f"RAY_ADDRESS={facts.address}" if present else "no RAY_ADDRESS"
        return Readiness("info", f"ray not installed ({where})", (), present)
    if facts.target is None:
        detail = (
            f"ray installed; {facts.error or 'no cluster'} (--ray-address or RAY_ADDRESS names one)"
        )
        return Readiness("info", detail, ("a Ray cluster",), present)
    named = facts.address if facts.address == facts.target else f"{facts.address} -> {facts.target}"
    if facts.error is not None:
        return Readiness(
            "warn",
            f"ray installed; the head at {named} does not answer: {facts.error}",
            ("a Ray cluster that answers",),
            present,
        )
    return Readiness("ok", f"ray installed; a Ray head answers at {named}", (), present)
