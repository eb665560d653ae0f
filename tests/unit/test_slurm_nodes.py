"""Multi-node SLURM logic that needs no cluster: how a CPU experiment splits over nodes, the
merge of the nodes' verdicts into the run's outcome, and the shared-folder check's decision.

The real thing (two slurmd in network namespaces, gloo between them, the faults)
is tests/e2e/test_slurm_multinode.py.
"""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from orchestrator.contract.errors import UserError
from orchestrator.contract.layout import ResultsLayout
from orchestrator.contract.outcome import Outcome, read_outcome, write_outcome
from orchestrator.executors.base import Preflight
from orchestrator.executors.slurm import SlurmSettings, final_outcome, shape
from orchestrator.executors.slurm.cluster import check_cluster, cpu_nodes
from orchestrator.executors.slurm.visible import answer, check_argv, check_shared
from orchestrator.job import nodes
from orchestrator.job.execute import RunOptions

CPU = """\
scenarios:
  - name: small
    device: cpu
    num_gpus: [{p}]
    arguments:
      model_name_or_path: tiny-llama
"""


def cpu_experiment(plan, processes: int):
    (experiment,) = plan(
        CPU.format(p=processes), device="cpu", num_gpus=[processes], effective_batch_size=[12]
    ).experiments
    return experiment


@pytest.mark.parametrize(
    ("processes", "cpus", "count"),
    [
        (2, None, 1),  # not known: one node, as before
        (2, 2, 1),
        (2, 1, 2),  # one process per node
        (4, 2, 2),
        (3, 2, 3),  # 2 nodes cannot split 3 evenly: 3 nodes of 1
        (6, 4, 2),
        (4, 3, 2),  # 2 nodes of 2 (a node has 3)
        (5, 4, 5),
    ],
)
def test_a_cpu_experiment_spans_the_fewest_nodes_that_split_it_evenly(
    processes: int, cpus: int | None, count: int
) -> None:
    assert cpu_nodes(processes, cpus) == count


def test_shape_of_a_cpu_job_over_nodes_has_one_task_per_node(plan) -> None:
    experiment = cpu_experiment(plan, 4)
    assert shape(experiment, SlurmSettings(), 0, cpus_per_node=8) == (1, None, 4)
    assert shape(experiment, SlurmSettings(), 0, cpus_per_node=2) == (2, None, 2)
    assert shape(experiment, SlurmSettings(cpus_per_task=3), 0, cpus_per_node=2) == (2, None, 3)


def _sinfo(folder: Path, cpus: list[int]) -> None:
    """A fake sinfo answering for nodes of ``cpus`` CPUs (the real one: the e2e tests)."""
    lines = "\\n".join(f"n{i} {c} (null)" for i, c in enumerate(cpus))
    script = (
        '#!/bin/sh\ncase "$*" in\n'
        '  *"%P %l"*) echo "debug* infinite";;\n'
        f'  *) printf "{lines}\\n";;\nesac\n'
    )
    path = folder / "sinfo"
    path.write_text(script)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    (folder / "sbatch").write_text("#!/bin/sh\nexit 0\n")
    (folder / "sbatch").chmod(0o755)


def _check(tmp_path: Path, experiment, cpus: list[int]) -> None:
    _sinfo(tmp_path, cpus)
    preflight = Preflight([experiment], ResultsLayout(tmp_path / "results"), RunOptions())
    check_cluster(preflight, SlurmSettings())


def test_a_cpu_experiment_that_cannot_be_split_over_the_nodes_is_refused(
    tmp_path, plan, monkeypatch
) -> None:
    pytest.importorskip("submitit")
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    # 3 processes on two 2-CPU nodes: 3 nodes of 1 would split them, there are 2
    with pytest.raises(UserError, match=r"need 3 nodes of 1 CPUs to split evenly; .* has 2$"):
        _check(tmp_path, cpu_experiment(plan, 3), [2, 2])
    # 2 processes on two 1-CPU nodes fit: one per node
    _check(tmp_path, cpu_experiment(plan, 2), [1, 1])


def outcome(status: str, error: str | None = None, log: str = "runs/x/stderr.log") -> Outcome:
    return Outcome(status=status, error=error, log=log, wall_s=12.0)  # type: ignore[arg-type]


NODE1_LOG = "runs/x/stderr.node1.log"
PEER_GONE = "exit code 1: RuntimeError: Connection closed by peer [10.0.0.12]:33995"
KILLED = "rank 1 (pid 9) was killed by SIGKILL, not by the out-of-memory killer (...)"
OOM = "host memory: rank 1 (pid 9) was killed by the kernel's out-of-memory killer (...)"


def test_node1s_own_death_explains_node0s_peer_failure() -> None:
    merged = nodes.merge(outcome("failed", PEER_GONE), {1: outcome("failed", KILLED, NODE1_LOG)})
    assert merged.status == "failed"
    assert merged.error == f"node 1 ({NODE1_LOG}): {KILLED}"
    assert merged.log == NODE1_LOG
    assert merged.wall_s == 12.0  # node 0's figures stay
    oom = nodes.merge(outcome("failed", PEER_GONE), {1: outcome("oom", OOM, NODE1_LOG)})
    assert (oom.status, oom.log) == ("oom", NODE1_LOG)
    # node 0 waited for the dead peer until its time limit: still the peer's failure
    late = nodes.merge(outcome("timeout", "exceeded"), {1: outcome("oom", OOM, NODE1_LOG)})
    assert late.status == "oom"


@pytest.mark.parametrize(
    ("primary", "node1"),
    [
        (outcome("ok"), outcome("ok", log=NODE1_LOG)),
        # node 0's own rank died first: it is the root cause
        (outcome("failed", KILLED), outcome("failed", PEER_GONE, NODE1_LOG)),
        (outcome("oom", OOM), outcome("oom", OOM, NODE1_LOG)),
        # node 1 only lost its peer, or stopped with everyone
        (outcome("failed", PEER_GONE), outcome("failed", PEER_GONE, NODE1_LOG)),
        (outcome("timeout", "exceeded"), outcome("timeout", "exceeded", NODE1_LOG)),
        (outcome("interrupted", "Ctrl-C"), outcome("failed", KILLED, NODE1_LOG)),
    ],
)
def test_node0s_verdict_stands_where_no_other_node_died_first(
    primary: Outcome, node1: Outcome
) -> None:
    assert nodes.merge(primary, {1: node1}) == primary


def test_the_lowest_node_that_died_first_explains_the_run() -> None:
    merged = nodes.merge(
        outcome("failed", PEER_GONE),
        {
            3: outcome("oom", OOM, "runs/x/stderr.node3.log"),
            1: outcome("failed", PEER_GONE, NODE1_LOG),
            2: outcome("failed", KILLED, "runs/x/stderr.node2.log"),
        },
    )
    assert merged.status == "failed" and merged.log == "runs/x/stderr.node2.log"


def test_collecting_a_job_merges_the_node_verdicts_on_disk(tmp_path) -> None:
    layout = ResultsLayout(tmp_path)
    run = layout.run("x")
    run.dir.mkdir(parents=True)
    write_outcome(run, outcome("failed", PEER_GONE))
    nodes.write_node_outcome(run, 1, outcome("oom", OOM, NODE1_LOG))
    (run.dir / "outcome.node1.json.tmp").write_text("not a verdict")
    assert set(nodes.read_node_outcomes(run)) == {1}
    final = final_outcome(run, layout, "7", "COMPLETED")
    assert (final.status, final.log, final.job_id) == ("oom", NODE1_LOG, "7")
    assert read_outcome(run) == final
    nodes.clear_node_outcomes(run)
    assert nodes.read_node_outcomes(run) == {}


def test_the_shared_check_passes_values_as_arguments_never_through_a_shell() -> None:
    path = "/shared/it's $(rm -rf ~)/.tunematrix-shared-check-x"
    argv = check_argv(SlurmSettings(partition="debug"), path, "c0ffee")
    assert argv[0] == "srun" and "--partition=debug" in argv
    assert any(a.startswith("--immediate=") for a in argv)
    assert argv[-3:][1:] == [path, "c0ffee"]
    assert path not in argv[argv.index("-c") + 1]  # the code is ours alone
    assert answer("noise\ntunematrix-shared seen n1\n") == (True, "n1")
    assert answer("tunematrix-shared unseen n2") == (False, "n2")
    assert answer("srun: error: Unable to allocate resources") is None
    # the jobs' own sbatch options go to the check's step too, before the command
    options = check_argv(SlurmSettings(options={"qos": "high", "reservation": "r1"}), path, "c")
    assert options.index("--qos=high") < options.index("--")
    assert "--reservation=r1" in options


def _srun(folder: Path, script: str) -> None:
    path = folder / "srun"
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(0o755)


def test_the_shared_check_refuses_an_unseen_folder_and_skips_a_busy_cluster(
    tmp_path, monkeypatch
) -> None:
    # fake sruns for the decision alone; the real check runs in the e2e tests
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    said: list[str] = []
    _srun(bin_dir, "echo 'tunematrix-shared unseen node7'\n")
    with pytest.raises(UserError, match="is not visible from a job on node7"):
        check_shared(tmp_path / "results", SlurmSettings(), said.append)
    _srun(
        bin_dir,
        "echo 'srun: error: Unable to allocate resources: Requested nodes are busy' >&2; exit 1\n",
    )
    check_shared(tmp_path / "results", SlurmSettings(), said.append)
    assert len(said) == 1 and "Requested nodes are busy); skipped" in said[0]
    _srun(bin_dir, "echo 'tunematrix-shared seen node7'\n")
    check_shared(tmp_path / "results", SlurmSettings(), said.append)
    assert len(said) == 1
    # the token is gone after each check
    assert not list((tmp_path / "results").glob(".tunematrix-shared-check-*"))


def test_report_after_no_wait_merges_the_node_verdicts_once_the_job_ended(
    tmp_path, monkeypatch
) -> None:
    from orchestrator.executors.slurm.jobs import record_submission, settle

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    squeue = bin_dir / "squeue"
    # a fake squeue for the pure decision; the real one is used end to end
    squeue.write_text('#!/bin/sh\necho "7 $(cat "$0.state")"\n')
    squeue.chmod(0o755)
    (bin_dir / "squeue.state").write_text("RUNNING\n")
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    layout = ResultsLayout(tmp_path / "results")
    run = layout.run("x")
    run.dir.mkdir(parents=True)
    record_submission(run, "7", array=False)
    # node 0 wrote its outcome as its part ended; node 1 is still stopping its rank
    write_outcome(run, outcome("failed", PEER_GONE))
    assert settle(layout) == (0, ["7"])
    nodes.write_node_outcome(run, 1, outcome("oom", OOM, NODE1_LOG))
    (bin_dir / "squeue.state").write_text("COMPLETED\n")
    assert settle(layout) == (1, [])
    final = read_outcome(run)
    assert final is not None and (final.status, final.log) == ("oom", NODE1_LOG)
    # collected once: a later report leaves it alone
    assert settle(layout) == (0, [])


def test_memory_peaks_are_the_largest_over_the_nodes() -> None:
    node0 = Outcome(
        status="ok",
        memory={
            "mem_tree_peak_rss_bytes": 100,
            "mem_tree_peak_measure": "pss",
            "mem_nvidia_peak_bytes_per_device": {"0": 10, "1": 30},
            "mem_nvidia_peak_bytes_max": 30,
            "mem_nvidia_peak_bytes_mean": 20,
            "mem_sidecar_samples": 5,
            "cpu_util_mean_pct": 50.0,
        },
    )
    node1 = Outcome(
        status="ok",
        memory={
            "mem_tree_peak_rss_bytes": 300,
            "mem_tree_peak_measure": "rss",
            "mem_nvidia_peak_bytes_per_device": {"0": 50, "1": 10},
            "mem_nvidia_peak_bytes_max": 50,
            "mem_sidecar_samples": 4,
            "cpu_util_mean_pct": 90.0,
        },
    )
    merged = nodes.merge(node0, {1: node1})
    assert merged.status == "ok"
    memory = merged.memory
    assert memory["mem_tree_peak_rss_bytes"] == 300  # node 1's tree was the fuller one
    assert memory["mem_nvidia_peak_bytes_max"] == 50
    assert memory["mem_nvidia_peak_bytes_per_device"] == {
        "0": 10,
        "1": 30,
        "node1:0": 50,
        "node1:1": 10,
    }
    assert memory["mem_nvidia_peak_bytes_mean"] == 25  # over all four GPUs
    assert memory["mem_sidecar_samples"] == 9
    # how it was measured and the utilisation stay node 0's
    assert memory["mem_tree_peak_measure"] == "pss" and memory["cpu_util_mean_pct"] == 50.0
    assert node0.memory["mem_tree_peak_rss_bytes"] == 100  # the input is left as it was


def test_exclusive_nodes_from_the_flag_or_the_file(tmp_path, plan) -> None:
    import argparse

    from submitit.slurm.slurm import _make_sbatch_string

    from orchestrator.executors.slurm.settings import SlurmModel, settings_from
    from orchestrator.executors.slurm.submit import sbatch_parameters

    def args(*flags: str) -> argparse.Namespace:
        values = {
            "slurm_option": [],
            "slurm_time": None,
            "slurm_partition": None,
            "slurm_account": None,
            "slurm_gpus_per_node": None,
            "slurm_cpus_per_task": None,
            "slurm_mem": None,
            "array": False,
            "array_parallelism": None,
            "no_wait": False,
            "slurm_exclusive": "--slurm-exclusive" in flags,
        }
        return argparse.Namespace(**values)

    assert not settings_from(args(), None).exclusive
    assert settings_from(args("--slurm-exclusive"), None).exclusive
    assert settings_from(args(), SlurmModel(exclusive=True)).exclusive
    experiment = cpu_experiment(plan, 2)
    # the parameters and the script submitit writes from them, without SLURM here
    params = sbatch_parameters(
        settings_from(args("--slurm-exclusive"), None), experiment, (1, None, 2), 5
    )
    assert params["exclusive"] is True
    script = _make_sbatch_string(command="true", folder=str(tmp_path), **params)
    assert "#SBATCH --exclusive\n" in script
    # no USR2 before the limit: a benchmark is not resumable, and under a short
    # limit the signal came before the task could ignore it
    assert "#SBATCH --signal=USR2@0\n" in script
    plain = sbatch_parameters(settings_from(args(), None), experiment, (1, None, 2), 5)
    assert "exclusive" not in plain
