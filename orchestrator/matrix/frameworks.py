"""What a framework's accelerate config means for its cells: processes, launch flags, the CPU.

The distributed type an accelerate config names decides how a cell runs, and
``accelerate launch`` lets a flag on its command line override it without a
word (``--multi_gpu`` turns a DeepSpeed config into plain DDP). So the flags
tunematrix adds are chosen from the config here, and the child checks that the
engine the config names is the one that trained (``trainer_entry/measure/engine.py``).

- ``NO`` (the ``dp`` framework): one process, which sees every GPU of the cell;
  the trainer spreads each batch over them with ``torch.nn.DataParallel``. The
  cell still counts GPUs (``num_gpus``); it runs one process.
- ``DEEPSPEED``: accelerate's DeepSpeed launcher, on the CPU too (DeepSpeed's
  CPU accelerator, gloo), so no ``--cpu`` or ``--multi_gpu``.
- anything else (``MULTI_GPU``, ``FSDP``, no config): one process per GPU; on
  the CPU ``--cpu`` for one process, ``--multi_gpu`` (gloo DDP) for several.
  accelerate runs FSDP on GPUs only (on the CPU it sets up DDP whatever the
  flags), so a CPU cell of an FSDP config is DDP; its row says so
  (``distributed_type``).
"""

from __future__ import annotations

from orchestrator.config.scenarios import AccelerateConfig

#: distributed types whose launcher must be the one accelerate picks from the config,
#: on the CPU too
OWN_LAUNCHER = frozenset({"DEEPSPEED"})
#: the distributed type of one process that drives all its GPUs (DataParallel)
SINGLE_PROCESS = "NO"


def distributed_type(accelerate: AccelerateConfig | None) -> str | None:
    """The config's distributed type, upper case; None without a config."""
    return accelerate.distributed_type if accelerate else None


def processes(accelerate: AccelerateConfig | None, num_gpus: int) -> int:
    """Training processes of a cell: one for ``distributed_type: NO``, else one per GPU
    (on the CPU, ``num_gpus`` counts processes)."""
    return 1 if distributed_type(accelerate) == SINGLE_PROCESS else num_gpus


def cpu_launch_flag(accelerate: AccelerateConfig | None, *, single: bool) -> str | None:
    """The flag a CPU launch adds: ``--cpu`` (``single``: one process on one machine),
    ``--multi_gpu``, or none where the config's own launcher must run (DeepSpeed; a
    flag would override it)."""
    if distributed_type(accelerate) in OWN_LAUNCHER:
        return None
    return "--cpu" if single else "--multi_gpu"


def cpu_refusal(accelerate: AccelerateConfig | None) -> str | None:
    """Why a framework's cells cannot run on the CPU; None where they can."""
    kind = distributed_type(accelerate)
    if kind == SINGLE_PROCESS:
        return (
            "DataParallel spreads one process's batch over GPUs; on the CPU it would be one "
            "process, the 1-process ddp cell"
        )
    return None
