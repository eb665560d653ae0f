"""What ``run_benchmarks.sh`` hands the command line for an environment: the script run
with a stand-in ``PYTHON`` that prints its arguments instead of running anything."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "run_benchmarks.sh"


def script_argv(folder: Path, **env: str) -> str:
    """The arguments (and any error line) ``run_benchmarks.sh 1 out`` gives the CLI with
    ``env`` set; the stand-in interpreter is written into ``folder``."""
    echo = folder / "python"
    if not echo.exists():
        echo.write_text('#!/bin/sh\necho "$@"\n')
        echo.chmod(0o755)
    done = subprocess.run(
        ["bash", str(SCRIPT), "1", "out"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHON": str(echo), **env},
        timeout=60,
    )
    return done.stdout + done.stderr
