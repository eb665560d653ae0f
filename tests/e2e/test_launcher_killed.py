"""A launcher killed outright takes its ranks with it.

``accelerate launch --multi_gpu`` runs torchrun, which starts each rank in a session of
its own: a stop that kills the launch's process group, or Ray cancelling a task (which
kills the worker's children), reaches the launcher but not the ranks. Each rank started
by tunematrix (``TUNEMATRIX_LAUNCH_ID`` set) therefore asks the kernel to kill it when
its parent dies. Here: two gloo ranks training without end, and a single process,
their launcher SIGKILLed; within seconds no process of the launch is left. The single
process, in its launcher's group, is ended as if stopped: its failure is recorded, whether
the signal finds it training or in the middle of importing the training stack (where an
exception raised from the signal once left it running).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid

import psutil
import pytest
from test_run import env

from orchestrator.job.execute import free_port

pytestmark = pytest.mark.e2e

LAUNCH_ID_ENV = "TUNEMATRIX_LAUNCH_ID"


def of_launch(launch_id: str) -> list[psutil.Process]:
    """The processes whose environment names this launch."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get(LAUNCH_ID_ENV) == launch_id:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def importing_torch(proc: psutil.Process) -> bool:
    """Whether the process has begun importing torch: past its parent-death request."""
    try:
        return any("libtorch" in m.path for m in proc.memory_maps(grouped=True))
    except psutil.Error:
        return False


@pytest.mark.parametrize(
    ("processes", "moment"), [(2, "training"), (1, "importing"), (1, "training")]
)
def test_the_ranks_die_with_their_launcher(tmp_path, processes: int, moment: str) -> None:
    spec = tmp_path / "spec.json"
    spec.write_text(
        json.dumps(
            {
                "arguments": {
                    "model_name_or_path": "tiny-llama",
                    "max_steps": 100000,
                    "per_device_train_batch_size": 1,
                    "max_seq_len": 64,
                    "report_to": "none",
                    "save_strategy": "no",
                },
                "result_path": str(tmp_path / "result.json"),
            }
        )
    )
    launch_id = uuid.uuid4().hex
    argv = [sys.executable, "-m", "accelerate.commands.launch"]
    argv += ["--multi_gpu" if processes > 1 else "--cpu", "--num_processes", str(processes)]
    argv += ["--num_machines", "1", "--main_process_port"]
    argv += [str(free_port()), "-m", "trainer_entry", "--spec", str(spec)]
    launcher = subprocess.Popen(
        argv,
        cwd=tmp_path,
        env={**env(), LAUNCH_ID_ENV: launch_id, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"},
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "stderr.log").open("w"),
        start_new_session=True,
    )
    try:
        ranks: list[psutil.Process] = []
        deadline = time.monotonic() + 120
        while len(ranks) < processes and time.monotonic() < deadline:
            assert launcher.poll() is None, (tmp_path / "stderr.log").read_text()[-3000:]
            time.sleep(0.5)
            ranks = [p for p in of_launch(launch_id) if p.pid != launcher.pid]
        assert len(ranks) == processes, [p.cmdline() for p in ranks]
        # torchrun's ranks are out of the launcher's group's reach; a single process is in it
        apart = [os.getsid(p.pid) != os.getsid(launcher.pid) for p in ranks]
        assert apart == [processes > 1] * processes

        # the moment: every rank importing the training stack, or rank 0 training
        def there() -> bool:
            if moment == "training":
                return (tmp_path / "progress.json").exists()
            return all(importing_torch(p) for p in ranks)

        deadline = time.monotonic() + 120
        while not there() and time.monotonic() < deadline:
            assert launcher.poll() is None, (tmp_path / "stderr.log").read_text()[-3000:]
            time.sleep(0.05)
        assert there(), f"the launch never got to {moment}"
        os.kill(launcher.pid, signal.SIGKILL)
        launcher.wait()
        deadline = time.monotonic() + 30
        while of_launch(launch_id) and time.monotonic() < deadline:
            time.sleep(0.25)
        assert of_launch(launch_id) == []
        if processes == 1:
            result = json.loads((tmp_path / "result.json").read_text())
            assert result["status"] == "interrupted", result
    finally:
        for proc in of_launch(launch_id):
            proc.kill()
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
