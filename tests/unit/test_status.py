"""Statuses from what a run left behind: result first, exit code and stderr as evidence."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from orchestrator.job.classify import (
    UNEXPLAINED,
    RankDeath,
    classify,
    root_cause,
    sigkilled_pids,
    stderr_error,
)

OK = {"status": "ok", "metrics": {}}


def test_ok_needs_both_a_result_and_exit_zero() -> None:
    assert classify(returncode=0, result=OK).status == "ok"
    late = classify(returncode=1, result=OK, stderr_tail="RuntimeError: gloo teardown\n")
    assert late.status == "failed"
    assert (
        late.error
        == "exit code 1 after writing a complete result; see stderr.log (RuntimeError: gloo teardown)"
    )


def test_exit_zero_without_a_result_is_failed() -> None:
    outcome = classify(returncode=0, result=None)
    assert outcome.status == "failed" and outcome.error == "exited 0 without writing a result"


def test_the_childs_own_report_wins() -> None:
    assert classify(returncode=1, result={"status": "oom", "error": "CUDA OOM"}).status == "oom"
    failed = classify(
        returncode=1, result={"status": "failed", "error": "dataset file not found: x"}
    )
    assert (failed.status, failed.error) == ("failed", "dataset file not found: x")


CUDA_OOM = """\
[rank1]: Traceback (most recent call last):
[rank1]:   File "train.py", line 10, in <module>
[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 1 has a total capacity of 79.10 GiB
E1122 12:00:00 torch/distributed/elastic/multiprocessing/api.py:882] failed (exitcode: 1)
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
"""


def test_oom_from_stderr_when_no_result() -> None:
    outcome = classify(returncode=1, result=None, stderr_tail=CUDA_OOM)
    assert outcome.status == "oom"
    assert outcome.error is not None and outcome.error.startswith(
        "torch.OutOfMemoryError: CUDA out of memory."
    )


FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
#: torchrun's report after the kernel's OOM killer ended rank 0 of a 2-rank job
#: under a cgroup memory limit (captured from a real run); rank 1 was SIGTERMed
RANK_KILLED = (FIXTURES / "stderr_rank_sigkilled.txt").read_text()
#: accelerate's one-process launcher after the same, one process
SINGLE_KILLED = (FIXTURES / "stderr_single_sigkilled.txt").read_text()
#: what the rank the launcher stopped writes
STOPPED_BY_LAUNCHER = {"status": "interrupted", "error": "Terminated: stopped by SIGTERM"}
KERNEL = "kernel: Memory cgroup out of memory: Killed process 4041 (python3)"


def test_root_cause_of_the_launchers() -> None:
    assert root_cause(RANK_KILLED) == RankDeath(exitcode=-9, rank=0, pid=4041)
    assert root_cause(SINGLE_KILLED) == RankDeath(exitcode=-9)
    assert sigkilled_pids(RANK_KILLED) == {4041}
    assert root_cause("ValueError: no launcher here\n") is None


def test_a_host_oom_kill_is_oom_although_the_other_rank_says_interrupted() -> None:
    outcome = classify(
        returncode=1,
        result=STOPPED_BY_LAUNCHER,
        stderr_tail=RANK_KILLED,
        host_oom=KERNEL,
        host_oom_checked=True,
    )
    assert outcome.status == "oom"
    assert outcome.error == (
        f"host memory: rank 0 (pid 4041) was killed by the kernel's out-of-memory killer ({KERNEL})"
    )
    single = classify(
        returncode=1, result=None, stderr_tail=SINGLE_KILLED, host_oom=KERNEL, host_oom_checked=True
    )
    assert single.status == "oom" and single.error is not None
    assert single.error.startswith("host memory: the training process was killed")


def test_a_sigkill_the_kernel_did_not_report_is_failed() -> None:
    # e.g. a user's kill -9 of one rank: the launcher's report is the same,
    # but no OOM kill was counted, so it is not called out of memory
    outcome = classify(
        returncode=1, result=STOPPED_BY_LAUNCHER, stderr_tail=RANK_KILLED, host_oom_checked=True
    )
    assert outcome == outcome.__class__(
        "failed",
        "rank 0 (pid 4041) was killed by SIGKILL, not by the out-of-memory killer "
        "(no OOM kill in the job's memory cgroups or the kernel log)",
        UNEXPLAINED,  # what killed it is not known: it stands for no other cell's failure
    )
    unknown = classify(returncode=-signal.SIGKILL, result=None)
    assert unknown.status == "failed"
    assert unknown.error == (
        "the job's launcher was killed by SIGKILL; whether by the out-of-memory killer is "
        "unknown (neither the memory cgroup counters nor the kernel log could be read)"
    )
    for code in (-signal.SIGKILL, 137):
        launcher = classify(returncode=code, result=None, host_oom=KERNEL, host_oom_checked=True)
        assert launcher.status == "oom"


def test_the_childs_interrupted_is_believed_only_when_the_parent_stopped_it() -> None:
    stopped = classify(returncode=143, result=STOPPED_BY_LAUNCHER, interrupted=True)
    assert stopped.status == "interrupted"
    peer_crashed = "[rank1]: ValueError: bad batch\n" + RANK_KILLED.replace(
        "exitcode  : -9 (pid: 4041)  (SIGKILL)", "exitcode  : 1 (pid: 4041)"
    ).replace("Signal 9 (SIGKILL) received by PID 4041", "")
    outcome = classify(returncode=1, result=STOPPED_BY_LAUNCHER, stderr_tail=peer_crashed)
    assert outcome == outcome.__class__("failed", "exit code 1: ValueError: bad batch")
    segv = RANK_KILLED.replace("exitcode  : -9", "exitcode  : -11")
    crashed = classify(returncode=1, result=STOPPED_BY_LAUNCHER, stderr_tail=segv)
    assert crashed == crashed.__class__("failed", "rank 0 (pid 4041) was killed by SIGSEGV")


@pytest.mark.parametrize(
    "message",
    [
        "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
        "CUDA error: out of memory",
        "CUDA out of memory. Tried to allocate 2.00 GiB",
    ],
)
def test_child_and_parent_agree_on_what_is_out_of_memory(message: str) -> None:
    from trainer_entry.measure.memory import is_oom as _is_oom

    assert _is_oom(RuntimeError(message))
    assert (
        classify(returncode=1, result=None, stderr_tail=f"RuntimeError: {message}\n").status
        == "oom"
    )
    assert not _is_oom(RuntimeError("CUDA error: device-side assert triggered"))


def test_other_signal() -> None:
    assert classify(returncode=-signal.SIGSEGV, result=None).error == "killed by SIGSEGV"


def test_failure_line_from_stderr() -> None:
    tail = "some log\nValueError: bad thing happened\nmore noise\n"
    outcome = classify(returncode=2, result=None, stderr_tail=tail)
    assert outcome == outcome.__class__("failed", "exit code 2: ValueError: bad thing happened")
    assert classify(returncode=3, result=None).error == "exit code 3 and no error output"


def test_timeout_and_interrupt_take_precedence() -> None:
    assert classify(returncode=-15, result=OK, timed_out=True, timeout_s=60).status == "timeout"
    assert "60 s" in (
        classify(returncode=None, result=None, timed_out=True, timeout_s=60).error or ""
    )
    assert classify(returncode=-15, result=None, interrupted=True).status == "interrupted"


@pytest.mark.parametrize(
    ("tail", "line"),
    [
        ("[rank0]: KeyError: 'x'\nChildFailedError\n", "KeyError: 'x'"),
        ("trainer_entry: error: model 'm' could not be loaded\n", "model 'm' could not be loaded"),
        ("just text\n", "just text"),
        ("", None),
    ],
)
def test_stderr_error(tail: str, line: str | None) -> None:
    assert stderr_error(tail) == line
