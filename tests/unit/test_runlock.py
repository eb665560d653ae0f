"""A run folder's lock (orchestrator/job/runlock.py) and the launcher's tether
(orchestrator/job/tether.py), with real processes: a lock held by a child that
inherited it, a child that ignores SIGTERM, a tethered child whose parent is killed."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.job import runlock
from orchestrator.job.tether import tethered

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux: /proc, prctl")

LAUNCH_ID_ENV = "TUNEMATRIX_LAUNCH_ID"
#: a job's stand-in: says it is up, then waits; optionally deaf to SIGTERM
_JOB = (
    "import signal, sys, time\n"
    "if sys.argv[1] == 'deaf': signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "print('up', flush=True)\n"
    "time.sleep(120)\n"
)


def _job(lock: runlock.RunLock, launch_id: str, mode: str = "plain") -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", _JOB, mode],
        env={**os.environ, LAUNCH_ID_ENV: launch_id},
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
        pass_fds=lock.fds,
    )
    assert proc.stdout is not None and proc.stdout.readline() == "up\n"
    lock.launched(proc.pid)
    return proc


def _orphaned(lock: runlock.RunLock) -> None:
    """The orchestrator's side gone (its copies of the lock closed), the file kept."""
    for fd in lock.fds:
        os.close(fd)


def test_a_lock_names_its_holder_and_is_removed_at_the_end(tmp_path: Path) -> None:
    lock = runlock.RunLock.take([tmp_path], "L1", "local")
    record = json.loads((tmp_path / "running.lock").read_text())
    assert record["launch_id"] == "L1" and record["orchestrator_pid"] == os.getpid()
    lock.launched(4242)
    found = runlock.holder(tmp_path)
    assert found is not None and found.launcher_pid == 4242 and found.executor == "local"
    with pytest.raises(runlock.RunBusy, match=r"an earlier attempt is still running"):
        runlock.RunLock.take([tmp_path], "L2", "local")
    lock.close()
    assert not (tmp_path / "running.lock").exists()
    assert runlock.holder(tmp_path) is None


def test_a_leftover_lock_file_nobody_holds_is_no_attempt(tmp_path: Path) -> None:
    (tmp_path / "running.lock").write_text('{"launch_id": "gone", "launcher_pid": 1}\n')
    assert runlock.holder(tmp_path) is None
    assert not (tmp_path / "running.lock").exists()
    runlock.stop_earlier(tmp_path, 1.0, say=pytest.fail)  # nothing to stop, nothing said


@pytest.mark.parametrize("mode", ["plain", "deaf"])
def test_an_earlier_attempt_alive_is_stopped(tmp_path: Path, mode: str) -> None:
    lock = runlock.RunLock.take([tmp_path], f"alive-{mode}", "local")
    job = _job(lock, f"alive-{mode}", mode)
    _orphaned(lock)
    try:
        assert runlock.holder(tmp_path) is not None  # the job holds it alone now
        assert runlock.processes_of(f"alive-{mode}") == [job.pid]
        said: list[str] = []
        started = time.monotonic()
        runlock.stop_earlier(tmp_path, 1.0, said.append)
        assert job.wait(timeout=5) == (-signal.SIGTERM if mode == "plain" else -signal.SIGKILL)
        assert time.monotonic() - started < 8
        host, me = re.escape(socket.gethostname()), os.getpid()
        assert len(said) == 1 and re.fullmatch(
            rf"{tmp_path.name}: stopping an earlier attempt still running \(launched \S+ "
            rf"by tunematrix pid {me} on {host}, pids {job.pid}\)",
            said[0],
        ), said
        assert runlock.holder(tmp_path) is None
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()


@pytest.mark.parametrize(
    ("record", "why"),
    [
        ({"host": "elsewhere-node-7"}, "on another host (elsewhere-node-7)"),
        ({"executor": "slurm"}, "a slurm job: cancel it there"),
        ({"launch_id": "no-such-launch"}, "no process of its launch is visible here"),
    ],
)
def test_an_attempt_that_cannot_be_stopped_here_is_refused(
    tmp_path: Path, record: dict[str, str], why: str
) -> None:
    lock = runlock.RunLock.take([tmp_path], "refused", "local")
    lock._record.update(record)
    lock.launched(99999)
    said: list[str] = []
    try:
        with pytest.raises(runlock.RunBusy) as refused:
            runlock.stop_earlier(tmp_path, 0.5, said.append)
        line = str(refused.value)
        assert line.startswith(f"{tmp_path.name}: an earlier attempt is still running (")
        assert why in line and "\n" not in line and said == []
    finally:
        lock.close()


def test_a_tethered_command_dies_with_the_process_that_started_it(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    # a parent that starts a tethered sleeper, says its pid, then waits forever; the
    # sleeper ignores SIGTERM, as accelerate's launcher from 1.16 on takes it to stop
    # its child: the tether's signal is SIGKILL
    sleeper = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"
    parent_code = (
        "import subprocess, sys, time\n"
        "from orchestrator.job.tether import tethered\n"
        f"child = subprocess.Popen(tethered([sys.executable, '-c', {sleeper!r}]),"
        " start_new_session=True)\n"
        f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        "time.sleep(120)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", parent_code])
    try:
        deadline = time.monotonic() + 30
        while not pid_file.exists() or not pid_file.read_text():
            assert time.monotonic() < deadline and parent.poll() is None
            time.sleep(0.05)
        child = int(pid_file.read_text())
        # exec'd: the tether became the command itself, same pid
        time.sleep(0.5)
        assert "time.sleep(120)" in Path(f"/proc/{child}/cmdline").read_text()
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 5
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_the_tether_keeps_the_exit_code_and_refuses_bad_use() -> None:
    code = "import sys; sys.exit(7)"
    assert subprocess.run(tethered([sys.executable, "-c", code])).returncode == 7
    usage = subprocess.run(
        [sys.executable, "-m", "orchestrator.job.tether", "x"], capture_output=True, text=True
    )
    assert usage.returncode == 2 and "usage:" in usage.stderr
    missing = subprocess.run(tethered(["/nonexistent/launcher"]), capture_output=True, text=True)
    assert missing.returncode == 127 and "cannot start /nonexistent/launcher" in missing.stderr


def test_a_new_run_stops_an_earlier_runs_job_before_moving_its_folder(tmp_path: Path) -> None:
    from orchestrator.running.resultsdir import open_results

    run_dir = tmp_path / "res" / "runs" / "x.tiny-llama.none.g1.eb4-00000000"
    run_dir.mkdir(parents=True)
    (run_dir / "spec.json").write_text("{}")
    lock = runlock.RunLock.take([run_dir], "earlier-run", "local")
    job = _job(lock, "earlier-run")
    _orphaned(lock)
    said: list[str] = []
    try:
        with open_results(tmp_path / "res", resume=False, grace_s=2.0, say=said.append) as opened:
            assert job.wait(timeout=5) == -signal.SIGTERM
            assert opened.moved_to is not None
            assert (opened.moved_to / "runs" / run_dir.name / "spec.json").is_file()
        assert len(said) == 1 and said[0].startswith(f"{run_dir.name}: stopping an earlier")
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
