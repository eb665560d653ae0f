"""The named steps of one experiment's launch, each on its own (no training stack needed)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

from orchestrator.contract.layout import ResultsLayout
from orchestrator.job.command import LaunchSite
from orchestrator.job.execute import Placement, RunOptions, prepare_launch, wait_with_limit

SCENARIO = (
    "scenarios:\n  - name: a\n    device: cpu\n    arguments: {model_name_or_path: tiny-llama}\n"
)


def _sleeper(seconds: float) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", f"import time; time.sleep({seconds})"], start_new_session=True
    )


def test_wait_with_limit_tells_an_ending_a_timeout_and_a_stop_apart() -> None:
    ticks: list[float] = []
    done = _sleeper(0)
    assert wait_with_limit(done, 30, None, lambda: None)[:2] == (False, False)
    slow = _sleeper(30)
    try:
        started = time.monotonic()
        timed_out, stopped, job_s = wait_with_limit(slow, 1.5, None, lambda: ticks.append(1))
        assert (timed_out, stopped) == (True, False)
        assert 1.5 <= job_s < 5 and time.monotonic() - started < 5
        assert ticks  # woke once a second for the progress line
        stop = threading.Event()
        stop.set()
        assert wait_with_limit(slow, 30, stop, lambda: None)[:2] == (False, True)
    finally:
        slow.kill()
        slow.wait()


def test_prepare_launch_writes_the_first_nodes_files_only(tmp_path, plan) -> None:
    (experiment,) = plan(SCENARIO, device="cpu", num_gpus=[2], effective_batch_size=[4]).experiments
    layout = ResultsLayout(tmp_path)
    run = layout.run(experiment.experiment_id)
    two_nodes = LaunchSite(num_machines=2, machine_rank=1, main_process_ip="node0")
    other = prepare_launch(
        experiment, run, layout, RunOptions(), Placement(site=two_nodes, port=29500)
    )
    assert not other.primary and not run.spec.exists() and not run.command.exists()
    assert other.files.stderr == run.dir / "stderr.node1.log"
    assert other.argv[other.argv.index("--machine_rank") :][:2] == ["--machine_rank", "1"]
    first = prepare_launch(experiment, run, layout, RunOptions(timeout_s=60), Placement(port=29500))
    assert first.primary and run.spec.is_file() and run.command.is_file()
    assert first.files.stderr == run.stderr and first.timeout_s == 60
    assert "29500" in first.argv and first.env["OMP_NUM_THREADS"]
