"""--executor slurm across two real nodes (see ``tests/slurmcluster.py``'s ``start_nodes``).

One slurmctld here and two slurmd, each in its own network namespace with its
own address and one CPU, so a 2-process CPU experiment runs as one job over
both nodes: gloo DDP between the namespaces. Then it is broken on node 1
(its rank killed; its rank OOM-killed under a cgroup memory limit), stopped
by its time limit and by Ctrl-C; each must come out with the right status and
leave no process on either node but slurmd. The cluster starts once for the
module; where it cannot be built (not root, no ``ip``, no SLURM) it skips.

The time limit is the experiment's own ``--timeout``: SLURM's limit is whole
minutes, too slow for a test (``test_slurm.py`` checks SLURM's TIMEOUT).
"""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import memcgroup
import pytest
import slurmcluster

pytestmark = [pytest.mark.e2e, pytest.mark.cluster]

REPO = Path(__file__).resolve().parents[2]
STEPS = 3
#: per rank: 2 sequences of 64 tokens a step (effective batch 4 over 2 processes)
RANK_TOKENS = STEPS * 2 * 64
OOM_LIMIT = 1280 * 1024 * 1024


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[slurmcluster.MultiCluster]:
    started = slurmcluster.start_nodes(tmp_path_factory.mktemp("slurm2"), count=2, cpus=1)
    if isinstance(started, str):
        if "did not start" in started or "did not come up" in started:
            # what this machine has was enough to build it: a daemon failing is a bug
            pytest.fail(f"the two-node SLURM cluster did not start: {started}")
        pytest.skip(f"no two-node SLURM cluster: {started}")
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture(autouse=True)
def _no_job_outlives_its_test(nodes: slurmcluster.MultiCluster) -> Iterator[None]:
    """A failed test's job (its orchestrator killed) must not hold the nodes for the next."""
    yield
    slurmcluster.cancel_every_job(env(nodes))


def scenarios(steps: int = STEPS, batch: int = 4, seq: int = 64, dataset: str = "") -> str:
    data = f"      dataset: {dataset}\n" if dataset else ""
    return f"""\
frameworks:
  ddp: {{accelerate_config: {REPO / "accelerate-ddp.yaml"}}}
matrix:
  effective_batch_size: [{batch}]
  num_gpus: [2]
scenarios:
  - name: two-nodes
    device: cpu
    framework_config: [ddp]
    num_gpus: [2]
    arguments:
      model_name_or_path: tiny-llama
      max_seq_len: {seq}
      trainer: hf
      torch_dtype: float32
      max_steps: {steps}
{data}"""


def argv(results: str = "results", *extra: str) -> list[str]:
    return [
        sys.executable,
        *("-m", "orchestrator", "run", "--scenarios", "scenarios.yaml"),
        *("--defaults", str(REPO / "defaults.yaml"), "--results", results),
        *("--device", "cpu", "--executor", "slurm", "--no-report"),
        *extra,
    ]


def env(cluster: slurmcluster.MultiCluster) -> dict[str, str]:
    return {
        **os.environ,
        **cluster.env,
        "PYTHONPATH": str(REPO),
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
    }


def row(results: Path) -> dict[str, str]:
    with (results / "raw_summary.csv").open() as f:
        (only,) = list(csv.DictReader(f))
    return only


def run_dir(results: Path) -> Path:
    (folder,) = [p for p in (results / "runs").iterdir() if p.is_dir()]
    return folder


def only_slurmd_left(cluster: slurmcluster.MultiCluster) -> None:
    """Every node's namespace holds its slurmd and nothing else (waits for the steps to go)."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if all(n.pids() == [n.pid] for n in cluster.nodes):
            return
        time.sleep(0.2)
    left = {n.name: [_cmdline(p) for p in n.pids() if p != n.pid] for n in cluster.nodes}
    pytest.fail(f"processes left on the nodes: {left}")


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:200]
    except OSError:
        return "?"


def rank_on(node: slurmcluster.Node) -> int | None:
    """The training rank's pid on a node (``-m trainer_entry``, not its launcher)."""
    for pid in node.pids():
        words = _cmdline(pid).split()
        if "trainer_entry" in words and not any("accelerate" in w for w in words):
            return pid
    return None


def start(tmp: Path, cluster: slurmcluster.MultiCluster, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        argv("results", *extra),
        cwd=tmp,
        env=env(cluster),
        stdout=(tmp / "out.log").open("w"),
        stderr=subprocess.STDOUT,
        text=True,
    )


def until_training(tmp: Path, proc: subprocess.Popen[str], seconds: float = 90) -> Path:
    """The run folder once the child's step counter exists: both ranks met (DDP's
    rendezvous) and train."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = list((tmp / "results" / "runs").glob("*/progress.json"))
        if found:
            return found[0].parent
        assert proc.poll() is None, (tmp / "out.log").read_text()[-3000:]
        time.sleep(0.2)
    proc.kill()
    pytest.fail("the ranks never started training: " + (tmp / "out.log").read_text()[-3000:])


def test_a_two_process_cpu_experiment_spans_both_nodes(tmp_path, nodes) -> None:
    (tmp_path / "scenarios.yaml").write_text(scenarios())
    proc = subprocess.run(
        argv(), cwd=tmp_path, env=env(nodes), capture_output=True, text=True, timeout=180
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = tmp_path / "results"
    r = row(results)
    assert r["status"] == "ok", r["error"]
    # both ranks' tokens: twice what one rank trained on
    assert int(r["tokens_total"]) == 2 * RANK_TOKENS
    run = run_dir(results)
    assert json.loads((run / "result.json").read_text())["status"] == "ok"
    # node 1 ran its own launcher (its own logs and verdict), node 0 wrote the run's files
    assert (run / "stderr.node1.log").is_file() and (run / "stdout.node1.log").is_file()
    assert json.loads((run / "outcome.node1.json").read_text())["status"] == "ok"
    command = (run / "command.sh").read_text()
    assert "--num_machines 2" in command and f"--main_process_ip {nodes.nodes[0].name}" in command
    only_slurmd_left(nodes)


def test_a_results_folder_the_nodes_cannot_see_is_refused(tmp_path, nodes) -> None:
    # mounted here after the nodes started: their mount namespaces do not see it
    (tmp_path / "scenarios.yaml").write_text(scenarios())
    local = tmp_path / "local"
    local.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tunematrix", str(local)], check=True)
    try:
        proc = subprocess.run(
            argv(str(local / "results")),
            cwd=tmp_path,
            env=env(nodes),
            capture_output=True,
            text=True,
            timeout=120,
        )
        # refused before the results folder was opened: no folder, no token left
        left = sorted(p.name for p in local.iterdir())
    finally:
        subprocess.run(["umount", str(local)], check=True)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert "is not visible from a job on" in proc.stderr, proc.stderr
    assert left == [], left


def test_node1s_rank_killed_is_failed_naming_node1s_log(tmp_path, nodes) -> None:
    (tmp_path / "scenarios.yaml").write_text(scenarios(steps=1_000_000))
    proc = start(tmp_path, nodes)
    try:
        until_training(tmp_path, proc)
        pid = rank_on(nodes.nodes[1])
        assert pid is not None, [_cmdline(p) for p in nodes.nodes[1].pids()]
        os.kill(pid, signal.SIGKILL)
        code = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    out = (tmp_path / "out.log").read_text()
    assert code == 1, out[-3000:]
    r = row(tmp_path / "results")
    assert r["status"] == "failed", r["error"]
    assert r["error"].startswith("node 1") and "killed by SIGKILL" in r["error"], r["error"]
    assert r["log"].endswith("stderr.node1.log"), r["log"]
    assert (tmp_path / "results" / r["log"]).is_file()
    only_slurmd_left(nodes)


def test_node1s_rank_oom_killed_under_a_cgroup_limit_is_oom(tmp_path, nodes) -> None:
    # node 1 (its slurmd, so every step it starts) in a memory cgroup of OOM_LIMIT; its
    # tree idles at about 1 GiB (the task, the sidecar, the launcher, the rank), and a
    # batch of 64 sequences of 1024 tokens per rank does not fit: the fp32 logits alone
    # are 64 × 1024 × 1024 × 4 bytes = 256 MiB, several copies in the loss and its
    # backward (as in tests/e2e/test_prune_e2e.py, half its batch; 32 a rank peaked at
    # 1.2 GiB, too close to the limit to be sure)
    shipped = (REPO / "trainer_entry" / "assets" / "instructions.jsonl").read_text()
    (tmp_path / "long.jsonl").write_text(shipped * 6)
    (tmp_path / "scenarios.yaml").write_text(
        scenarios(steps=2, batch=128, seq=1024, dataset=str(tmp_path / "long.jsonl"))
    )
    slurmd = nodes.nodes[1].pid
    assert slurmd is not None
    with memcgroup.memory_cgroup("slurm-node1", OOM_LIMIT) as folder:
        (folder / "cgroup.procs").write_text(str(slurmd))
        try:
            # the time limit only bounds a run that went wrong (a rank killed before the
            # rendezvous leaves the other waiting for it)
            proc = subprocess.run(
                argv("results", "--timeout", "150"),
                cwd=tmp_path,
                env=env(nodes),
                capture_output=True,
                text=True,
                timeout=240,
            )
        finally:
            (memcgroup.CGROUP_V1 / "cgroup.procs").write_text(str(slurmd))
        only_slurmd_left(nodes)
        assert memcgroup.left_in(folder) == []
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]  # oom is an answer
    r = row(tmp_path / "results")
    assert r["status"] == "oom", r["error"]
    assert r["error"].startswith("node 1") and "out-of-memory killer" in r["error"], r["error"]
    assert r["log"].endswith("stderr.node1.log"), r["log"]


def test_the_time_limit_stops_both_nodes(tmp_path, nodes) -> None:
    (tmp_path / "scenarios.yaml").write_text(scenarios(steps=1_000_000))
    proc = subprocess.run(
        argv("results", "--timeout", "10"),
        cwd=tmp_path,
        env=env(nodes),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    r = row(tmp_path / "results")
    assert r["status"] == "timeout", r["error"]
    assert "time limit of 10 s" in r["error"]
    only_slurmd_left(nodes)


def test_ctrl_c_interrupts_both_nodes(tmp_path, nodes) -> None:
    (tmp_path / "scenarios.yaml").write_text(scenarios(steps=1_000_000))
    proc = start(tmp_path, nodes)
    try:
        until_training(tmp_path, proc)
        assert rank_on(nodes.nodes[0]) and rank_on(nodes.nodes[1])
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 130, (tmp_path / "out.log").read_text()[-3000:]
    r = row(tmp_path / "results")
    assert r["status"] == "interrupted", r["error"]
    assert r["job_id"]
    only_slurmd_left(nodes)
