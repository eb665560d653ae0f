"""Where and how jobs are submitted: the scenarios file's ``slurm:`` section, the flags on top."""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated

from pydantic import Field

from orchestrator.contract.errors import UserError
from orchestrator.executors.base import ExecutorSection

#: the executor's name: ``--executor slurm``, the file's ``slurm:``, its logs' folder
NAME = "slurm"
INSTALL = "pip install 'tunematrix[slurm]'"

PositiveInt = Annotated[int, Field(gt=0)]


class SlurmModel(ExecutorSection):
    """Where and how ``--executor slurm`` submits; the command line overrides each key."""

    partition: str | None = None
    account: str | None = None
    #: time limit per job: minutes, or SLURM's HH:MM:SS / D-HH:MM:SS
    time: int | str | None = None
    gpus_per_node: PositiveInt | None = None
    cpus_per_task: PositiveInt | None = None
    mem: str | None = None
    #: whole nodes for each job (sbatch --exclusive): no other job shares them
    exclusive: bool = False
    #: further sbatch options, e.g. {qos: high, constraint: a100}
    options: dict[str, str] = Field(default_factory=dict)
    #: submit job arrays (one per resource shape) with at most this many tasks at once
    array: bool = False
    array_parallelism: PositiveInt | None = None


@dataclass(frozen=True)
class SlurmSettings:
    """Where and how to submit (the scenarios file's ``slurm:`` section and the flags)."""

    partition: str | None = None
    account: str | None = None
    #: time limit of each job, in minutes (default: the experiment's time limit + 5)
    time_min: int | None = None
    gpus_per_node: int | None = None
    cpus_per_task: int | None = None
    mem: str | None = None
    #: whole nodes for each job (``sbatch --exclusive``)
    exclusive: bool = False
    #: further sbatch options, name -> value (``{"qos": "high"}`` -> ``--qos=high``)
    options: Mapping[str, str] = field(default_factory=dict)
    #: submit the matrix as job arrays (one per resource shape), at most this many at once
    array: bool = False
    array_parallelism: int = 256
    wait: bool = True


def parse_time(text: str) -> int:
    """SLURM time (``MM``, ``HH:MM:SS``, ``D-HH:MM:SS``, ``MM:SS``) -> whole minutes, rounded up."""
    match = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", text.strip())
    if not match:
        raise UserError(
            f"--slurm-time {text!r} is not a SLURM time (minutes, HH:MM:SS or D-HH:MM:SS)"
        )
    days, a, b, c = match.groups()
    if b is None:  # minutes
        seconds = int(a) * 60
    elif c is None:  # MM:SS
        seconds = int(a) * 60 + int(b)
    else:  # HH:MM:SS
        seconds = int(a) * 3600 + int(b) * 60 + int(c)
    seconds += int(days or 0) * 86400
    if seconds <= 0:
        raise UserError(f"--slurm-time {text!r} must be positive")
    return math.ceil(seconds / 60)


def settings_from(args: argparse.Namespace, section: SlurmModel | None) -> SlurmSettings:
    """The file's ``slurm:`` section with the command line on top."""
    file = section or SlurmModel()
    options = dict(file.options)
    for item in args.slurm_option:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise UserError(f"--slurm-option {item!r}: write it as NAME=VALUE (qos=high)")
        options[name.strip().lstrip("-")] = value
    time_value = args.slurm_time if args.slurm_time is not None else file.time
    return SlurmSettings(
        partition=args.slurm_partition or file.partition,
        account=args.slurm_account or file.account,
        time_min=parse_time(str(time_value)) if time_value is not None else None,
        gpus_per_node=args.slurm_gpus_per_node or file.gpus_per_node,
        cpus_per_task=args.slurm_cpus_per_task or file.cpus_per_task,
        mem=args.slurm_mem or file.mem,
        exclusive=bool(getattr(args, "slurm_exclusive", False)) or file.exclusive,
        options=options,
        array=args.array or file.array,
        array_parallelism=args.array_parallelism or file.array_parallelism or 256,
        wait=not args.no_wait,
    )
