"""What ``tunematrix doctor`` looks at for SLURM: its commands on the PATH and one quick ``sinfo``."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from orchestrator.executors.base import Readiness, State

#: how long ``sinfo`` may take to answer before the controller counts as unreachable
SINFO_TIMEOUT_S = 3.0


@dataclass(frozen=True)
class SlurmFacts:
    #: sbatch, squeue, sinfo -> their path, None where not on the PATH
    commands: Mapping[str, str | None]
    #: the partitions ``sinfo`` named; None where it was not asked or did not answer
    partitions: Sequence[str] | None
    #: why ``sinfo`` did not answer
    error: str | None


def probe() -> SlurmFacts:
    """The commands on the PATH, and the partitions if ``sinfo`` answers in a few seconds."""
    commands = {name: shutil.which(name) for name in ("sbatch", "squeue", "sinfo")}
    sinfo = commands["sinfo"]
    if sinfo is None:
        return SlurmFacts(commands, None, None)
    try:
        proc = subprocess.run(
            [sinfo, "-h", "-o", "%P"],
            capture_output=True,
            text=True,
            timeout=SINFO_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    except subprocess.TimeoutExpired:
        return SlurmFacts(commands, None, f"no answer in {SINFO_TIMEOUT_S:g} s")
    except OSError as exc:
        return SlurmFacts(commands, None, str(exc))
    if proc.returncode != 0:
        lines = [line.strip() for line in proc.stderr.splitlines() if line.strip()]
        return SlurmFacts(commands, None, lines[-1] if lines else f"exit code {proc.returncode}")
    return SlurmFacts(commands, proc.stdout.split(), None)


def readiness(facts: SlurmFacts) -> Readiness:
    """The SLURM line of doctor, and what SLURM use lacks here (besides submitit)."""
    have = [c for c, path in facts.commands.items() if path]
    lack = [c for c, path in facts.commands.items() if not path]
    lacks = [c for c in ("sbatch", "sinfo") if not facts.commands.get(c)]
    if facts.commands.get("sinfo") and facts.partitions is None:
        lacks.append("sinfo does not answer")
    # worth a miss for submitit only where SLURM is: elsewhere no one needs it
    present = facts.commands.get("sbatch") is not None
    if not have:
        detail = "no sbatch, squeue or sinfo on the PATH (--executor slurm runs from a login node)"
        return Readiness("info", detail, tuple(lacks), present)
    detail = f"{', '.join(have)} on the PATH" + (f", not {', '.join(lack)}" if lack else "")
    if facts.partitions is not None:
        parts = list(facts.partitions)
        listed = ", ".join(parts[:5]) + (f" and {len(parts) - 5} more" if len(parts) > 5 else "")
        detail += f"; sinfo answers (partitions: {listed or 'none'})"
    elif facts.error is not None:
        detail += f"; sinfo does not answer: {facts.error}"
    state: State = "ok" if not lack and facts.partitions else "warn"
    return Readiness(state, detail, tuple(lacks), present)
