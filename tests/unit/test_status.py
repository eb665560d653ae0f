"""Statuses from what a run left behind: result first, exit code and stderr as evidence."""

from __future__ import annotations

import signal

import pytest

from orchestrator.status import classify, stderr_error

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


def test_sigkill_without_result_is_oom() -> None:
    for code in (-signal.SIGKILL, 137):
        outcome = classify(returncode=code, result=None)
        assert outcome.status == "oom" and "signal 9" in (outcome.error or "")


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
