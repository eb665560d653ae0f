"""Where and how experiments go to Ray: the scenarios file's ``ray:`` section, the flags on top."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated

from pydantic import Field

from orchestrator.contract.errors import UserError
from orchestrator.executors.base import ExecutorSection

#: the executor's name: ``--executor ray``, the file's ``ray:``, its ``ray.json`` records
NAME = "ray"
INSTALL = "pip install 'tunematrix[ray]'"
#: the address used when neither the flag, the file nor RAY_ADDRESS names one:
#: a cluster started on this machine with ``ray start --head``
DEFAULT_ADDRESS = "auto"

PositiveInt = Annotated[int, Field(gt=0)]
PositiveFloat = Annotated[float, Field(gt=0)]


class RayModel(ExecutorSection):
    """Where and how ``--executor ray`` submits; the command line overrides each key."""

    #: the cluster: ``auto`` (started here with ``ray start --head``), ``HOST:PORT``
    #: of its head, or ``ray://HOST:10001`` (Ray Client, from outside the cluster)
    address: str | None = None
    #: CPUs a GPU experiment asks for per GPU (a CPU experiment asks for one per process)
    cpus_per_gpu: PositiveInt | None = None
    #: further Ray resources every experiment asks for, e.g. {"accelerator_type:A100": 0.001}
    resources: dict[str, PositiveFloat] = Field(default_factory=dict)


@dataclass(frozen=True)
class RaySettings:
    """Where and how to submit (the file's ``ray:`` section and the flags)."""

    address: str = DEFAULT_ADDRESS
    cpus_per_gpu: int = 1
    resources: Mapping[str, float] = field(default_factory=dict)


def parse_resource(item: str) -> tuple[str, float]:
    """``NAME=AMOUNT`` (``--ray-resource accelerator_type:A100=0.001``) -> (name, amount)."""
    name, sep, value = item.rpartition("=")
    try:
        amount = float(value)
    except ValueError:
        amount = -1.0
    if not sep or not name.strip() or amount <= 0:
        raise UserError(f"--ray-resource {item!r}: write it as NAME=AMOUNT, e.g. big_memory=1")
    return name.strip(), amount


def settings_from(args: argparse.Namespace, section: RayModel | None) -> RaySettings:
    """The file's ``ray:`` section with the command line on top (RAY_ADDRESS below both)."""
    file = section or RayModel()
    resources = dict(file.resources)
    for item in getattr(args, "ray_resource", None) or []:
        name, amount = parse_resource(item)
        resources[name] = amount
    address = (
        getattr(args, "ray_address", None)
        or file.address
        or os.environ.get("RAY_ADDRESS")
        or DEFAULT_ADDRESS
    )
    return RaySettings(
        address=address,
        cpus_per_gpu=getattr(args, "ray_cpus_per_gpu", None) or file.cpus_per_gpu or 1,
        resources=resources,
    )
