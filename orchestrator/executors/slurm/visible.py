"""Before submitting: can a job on the cluster see the results folder? (``executors.sharedfs``)

A token is written into the results folder here, and one short job step
(``srun``, given an argument list: srun execs it directly, no shell) runs
``sharedfs.seen`` with the token's path and content on a node. The step asks
for its resources with ``--immediate``, so a busy cluster costs at most that
wait: then the check is skipped, said in one line, and the run goes on.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from orchestrator.contract.layout import PROJECT_ROOT
from orchestrator.executors import sharedfs
from orchestrator.executors.slurm.settings import NAME, SlurmSettings

#: how long the check waits for a free CPU on the cluster (srun --immediate)
IMMEDIATE_S = 20
#: what the step prints before its answer
MARK = "tunematrix-shared"
#: runs on the node: sys.argv = [project root, token path, token content]
_CHECK = (
    "import sys; sys.path.insert(0, sys.argv[1]); "
    "from orchestrator.executors.sharedfs import seen, where_am_i; "
    f"print({MARK!r}, 'seen' if seen(sys.argv[2], sys.argv[3]) else 'unseen', where_am_i())"
)


def check_argv(settings: SlurmSettings, path: str, content: str) -> list[str]:
    """The srun command of the check (an argument list; no value passes through a shell)."""
    argv = [
        "srun",
        f"--immediate={IMMEDIATE_S}",
        "--nodes=1",
        "--ntasks=1",
        "--cpus-per-task=1",
        "--time=1",
        "--job-name=tunematrix-shared-check",
        "--quiet",
    ]
    if settings.partition:
        argv.append(f"--partition={settings.partition}")
    if settings.account:
        argv.append(f"--account={settings.account}")
    # the jobs' own constraints (qos, reservation, constraint, ...): the check lands
    # where they would, and is refused where they would be
    for name, value in settings.options.items():
        argv.append(f"--{name.replace('_', '-')}={value}")
    argv += ["--", sys.executable, "-c", _CHECK, str(PROJECT_ROOT), path, content]
    return argv


def answer(stdout: str) -> tuple[bool, str] | None:
    """(seen, node) from the step's output; None where it gave no answer."""
    for line in reversed(stdout.splitlines()):
        parts = line.split()
        if len(parts) == 3 and parts[0] == MARK and parts[1] in ("seen", "unseen"):
            return parts[1] == "seen", parts[2]
    return None


def check_shared(root: Path, settings: SlurmSettings, say: Callable[[str], None]) -> None:
    """Raise ``sharedfs.not_shared``'s one line where a job on the cluster cannot see ``root``;
    say in one line (``say``) when the check could not run and was skipped."""
    with sharedfs.token(root) as token:
        argv = check_argv(settings, token.path, token.content)
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=IMMEDIATE_S + 60)
        except (OSError, subprocess.TimeoutExpired) as exc:
            say(sharedfs.skipped(root, "the SLURM nodes", str(exc)))
            return
    found = answer(proc.stdout)
    if found is None:
        lines = [line.strip() for line in proc.stderr.splitlines() if line.strip()]
        why = lines[-1][:200] if lines else f"srun exit code {proc.returncode}"
        say(sharedfs.skipped(root, "the SLURM nodes", why))
        return
    visible, node = found
    if not visible:
        raise sharedfs.not_shared(NAME, root, node)
