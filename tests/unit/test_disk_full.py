"""A full disk: a failure whose evidence shows ENOSPC reads as ``disk full: <folder> has
<free> free (…)``, stays ``failed``, and spares every later experiment of the run (with
``stop_early``). The stderr wordings are those of the installed packages on a full tmpfs
(torch 2.13, safetensors 0.8)."""

from __future__ import annotations

import errno
import io
import os
from pathlib import Path

import pytest

from orchestrator.contract.layout import ResultsLayout
from orchestrator.contract.outcome import (
    Failure,
    Outcome,
    Skip,
    is_not_launched,
    never_launched,
    read_outcome,
    shown,
    skip_from_error,
    write_outcome,
)
from orchestrator.executors.base import RunContext
from orchestrator.executors.console import Progress
from orchestrator.job import classify as classify_module
from orchestrator.job.classify import (
    Verdict,
    classify,
    disk_full_cause,
    free_bytes,
    human_bytes,
    write_failure,
)
from orchestrator.job.execute import RunOptions

PYTHON = """\
Traceback (most recent call last):
  File "trainer_entry/__main__.py", line 90, in main
OSError: [Errno 28] No space left on device
"""
TORCH_SAVE = """\
[rank0]:   File "torch/serialization.py", line 967, in save
[rank0]: RuntimeError: [enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534
"""
TORCH_WRITER = "RuntimeError: PytorchStreamWriter failed writing file data/0: file write failed\n"
TORCH_LEGACY = "RuntimeError: write(): fd 3 failed with No space left on device\n"
SAFETENSORS = (
    "safetensors_rust.SafetensorError: Error while serializing: "
    "I/O error: No space left on device (os error 28)\n"
)
SAFETENSORS_OLD = (
    "safetensors_rust.SafetensorError: Error while serializing: IoError(Os { code: 28, "
    'kind: StorageFull, message: "No space left on device" })\n'
)
SHARED_MEMORY = (
    "RuntimeError: unable to write to file </torch_4242_1234_0>: No space left on device (28)\n"
)


@pytest.fixture
def free_312k(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(classify_module, "free_bytes", lambda folder: 312 * 1024)


@pytest.mark.parametrize(
    ("tail", "cause"),
    [
        (PYTHON, "No space left on device"),
        (TORCH_LEGACY, "No space left on device"),
        (SAFETENSORS, "No space left on device"),
        (SAFETENSORS_OLD, "No space left on device"),
        (TORCH_SAVE, "torch.save: unexpected pos 576 vs 534"),
        (TORCH_WRITER, "torch.save: PytorchStreamWriter failed writing file data/0: file write failed"),
    ],
)  # fmt: skip
def test_a_stderr_that_shows_a_full_disk_names_the_folder_and_its_free_space(
    tail: str, cause: str, tmp_path: Path, free_312k: None
) -> None:
    verdict = classify(returncode=1, result=None, stderr_tail=tail, folder=tmp_path)
    assert verdict.status == "failed"
    assert verdict.error == f"disk full: {tmp_path} has 312 KiB free ({cause})"
    assert verdict.failure == Failure(cause="disk_full", folder=str(tmp_path))


def test_the_childs_own_report_of_a_full_disk(tmp_path: Path, free_312k: None) -> None:
    result = {"status": "failed", "error": "OSError: [Errno 28] No space left on device"}
    verdict = classify(returncode=1, result=result, folder=tmp_path)
    assert verdict == Verdict(
        "failed",
        f"disk full: {tmp_path} has 312 KiB free (No space left on device)",
        Failure(cause="disk_full", folder=str(tmp_path)),
    )
    # a complete result, then a failed write: still the disk
    late = classify(returncode=1, result={"status": "ok"}, stderr_tail=PYTHON, folder=tmp_path)
    assert late.error is not None and late.error.startswith(f"disk full: {tmp_path} has")


def test_the_folder_a_failed_write_names_and_torchs_shared_memory(
    tmp_path: Path, free_312k: None
) -> None:
    output = tmp_path / "trainer_output"
    output.mkdir()
    named = f"OSError: [Errno 28] No space left on device: '{output}/checkpoint-5/model.bin'\n"
    verdict = classify(returncode=1, result=None, stderr_tail=named, folder=tmp_path)
    assert (
        verdict.error
        == f"disk full: {output}/checkpoint-5 has 312 KiB free (No space left on device)"
    )
    shm = classify(returncode=1, result=None, stderr_tail=SHARED_MEMORY, folder=tmp_path)
    assert shm.error == "disk full: /dev/shm has 312 KiB free (No space left on device)"


def test_other_evidence_and_other_statuses_are_left_alone(tmp_path: Path) -> None:
    assert disk_full_cause("ValueError: bad data\nunexpected pos 1 vs 2") is None
    plain = classify(
        returncode=1, result=None, stderr_tail="ValueError: bad data\n", folder=tmp_path
    )
    assert plain.error == "exit code 1: ValueError: bad data"
    # the child's own error wins over a stray line of its stderr
    failed = {"status": "failed", "error": "dataset file not found: x"}
    assert (
        classify(returncode=1, result=failed, stderr_tail=PYTHON).error
        == "dataset file not found: x"
    )
    oom = {"status": "oom", "error": "CUDA out of memory; No space left on device"}
    assert classify(returncode=1, result=oom, folder=tmp_path).status == "oom"
    assert (
        classify(returncode=None, result=None, stderr_tail=PYTHON, timed_out=True).status
        == "timeout"
    )
    assert classify(returncode=0, result={"status": "ok"}, stderr_tail=PYTHON).status == "ok"
    # a silent failure on a disk with room is not the disk's
    assert (
        classify(returncode=1, result=None, folder=tmp_path).error
        == "exit code 1 and no error output"
    )


def test_a_silent_failure_on_a_disk_with_nothing_free(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(classify_module, "free_bytes", lambda folder: 0)
    verdict = classify(returncode=1, result=None, folder=tmp_path)
    assert verdict.error == f"disk full: {tmp_path} has 0 B free (exit code 1 and no error output)"
    assert verdict.failure == Failure(cause="disk_full", folder=str(tmp_path))


def test_without_a_folder_the_error_still_says_disk_full() -> None:
    verdict = classify(returncode=1, result=None, stderr_tail=PYTHON)
    assert verdict.error == "disk full (No space left on device)"
    assert verdict.failure == Failure(cause="disk_full", folder=None)


def test_free_bytes_and_human_sizes(tmp_path: Path) -> None:
    stat = os.statvfs(tmp_path)
    assert free_bytes(tmp_path / "not" / "made") == pytest.approx(
        stat.f_bavail * stat.f_frsize, rel=0.01
    )
    sizes = [0, 1023, 1024, 312 * 1024, int(1.5 * 2**30), 123 * 2**30]
    assert [human_bytes(n) for n in sizes] == [
        "0 B",
        "1023 B",
        "1.0 KiB",
        "312 KiB",
        "1.5 GiB",
        "123 GiB",
    ]


def test_an_orchestrator_write_that_found_the_disk_full(tmp_path: Path, free_312k: None) -> None:
    spec = tmp_path / "runs" / "a" / "spec.json"
    full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(spec))
    verdict = write_failure(full, tmp_path / "runs" / "a")
    assert verdict == Verdict(
        "failed",
        f"disk full: {spec.parent} has 312 KiB free (No space left on device)",
        Failure(cause="disk_full", folder=str(spec.parent)),
    )
    unnamed = write_failure(OSError(errno.ENOSPC, "No space left on device"), tmp_path)
    assert (
        unnamed is not None
        and unnamed.error == f"disk full: {tmp_path} has 312 KiB free (No space left on device)"
    )
    assert write_failure(OSError(errno.EACCES, "Permission denied"), tmp_path) is None


# -- stopping early ----------------------------------------------------------------

TWO_MODELS = """
matrix:
  effective_batch_size: [1, 2, 4]
scenarios:
  - name: s
    device: cpu
    arguments: {model_name_or_path: tiny-llama}
  - name: t
    device: cpu
    arguments: {model_name_or_path: config:llama-3.2-1b}
"""


def _context(
    tmp_path: Path, plan, say=lambda line: None, on_record=None, **options: object
) -> RunContext:  # type: ignore[no-untyped-def]
    extra = {"on_record": on_record} if on_record is not None else {}
    return RunContext(
        plan,
        ResultsLayout(tmp_path),
        RunOptions(**options),  # type: ignore[arg-type]
        Progress(len(plan.experiments), stream=io.StringIO()),
        say=say,
        **extra,
    )


def _full(folder: Path) -> Outcome:
    """A failure for a full disk, as the run's classification records it."""
    verdict = write_failure(OSError(errno.ENOSPC, "No space left on device"), folder)
    assert verdict is not None and verdict.error is not None
    assert verdict.error.startswith(f"disk full: {folder} has ")
    return Outcome(status=verdict.status, error=verdict.error, failure=verdict.failure)


def test_one_disk_full_failure_spares_every_later_experiment(tmp_path: Path, plan) -> None:  # type: ignore[no-untyped-def]
    the_plan = plan(TWO_MODELS, num_gpus=(1,), device="cpu")
    first, *rest = the_plan.experiments
    ctx = _context(tmp_path, the_plan)
    folder = ResultsLayout(tmp_path).run(first.experiment_id).dir
    ctx.record(first.experiment_id, _full(folder))
    assert {e.model_name_or_path for e in rest} == {"tiny-llama", "config:llama-3.2-1b"}
    for experiment in rest:
        assert ctx.prepare(experiment) is None
        outcome = ctx.outcomes[experiment.experiment_id]
        assert outcome.status == "skipped"
        assert outcome.error == (
            f"not launched: the disk of {folder} was full when {first.experiment_id} ran (see its row)"
        )
        assert is_not_launched(outcome.status, outcome.error) and never_launched(
            outcome.status, outcome.error
        )
        assert shown(outcome.status, outcome.error) == "spared"
        assert skip_from_error(outcome.error).follows == first.experiment_id
        assert read_outcome(ResultsLayout(tmp_path).run(experiment.experiment_id)) == outcome
    assert ctx.outcomes[first.experiment_id].status == "failed"


def test_no_stop_early_keeps_launching_on_a_full_disk(tmp_path: Path, plan) -> None:  # type: ignore[no-untyped-def]
    the_plan = plan(TWO_MODELS, num_gpus=(1,), device="cpu")
    first, second, third, *_ = the_plan.experiments
    ctx = _context(tmp_path, the_plan, stop_early=False)
    ctx.record(first.experiment_id, _full(tmp_path))
    ctx.record(second.experiment_id, _full(tmp_path))
    assert ctx.prepare(third) is not None


def test_a_resumed_run_decides_afresh_after_a_full_disk(tmp_path: Path, plan) -> None:  # type: ignore[no-untyped-def]
    the_plan = plan(TWO_MODELS, num_gpus=(1,), device="cpu")
    experiment = the_plan.experiments[1]
    run = ResultsLayout(tmp_path).run(experiment.experiment_id)
    run.dir.mkdir(parents=True)
    write_outcome(
        run,
        Outcome(
            status="skipped", error=Skip(cause="disk_full", follows="s.earlier", detail="/r").error
        ),
    )
    ready = _context(tmp_path, the_plan, resume=True).prepare(experiment)
    assert ready is not None and not run.outcome.exists()


def test_the_disk_full_stays_in_this_runs_record_when_nothing_can_be_written(
    tmp_path: Path,
    plan,
    monkeypatch: pytest.MonkeyPatch,  # type: ignore[no-untyped-def]
) -> None:
    """outcome.json and the summary cannot be written either: the run says so once and
    goes on, sparing the rest in its own record."""
    from orchestrator.executors import base

    def no_space(*args: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    said: list[str] = []
    the_plan = plan(TWO_MODELS, num_gpus=(1,), device="cpu")
    first, second, third, *_ = the_plan.experiments
    ctx = _context(tmp_path, the_plan, say=said.append, on_record=no_space)
    monkeypatch.setattr(base, "write_outcome", no_space)
    ctx.record(first.experiment_id, _full(tmp_path))
    assert ctx.prepare(second) is None and ctx.prepare(third) is None
    assert ctx.outcomes[third.experiment_id].status == "skipped"
    assert said == [f"the summary could not be rewritten: No space left on device ({tmp_path})"]


def test_write_failed_makes_a_disk_full_outcome_that_spares_the_rest(
    tmp_path: Path,
    plan,
    free_312k: None,  # type: ignore[no-untyped-def]
) -> None:
    """What an executor does when run_experiment's own write (spec.json, outcome.json)
    raised ENOSPC."""
    the_plan = plan(TWO_MODELS, num_gpus=(1,), device="cpu")
    first, second, *_ = the_plan.experiments
    ctx = _context(tmp_path, the_plan)
    ready = ctx.prepare(first)
    assert ready is not None
    exc = OSError(errno.ENOSPC, "No space left on device", str(ready.run.spec))
    outcome = ctx.write_failed(ready, exc)
    assert outcome is not None and outcome.status == "failed"
    assert outcome.error == f"disk full: {ready.run.dir} has 312 KiB free (No space left on device)"
    assert read_outcome(ready.run) == outcome
    ctx.record(first.experiment_id, outcome)
    assert ctx.prepare(second) is None
    assert ctx.write_failed(ready, OSError(errno.EIO, "Input/output error")) is None


def test_the_local_executor_launches_nothing_after_a_disk_full_failure(
    tmp_path: Path,
    plan,
    monkeypatch: pytest.MonkeyPatch,  # type: ignore[no-untyped-def]
) -> None:
    from orchestrator.executors import local

    launched: list[str] = []

    def fake_run(experiment, run, layout, options, placement, **kwargs):  # type: ignore[no-untyped-def]
        launched.append(experiment.experiment_id)
        return _full(run.dir)

    monkeypatch.setattr(local, "run_experiment", fake_run)
    monkeypatch.setattr(local, "gpu_pool", lambda: [])
    the_plan = plan(TWO_MODELS, num_gpus=(1,), device="cpu")
    ctx = _context(tmp_path, the_plan)
    local.LocalExecutor().run(ctx)
    assert launched == [the_plan.experiments[0].experiment_id]
    statuses = [shown(o.status, o.error) for o in ctx.outcomes.values()]
    assert statuses == ["failed"] + ["spared"] * (len(the_plan.experiments) - 1)
