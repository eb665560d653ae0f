"""The kernel's parent-death signal: a process started by tunematrix ends when the
process that started it dies, however it died (Linux ``prctl(PR_SET_PDEATHSIG)``).

Asked for by the launcher's tether (``orchestrator.job.tether``: the launcher dies with
its orchestrator) and by the training child (``trainer_entry``: the ranks die with
their launcher). The signal is kept across ``exec``; it is tied to the thread that
started the process.
"""

from __future__ import annotations

import os
import sys

#: prctl(2)'s option: the signal this process gets when its parent thread exits
PR_SET_PDEATHSIG = 1
#: the exit code of a process whose parent was gone before the request was made
ORPHANED = 143


def die_with_parent(sig: int, parent: int) -> None:
    """Have the kernel send this process ``sig`` when its parent (pid ``parent``, read
    when it started) dies; exit ``ORPHANED`` at once if it died already. Nothing where
    the request cannot be made (not Linux, no ``prctl``)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0) != 0:
            return
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before the request was made
        os._exit(ORPHANED)
