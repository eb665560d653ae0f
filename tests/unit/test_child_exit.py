"""The child's end (trainer_entry/__main__.py). Without the interpreter's teardown: what an
exit owes still happens, in Python's order, and a thread pool left alive cannot hold it.
Stopped by SIGTERM: the run is recorded and the process ends, whatever code the signal
interrupts."""

from __future__ import annotations

import json
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


STOPPED = """
import json, os, signal, sys, time
from pathlib import Path
from orchestrator.contract.spec import read_spec
import trainer_entry.__main__ as entry

spec = read_spec(Path(sys.argv[1]))
signal.signal(signal.SIGTERM, entry._on_sigterm)
entry._RUNNING.append((spec, {"run_start_unix": time.time()}))
try:  # as a library's import that catches what it meets, or a module left half imported
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(10)
except BaseException:
    pass
print("went on")
"""


def test_a_sigterm_records_the_run_and_ends_the_process_whatever_catches(tmp_path) -> None:
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"arguments": {"model_name_or_path": "tiny-llama"}}))
    done = subprocess.run(
        [sys.executable, "-c", STOPPED, str(spec)],
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert (done.returncode, done.stdout) == (143, ""), done.stderr
    result = json.loads((tmp_path / "result.json").read_text())
    assert (result["status"], result["error"]) == ("interrupted", "Terminated: stopped by SIGTERM")
