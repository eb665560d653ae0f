"""--executor ray against a real local Ray cluster of node processes (see tests/raycluster.py).

One cluster for the module: a head and a worker node of 2 CPUs each, so two
2-process experiments cannot share a node. The fault cases add a node of their
own where they need one (in a memory cgroup, in a mount namespace of its own,
one to kill) and stop it after. After every run no process of the run may be
left on any node (``processes_mentioning`` the results folder).
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
from hiding import pythonpath_hiding
from raycluster import RayCluster, free_ports, processes_mentioning, start_cluster

pytestmark = [pytest.mark.e2e, pytest.mark.cluster]

REPO = Path(__file__).resolve().parents[2]
#: the files every run folder has after an ok run here, whichever executor ran it
LOCAL_FILES = {
    "command.sh",
    "memory.csv",
    "outcome.json",
    "progress.json",
    "result.json",
    "sidecar.log",
    "spec.json",
    "stderr.log",
    "stdout.log",
}


def scenarios(
    max_steps: int = 2,
    rates: str = "[1e-4, 2e-4]",
    processes: int = 2,
    batch: int = 4,
    seq: int = 64,
    ray: str = "",
    more: str = "",
) -> str:
    return f"""\
frameworks:
  ddp: {{accelerate_config: {REPO / "accelerate-ddp.yaml"}}}
matrix:
  effective_batch_size: [{batch}]
  num_gpus: [{processes}]
  max_seq_len: [{seq}]
scenarios:
  - name: on-ray
    device: cpu
    framework_config: [ddp]
    arguments:
      model_name_or_path: tiny-llama
      trainer: hf
      max_steps: {max_steps}{more}
    sweep:
      learning_rate: {rates}
{ray}"""


#: the memory cgroup of the node where the OOM case runs
OOM_BYTES = 2048 * 1024 * 1024


@pytest.fixture(scope="module")
def cluster() -> Iterator[RayCluster]:
    """A head and a worker of 2 CPUs; ``small`` (1 CPU, in a 2 GiB memory cgroup) and
    ``doomed`` (1 CPU, killed by a test), which only experiments asking for their Ray
    resource of the same name use."""
    with memcgroup.memory_cgroup("ray-oom", OOM_BYTES) as folder:

        def more(cluster: RayCluster) -> None:
            # the kernel's OOM killer, not Ray's memory monitor, is what this case is about
            cluster.add_node(
                "small",
                1,
                resources={"small": 1},
                preexec_fn=memcgroup.joining(folder),
                extra_env={"RAY_memory_monitor_refresh_ms": "0"},
            )
            cluster.add_node("doomed", 1, resources={"doomed": 1})

        found = start_cluster(head_cpus=2, worker_cpus=2, more=more)
        try:
            yield found
        finally:
            found.stop()
        assert memcgroup.left_in(folder) == []


def run_args(*extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "orchestrator",
        "run",
        "--scenarios",
        "scenarios.yaml",
        "--defaults",
        str(REPO / "defaults.yaml"),
        "--results",
        "results",
        "--executor",
        "ray",
        "--device",
        "cpu",
        *extra,
    ]


def tunematrix(
    tmp: Path, env: dict[str, str], argv: list[str], timeout: float = 240
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=tmp, env=env, capture_output=True, text=True, timeout=timeout)


def rows(results: Path) -> list[dict[str, str]]:
    with (results / "raw_summary.csv").open() as f:
        return list(csv.DictReader(f))


def outcomes(results: Path) -> dict[str, dict[str, object]]:
    return {p.parent.name: json.loads(p.read_text()) for p in results.glob("runs/*/outcome.json")}


def no_orphans(results: Path) -> None:
    """No process of the run (launcher, rank, watchdog) is left on any node: none whose
    command line holds the results folder (launcher, ranks) or a task's launch id
    (``ray-<task id>-<attempt>``, in the watchdog's)."""
    marks = [str(results)]
    for path in results.glob("runs/*/ray.json"):
        task_id = json.loads(path.read_text()).get("task_id")
        if task_id:
            marks.append(f"ray-{task_id}")

    def left() -> list[str]:
        return [line for mark in marks for line in processes_mentioning(mark)]

    # a bounded end, generous for a loaded machine (the other workers of tox -e tests)
    deadline = time.monotonic() + 30
    while left() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert left() == []


def start_run(tmp: Path, env: dict[str, str], *extra: str) -> subprocess.Popen[str]:
    out = (tmp / "out.log").open("w")
    return subprocess.Popen(
        run_args(*extra), cwd=tmp, env=env, stdout=out, stderr=subprocess.STDOUT, text=True
    )


def wait_for_steps(
    tmp: Path, proc: subprocess.Popen[str], count: int, seconds: float = 120
) -> None:
    """Until ``count`` runs have trained a step (their progress.json says so)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        stepped = 0
        for path in (tmp / "results" / "runs").glob("*/progress.json"):
            try:
                stepped += json.loads(path.read_text()).get("step", 0) >= 1
            except (OSError, ValueError):
                pass
        if stepped >= count:
            return
        assert proc.poll() is None, (tmp / "out.log").read_text()[-3000:]
        time.sleep(0.3)
    pytest.fail("no run trained a step: " + (tmp / "out.log").read_text()[-3000:])


def ranks(run: Path) -> list[int]:
    """The pids of a run's training ranks (not the launcher)."""
    found = []
    for line in processes_mentioning(str(run / "spec.json")):
        pid, _, cmdline = line.partition(": ")
        if "trainer_entry" in cmdline and "accelerate" not in cmdline:
            found.append(int(pid))
    return found


def test_two_experiments_land_on_different_nodes(tmp_path, cluster) -> None:
    (tmp_path / "scenarios.yaml").write_text(scenarios())
    proc = tunematrix(tmp_path, cluster.env, run_args())
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = tmp_path / "results"
    table = rows(results)
    assert [r["status"] for r in table] == ["ok", "ok"]
    assert {r["executor"] for r in table} == {"ray"}
    records = {}
    for row in table:
        run = results / "runs" / row["experiment_id"]
        # the folder of a local run, and the task's record
        assert {p.name for p in run.iterdir()} >= LOCAL_FILES, sorted(os.listdir(run))
        records[row["experiment_id"]] = json.loads((run / "ray.json").read_text())
        assert row["job_id"] == records[row["experiment_id"]]["task_id"]
        # the task's start and end, both by its node's clock
        record = records[row["experiment_id"]]
        assert record["started_at"] <= record["ended_at"] <= time.time(), record
        assert int(row["tokens_total"]) == 2 * 4 * 64  # 2 steps of 4 x 64 tokens
    # 2 CPUs each, on nodes of 2 CPUs: Ray had to put them on different nodes
    assert len({r["node_id"] for r in records.values()}) == 2, records
    # each alone on its node, and the rows say so
    assert {r["run_mode"] for r in table} == {"alone"}, table
    no_orphans(results)


def test_a_killed_rank_fails_and_a_long_run_times_out(tmp_path, cluster) -> None:
    one = scenarios(max_steps=100_000, rates="[1e-4]")
    # a second scenario, with a time limit of its own
    slow = one.split("scenarios:\n", 1)[1].replace("name: on-ray", "name: slow")
    slow = slow.replace("    device: cpu\n", "    device: cpu\n    timeout_s: 10\n")
    (tmp_path / "scenarios.yaml").write_text(one + slow)
    proc = start_run(tmp_path, cluster.env)
    runs = tmp_path / "results" / "runs"
    try:
        deadline = time.monotonic() + 120
        while not list(runs.glob("on-ray.*/progress.json")) and time.monotonic() < deadline:
            assert proc.poll() is None, (tmp_path / "out.log").read_text()[-3000:]
            time.sleep(0.3)
        (killed_run,) = runs.glob("on-ray.*")
        victim = ranks(killed_run)
        assert len(victim) == 2, victim
        os.kill(victim[-1], signal.SIGKILL)
        code = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code != 0
    found = outcomes(tmp_path / "results")
    (slow_run,) = runs.glob("slow.*")
    killed, timed_out = found[killed_run.name], found[slow_run.name]
    assert killed["status"] == "failed", killed
    assert killed["log"] and str(killed["log"]).endswith("stderr.log"), killed
    assert (tmp_path / "results" / str(killed["log"])).is_file()
    assert timed_out["status"] == "timeout", timed_out
    assert {killed["executor"], timed_out["executor"]} == {"ray"}
    no_orphans(tmp_path / "results")


def test_ctrl_c_cancels_every_task(tmp_path, cluster) -> None:
    (tmp_path / "scenarios.yaml").write_text(
        scenarios(max_steps=100_000, rates="[1e-4, 2e-4, 3e-4]")
    )
    proc = start_run(tmp_path, cluster.env)
    try:
        # two train, the third waits for a node: Ctrl-C must stop both and drop the third
        wait_for_steps(tmp_path, proc, 2)
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 130, (tmp_path / "out.log").read_text()[-3000:]
    table = rows(tmp_path / "results")
    assert len(table) == 3
    assert {r["status"] for r in table} == {"interrupted"}, table
    no_orphans(tmp_path / "results")


def test_a_kernel_oom_kill_on_a_node_is_oom(tmp_path, cluster) -> None:
    # batch 256 x 1024 tokens: the fp32 logits alone (1 GiB, several copies) outgrow 2 GiB
    # the shipped instructions, 20 times: enough 1024-token blocks for a batch of 256
    data = tmp_path / "long.jsonl"
    data.write_text((REPO / "trainer_entry" / "assets" / "instructions.jsonl").read_text() * 20)
    (tmp_path / "scenarios.yaml").write_text(
        scenarios(
            processes=1,
            batch=256,
            seq=1024,
            rates="[1e-4]",
            ray="ray: {resources: {small: 1}}\n",
            more=f"\n      dataset: {data}",
        )
    )
    proc = tunematrix(tmp_path, cluster.env, run_args())
    (row,) = rows(tmp_path / "results")
    assert row["status"] == "oom", proc.stdout[-3000:] + proc.stderr[-3000:]
    (record,) = [json.loads(p.read_text()) for p in (tmp_path / "results").glob("runs/*/ray.json")]
    assert record["node_id"] == cluster.node_ids["small"]
    no_orphans(tmp_path / "results")


def test_a_node_that_dies_fails_its_experiment_naming_it(tmp_path, cluster) -> None:
    (tmp_path / "scenarios.yaml").write_text(
        scenarios(
            processes=1, max_steps=100_000, rates="[1e-4]", ray="ray: {resources: {doomed: 1}}\n"
        )
    )
    (node,) = [n for n in cluster.nodes if n.name == "doomed"]
    proc = start_run(tmp_path, cluster.env)
    try:
        wait_for_steps(tmp_path, proc, 1)
        (run,) = (tmp_path / "results" / "runs").iterdir()
        node_id = json.loads((run / "ray.json").read_text())["node_id"]
        assert node_id == cluster.node_ids["doomed"]
        cluster.kill_node(node)
        code = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code != 0
    (outcome,) = outcomes(tmp_path / "results").values()
    assert outcome["status"] == "failed", outcome
    assert "died" in str(outcome["error"]) and node_id[:12] in str(outcome["error"]), outcome
    # the job outlived its Ray worker: the task's watchdog stopped it
    no_orphans(tmp_path / "results")


def refused(tmp: Path, env: dict[str, str], argv: list[str]) -> str:
    proc = tunematrix(tmp, env, argv, timeout=120)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert not list((tmp / "results").glob("runs/*/outcome.json"))
    return lines[0]


def test_what_cannot_run_is_refused_in_one_line(tmp_path, cluster) -> None:
    (tmp_path / "scenarios.yaml").write_text(scenarios(processes=4))
    line = refused(tmp_path, cluster.env, run_args())
    assert "needs 4 CPUs on one node; the largest node" in line and "has 2" in line
    (tmp_path / "scenarios.yaml").write_text(scenarios())
    (port,) = free_ports(1)
    line = refused(tmp_path, cluster.env, run_args("--ray-address", f"127.0.0.1:{port}"))
    assert f"no Ray cluster at 127.0.0.1:{port}" in line
    # the job-submission address KubeRay's guides export
    line = refused(tmp_path, cluster.env, run_args("--ray-address", "http://127.0.0.1:8265"))
    assert "dashboard" in line and "give its head as HOST:6379" in line
    hidden = {**cluster.env, "PYTHONPATH": pythonpath_hiding(tmp_path / "hide", "ray")}
    line = refused(tmp_path, hidden, run_args())
    assert "pip install 'tunematrix[ray]'" in line


def test_a_node_that_does_not_see_the_results_folder_is_refused(tmp_path, cluster) -> None:
    if os.geteuid() != 0:
        pytest.skip("a node in a mount namespace of its own needs root (unshare -m)")
    private = tmp_path / "private"
    results = private / "results"
    private.mkdir()
    (tmp_path / "scenarios.yaml").write_text(scenarios())
    # this node sees an empty tmpfs where the results folder's parent is
    wrapper = [
        "unshare",
        "-m",
        "--propagation",
        "private",
        "sh",
        "-c",
        'mount -t tmpfs tmpfs "$0" && exec "$@"',
        str(private),
    ]
    node = cluster.add_node("elsewhere", 1, wrapper=wrapper)
    try:
        argv = run_args()
        argv[argv.index("results")] = str(results)
        proc = tunematrix(tmp_path, cluster.env, argv, timeout=180)
    finally:
        cluster.stop_node(node)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    (line,) = [line for line in proc.stderr.splitlines() if line.strip()]
    assert f"the results folder {results} is not visible from a job on Ray node" in line
    assert not list(results.glob("runs/*/outcome.json"))
    assert not list(results.glob(".tunematrix-shared-check-*"))
