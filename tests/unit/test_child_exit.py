"""The child's end without the interpreter's teardown (trainer_entry/__main__.py): what an
exit owes still happens, in Python's order, and a thread pool left alive cannot hold it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

PROGRAM = """
import atexit, concurrent.futures, sys, threading, time
from trainer_entry.__main__ import _exit_without_teardown

out = open(sys.argv[1], "w")
pool = concurrent.futures.ThreadPoolExecutor(2)  # idle workers, non-daemon, still referenced
pool.submit(lambda: None).result()
def late():
    time.sleep(0.3)
    out.write("thread done\\n")
threading.Thread(target=late).start()  # a thread that is not a daemon: joined first
atexit.register(lambda: (out.write("atexit ran\\n"), out.flush()))
print("the last line", end="")  # unflushed, as a child's last output may be
_exit_without_teardown(7)
"""


def test_threads_are_joined_atexit_runs_streams_flush_and_the_code_is_kept(tmp_path) -> None:
    record = tmp_path / "record.txt"
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM, str(record)],
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=30,  # the idle pool's workers must not hold the exit
    )
    assert done.returncode == 7, done.stderr
    assert done.stdout == "the last line"
    assert record.read_text() == "thread done\natexit ran\n"
