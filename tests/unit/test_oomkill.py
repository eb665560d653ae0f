"""Reading the kernel's word on out-of-memory kills: cgroup counters and the kernel log."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from orchestrator.job import oomkill
from orchestrator.job.oomkill import (
    OomWatch,
    memory_cgroups,
    parse_kmsg_kills,
    parse_oom_kill_count,
)


def test_oom_kill_count_from_v1_and_v2_files() -> None:
    assert parse_oom_kill_count("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n") == 3
    assert parse_oom_kill_count("low 0\nhigh 0\nmax 2\noom 1\noom_kill 1\n") == 1
    assert parse_oom_kill_count("oom_kill_disable 0\nunder_oom 0\n") is None


def _cgroup(folder: Path, count: int, name: str = "memory.oom_control") -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(f"oom_kill_disable 0\nunder_oom 0\noom_kill {count}\n")


def test_memory_cgroups_lists_the_job_cgroup_and_its_ancestors(tmp_path) -> None:
    job = tmp_path / "memory" / "slurm" / "uid_0" / "job_12"
    for folder in (tmp_path / "memory", job.parent.parent, job.parent, job):
        _cgroup(folder, 0)
    text = "5:devices:/slurm\n4:memory:/slurm/uid_0/job_12\n0::/\n"
    assert memory_cgroups(text, root=tmp_path) == [
        job,
        job.parent,
        job.parent.parent,
        tmp_path / "memory",
    ]
    # cgroup v2: the unified hierarchy at the root
    (tmp_path / "v2").mkdir()
    (tmp_path / "v2" / "cgroup.controllers").write_text("memory pids\n")
    (tmp_path / "v2" / "job").mkdir()
    assert memory_cgroups("0::/job\n", root=tmp_path / "v2") == [
        tmp_path / "v2" / "job",
        tmp_path / "v2",
    ]


def test_a_counter_that_went_up_is_evidence(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(oomkill, "_kmsg_records", list)  # no kernel log readable
    job = tmp_path / "job"
    _cgroup(job, 2)
    started = OomWatch(counters={job: 2}, since_us=0)
    assert oomkill.evidence(started, {123}) == oomkill.OomEvidence(found=None, checked=True)
    _cgroup(job, 3)
    found = oomkill.evidence(started, {123})
    assert found.found == f"memory cgroup {job}: oom_kill 2 → 3"
    nothing = oomkill.evidence(OomWatch(since_us=0), {123})
    assert nothing == oomkill.OomEvidence(found=None, checked=False)


KMSG = [
    "6,1200,1000000,-;Memory cgroup out of memory: Killed process 111 (python3) total-vm:1kB\n",
    "6,1201,5000000,-;oom-kill:constraint=CONSTRAINT_MEMCG,task=python3,pid=222\n",
    "6,1202,5000001,-;Memory cgroup out of memory: Killed process 222 (python3) total-vm:3157736kB, anon-rss:1170412kB\n",
    "garbage without a header\n",
]


def test_kernel_log_kills_after_the_launch_only() -> None:
    kills = parse_kmsg_kills(KMSG, since_us=2_000_000)
    assert kills == {222: "Memory cgroup out of memory: Killed process 222 (python3)"}


def test_a_kernel_kill_of_a_job_pid_is_evidence(monkeypatch) -> None:
    monkeypatch.setattr(oomkill, "_kmsg_records", lambda: KMSG)
    started = OomWatch(since_us=3_000_000)
    assert oomkill.evidence(started, {222}).found == (
        "kernel: Memory cgroup out of memory: Killed process 222 (python3)"
    )
    # another process's kill says nothing about this job
    assert oomkill.evidence(started, {333}) == oomkill.OomEvidence(found=None, checked=True)


def test_watch_reads_this_machines_cgroups() -> None:
    if not Path("/proc/self/cgroup").exists():
        pytest.skip("no /proc/self/cgroup: not Linux")
    started = oomkill.watch()
    assert started.since_us > 0
    for folder, count in started.counters.items():
        assert folder.is_dir() and count >= 0


def test_every_node_of_a_launch_shares_one_id(tmp_path, monkeypatch) -> None:
    """Node 1's rank, stopped after node 0's OOM, must not replace node 0's report."""
    from orchestrator.contract.spec import RunSpec
    from trainer_entry.results.failure import write_failure

    spec = RunSpec(
        experiment_id="e",
        cell_id="e",
        result_path=str(tmp_path / "result.json"),
        output_dir=str(tmp_path),
        data_dir=str(tmp_path),
        arguments={"model_name_or_path": "tiny-llama"},
    )
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("TUNEMATRIX_LAUNCH_ID", "slurm-77-0-1")
    monkeypatch.setattr(os, "getppid", lambda: 1000)  # node 0's launcher
    write_failure(spec, "oom", MemoryError("host"), {})
    monkeypatch.setattr(os, "getppid", lambda: 2000)  # node 1's launcher
    write_failure(spec, "interrupted", KeyboardInterrupt(), {})
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["status"] == "oom" and result["launch_id"] == "slurm-77-0-1"
    # a later launch replaces an earlier launch's failure
    monkeypatch.setenv("TUNEMATRIX_LAUNCH_ID", "slurm-77-0-2")
    write_failure(spec, "interrupted", KeyboardInterrupt(), {})
    assert json.loads((tmp_path / "result.json").read_text())["status"] == "interrupted"
