"""``python -m orchestrator.job.tether PARENT_PID -- COMMAND...``: run COMMAND so that it
ends when the orchestrator that started it dies.

The job's launcher (``accelerate launch``) runs in a session of its own, so that a
stop can end its whole process group; that also takes it out of reach of anything
that ends the orchestrator's. Killed outright (``kill -9``, the OOM killer, a
scheduler ending the login process), the orchestrator would leave its job training.
This asks the kernel to kill the launcher when its parent dies (``PR_SET_PDEATHSIG``,
kept across ``exec``), then becomes the launcher: its pid, exit code and process
group are the launcher's own.

SIGKILL, not SIGTERM. The kernel sends the signal each time the launcher passes to
another of the dying orchestrator's threads, so a launcher gets it several times
within milliseconds. From accelerate 1.16 a launcher that gets SIGTERM stops its
child and kills it at a second SIGTERM (or after 5 s): the child, cut short, wrote no
result. Killed at once, the launcher leaves its child to the child's own parent-death
signal (``trainer_entry``): a single process gets SIGTERM, with no clock running, and
records ``interrupted``; a rank in a session of its own gets SIGKILL, as when its
launcher is killed by hand.

The request is tied to the thread that started the process; every executor's thread
waits for the job it started, so the job outlives no thread of a live orchestrator.
Linux only; elsewhere the command runs as it is.
"""

from __future__ import annotations

import os
import signal
import sys

from orchestrator.contract.parentdeath import die_with_parent


def tethered(argv: list[str], parent: int | None = None) -> list[str]:
    """``argv`` run by this module, tied to ``parent`` (default: this process)."""
    pid = os.getpid() if parent is None else parent
    return [sys.executable, "-m", "orchestrator.job.tether", str(pid), "--", *argv]


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--" or not argv[0].isdigit():
        print("usage: python -m orchestrator.job.tether PARENT_PID -- COMMAND...", file=sys.stderr)
        return 2
    parent, command = int(argv[0]), argv[2:]
    die_with_parent(signal.SIGKILL, parent)  # exits at once if the orchestrator is gone
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        print(f"tunematrix: cannot start {command[0]}: {exc.strerror}", file=sys.stderr)
        return 127
    return 0  # not reached: exec replaced this process


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
