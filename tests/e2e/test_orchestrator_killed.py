"""What survives a killed orchestrator, for real (docs/running.md, "What survives what").

- ``kill -9`` of ``tunematrix run`` mid-cell: the kernel ends its job (the launcher's
  parent-death signal, ``orchestrator.job.tether``), and a ``--resume`` runs the cell
  again, its result and outcome from one launch.
- A resume while an earlier attempt's job is still alive (here a job started by the
  test the way the orchestrator starts one, its lock passed on, with nothing tying it
  to its starter, which then exits): the resume stops it before launching, and the
  folder ends with one attempt's files, the earlier one's kept under ``attempts/``.
- A child whose attempt is no longer its folder's (the spec there moved or rewritten)
  writes nothing there.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from test_run import DEFAULTS, env, processes_mentioning, scenario, scenarios

from orchestrator.job import runlock

pytestmark = pytest.mark.e2e

#: long enough to be caught training, short enough for a resume to finish it
STEPS = 600


def _start(cwd: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            *(sys.executable, "-m", "orchestrator", "run", "--scenarios", "scenarios.yaml"),
            *("--results", "res", "--device", "cpu", "--no-check", *args),
        ],
        cwd=cwd,
        env={**env(), "OMP_NUM_THREADS": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _training(run_dir_glob: str, root: Path, deadline_s: float = 240) -> Path:
    """The run folder once its child has reported a step."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        for progress in root.glob(f"{run_dir_glob}/progress.json"):
            return progress.parent
        time.sleep(0.2)
    raise AssertionError(f"no {run_dir_glob} started training in {deadline_s} s")


def _none_left(text: str, within_s: float) -> list[psutil.Process]:
    deadline = time.monotonic() + within_s
    while (left := processes_mentioning(text)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def _resume(cwd: Path) -> subprocess.CompletedProcess[str]:
    proc = _start(cwd, "--resume")
    stdout, stderr = proc.communicate(timeout=600)
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def _agree(run_dir: Path) -> tuple[dict, dict]:
    result = json.loads((run_dir / "result.json").read_text())
    outcome = json.loads((run_dir / "outcome.json").read_text())
    assert result["status"] == outcome["status"] == "ok", (result["status"], outcome)
    assert result["launch_id"] == outcome["launch_id"]
    return result, outcome


def _kill_all(text: str) -> None:
    for proc in processes_mentioning(text):
        proc.kill()


def test_kill_9_of_the_orchestrator_ends_its_job_and_resume_finishes_it(tmp_path) -> None:
    (tmp_path / "defaults.yaml").write_text(DEFAULTS)
    long = f"      max_steps: {STEPS}\n"
    (tmp_path / "scenarios.yaml").write_text(
        scenarios(scenario("fine", num_gpus="[1]"), scenario("long", extra=long, num_gpus="[1]"))
    )
    results = tmp_path / "res"
    orchestrator = _start(tmp_path)
    try:
        run_dir = _training("runs/long.*", results)
        assert processes_mentioning(str(run_dir))  # its launcher, child and sidecar
        lock = runlock.holder(run_dir)
        assert lock is not None and lock.launcher_pid is not None
        orchestrator.kill()
        orchestrator.communicate()
        left = _none_left(str(results), within_s=10)
        assert left == [], [p.cmdline() for p in left]
        assert runlock.holder(run_dir) is None
        assert not (run_dir / "outcome.json").exists()  # its orchestrator never wrote it
    finally:
        _kill_all(str(results))

    again = _resume(tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "stopping an earlier attempt" not in again.stdout + again.stderr
    result, outcome = _agree(run_dir)
    assert outcome["attempt"] == 2
    earlier = run_dir / "attempts" / "1"
    assert (earlier / "spec.json").is_file()
    kept = json.loads((earlier / "result.json").read_text())  # its own, where it stopped
    assert kept["status"] == "interrupted" and kept["launch_id"] != result["launch_id"]
    assert not (run_dir / "running.lock").exists()
    assert processes_mentioning(str(results)) == []


#: starts a run's job as the orchestrator does (the run's lock passed on to it, its
#: launch id in its environment), but untied to its starter, which then exits at once
_ORPHAN = """
import os, shlex, subprocess, sys
from pathlib import Path
from orchestrator.job.runlock import RunLock
run_dir, launch_id, argv = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
lock = RunLock.take([run_dir], launch_id, "local")
job = subprocess.Popen(
    argv, cwd=os.getcwd(), env={**os.environ, "TUNEMATRIX_LAUNCH_ID": launch_id},
    stdout=open(run_dir / "stdout.log", "w"), stderr=open(run_dir / "stderr.log", "w"),
    stdin=subprocess.DEVNULL, start_new_session=True, pass_fds=lock.fds,
)
lock.launched(job.pid)
print(job.pid, flush=True)
os._exit(0)
"""


def _command(run_dir: Path) -> tuple[dict[str, str], list[str]]:
    """The environment overlay and command of a run's command.sh."""
    overlay, argv = {}, []
    for line in (run_dir / "command.sh").read_text().splitlines():
        if line.startswith("export "):
            name, _, value = line[len("export ") :].partition("=")
            overlay[name] = shlex.split(value)[0] if value else ""
        elif line and not line.startswith(("#", "set ", "cd ")):
            argv = shlex.split(line)
    return overlay, argv


def test_resume_stops_an_earlier_attempt_still_alive(tmp_path) -> None:
    (tmp_path / "defaults.yaml").write_text(DEFAULTS)
    long = f"      max_steps: {STEPS}\n"
    (tmp_path / "scenarios.yaml").write_text(
        scenarios(scenario("long", extra=long, num_gpus="[1]"))
    )
    results = tmp_path / "res"
    # a first attempt, its orchestrator killed: the folder of an unfinished cell
    first = _start(tmp_path)
    try:
        run_dir = _training("runs/long.*", results)
        first.kill()
        first.communicate()
        assert _none_left(str(results), within_s=10) == []
    finally:
        _kill_all(str(results))
    (run_dir / "result.json").unlink(missing_ok=True)
    (run_dir / "progress.json").unlink()
    # its job started again by hand, alive and training, its starter gone
    overlay, argv = _command(run_dir)
    launch_id = "kept-alive-by-the-test"
    starter = subprocess.run(
        [sys.executable, "-c", _ORPHAN, str(run_dir), launch_id, *argv],
        cwd=tmp_path,
        env={**env(), **overlay, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert starter.returncode == 0, starter.stderr
    launcher = psutil.Process(int(starter.stdout.strip()))
    try:
        _training("runs/long.*", results)
        assert runlock.holder(run_dir) is not None
        assert runlock.processes_of(launch_id)

        again = _resume(tmp_path)
        assert again.returncode == 0, again.stderr[-3000:]
        said = again.stdout + again.stderr
        assert f"{run_dir.name}: stopping an earlier attempt still running" in said, said
        assert f"pids {launcher.pid}" in said or f"{launcher.pid}," in said, said
        assert not launcher.is_running() or launcher.status() == psutil.STATUS_ZOMBIE
        assert runlock.processes_of(launch_id) == []
    finally:
        for pid in runlock.processes_of(launch_id):
            os.kill(pid, signal.SIGKILL)
    _result, outcome = _agree(run_dir)
    assert outcome["attempt"] == 2
    # the kept-alive attempt's files (in the first one's folder) kept, whole, with what
    # it wrote when stopped
    stopped = run_dir / "attempts" / "1"
    assert (stopped / "spec.json").is_file() and (stopped / "stderr.log").is_file()
    kept = json.loads((stopped / "result.json").read_text())
    assert kept["status"] == "interrupted" and kept["launch_id"] == launch_id
    assert processes_mentioning(str(results)) == []


def test_a_child_whose_attempt_is_over_writes_nothing(tmp_path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    spec = {
        "experiment_id": "stale",
        "arguments": {
            "model_name_or_path": "tiny-llama",
            "max_steps": 100000,
            "per_device_train_batch_size": 1,
            "max_seq_len": 64,
            "report_to": "none",
            "save_strategy": "no",
        },
        "attempt_token": "first",
    }
    (run_dir / "spec.json").write_text(json.dumps(spec))
    child = subprocess.Popen(
        [sys.executable, "-m", "trainer_entry", "--spec", str(run_dir / "spec.json")],
        cwd=tmp_path,
        env={**env(), "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _training("run", tmp_path)
        # a later attempt takes the folder: the earlier spec moved away, its own written
        os.replace(run_dir / "spec.json", tmp_path / "earlier-spec.json")
        (run_dir / "spec.json").write_text(json.dumps({**spec, "attempt_token": "second"}))
        (run_dir / "progress.json").unlink()
        time.sleep(2.5)  # past the progress file's next write
        child.send_signal(signal.SIGTERM)  # stopped: it would record "interrupted"
        _out, stderr = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode != 0
    assert not (run_dir / "result.json").exists(), (run_dir / "result.json").read_text()
    assert not (run_dir / "progress.json").exists()
    assert "a later attempt of stale owns its run folder" in stderr, stderr[-2000:]
