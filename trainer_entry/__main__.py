"""``python -m trainer_entry --spec SPEC [--spec SPEC ...]``: training runs, measured.

Normally started by the orchestrator through ``accelerate launch``; it runs by
hand too. Exit code 0 and ``result.json`` with status ``ok`` on success; on an
error, a result with status ``failed`` (or ``oom``), a one-line error on
stderr and a non-zero exit code.

Several specs are one launch: their runs one after another in this process,
the training stack imported once. Each run loads its own model, data, trainer
and optimizer and writes its own result; the first pays the imports
(``interpreter_start_s``, ``import_s``), and a later one's
``time_to_first_step_s`` counts from its own start. A run that does not finish
ends the launch: the specs after it are left without a result, to be launched
afresh.
"""

import time

_WALL_START = time.time()  # before the heavy imports, to time them

import argparse  # noqa: E402
import os  # noqa: E402

_PARENT = os.getppid()  # the launcher, read first: whether it is gone yet is checked later
import signal  # noqa: E402
import sys  # noqa: E402
import traceback  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import TYPE_CHECKING, Any  # noqa: E402

if TYPE_CHECKING:
    from orchestrator.contract.spec import RunSpec

EPILOG = """\
Examples:
  python -m trainer_entry --spec results/runs/<experiment_id>/spec.json
  accelerate launch --cpu --num_processes 1 -m trainer_entry --spec spec.json
  python -m trainer_entry --spec a/spec.json --spec b/spec.json   (one launch, two runs)

A minimal spec, written by hand:
  {"arguments": {"model_name_or_path": "tiny-llama", "max_steps": 5,
                 "per_device_train_batch_size": 2, "max_seq_len": 128}}
The result goes to result.json beside the spec (result_path in the spec).
"""


class Terminated(BaseException):
    """SIGTERM: the parent (a timeout, Ctrl-C) or the launcher stopping a peer rank."""


#: the run a SIGTERM ends, with its timings so far (empty between runs and once its
#: result is written)
_RUNNING: "list[tuple[RunSpec, dict[str, float]]]" = []


def _on_sigterm(signum: int, frame: Any) -> None:
    """Record the run in progress as interrupted, then end the process here.

    Not by raising through the code it interrupts: the signal comes at any bytecode,
    often inside the training stack's imports, where a library that catches the
    exception, or a module left half imported, went on running for seconds or for good
    (a launcher killed while its single process imported torch left it training).
    What the record needs was imported before the handler was set.
    """
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: a second one must not cut it short
    from trainer_entry.results.failure import write_failure

    try:
        for spec, timings in _RUNNING:
            write_failure(spec, "interrupted", Terminated("stopped by SIGTERM"), timings)
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # a launcher gone with the pipe
                pass
        os._exit(143)


def _process_start() -> float:
    """When this process started (Unix time), to 10 ms.

    From the kernel's start time in clock ticks since boot, compared with the
    boot-time clock now; the usual route through /proc/stat's boot time is
    rounded to whole seconds, too coarse for an interpreter that starts in a
    fraction of one.
    """

    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22: starttime
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - started
        return time.time() - age
    except (OSError, ValueError, IndexError, AttributeError):
        return _WALL_START


def main(argv: "list[str] | None" = None) -> int:
    code = _main(argv)
    _exit_if_distributed(code)
    _exit_without_teardown(code)
    return code


def _exit_without_teardown(code: int) -> None:
    """End the process as Python's exit would, less the interpreter's teardown.

    With the training stack loaded, freeing every module and object at exit took
    2.1-2.4 s of a tiny CPU run's 13 s (more with a GPU's context), after the
    result was on disk: the wall time's ``after_training`` phase. What an exit owes
    others still runs, in Python's order: the threads that are not daemons are
    joined (after the exit hooks threads register, which wake a thread pool's idle
    workers), the ``atexit`` handlers run (a tracker's upload, a library's temporary
    files) and the streams are flushed; only the teardown is skipped.
    """
    import atexit
    import threading

    threading._shutdown()  # type: ignore[attr-defined]  # what Python's exit does first
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _exit_if_distributed(code: int) -> None:
    """End a distributed rank here, without tearing its process group down.

    Everything a run owes is on disk by now (the result is written atomically
    by rank 0 after all ranks reported). Tearing gloo down at interpreter exit
    can abort a rank ("terminate called without an active exception") or
    deadlock in the process group's destructor, which would turn a finished
    run into a failed or hung one; leaving with ``os._exit`` skips it.
    """
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _main(argv: "list[str] | None") -> int:
    parser = argparse.ArgumentParser(
        prog="python -m trainer_entry",
        description="Train once as a tunematrix spec says, measure, and write result.json.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--spec",
        required=True,
        type=Path,
        action="append",
        help="a run's spec.json; given again, the runs share this launch, in order",
    )
    args = parser.parse_args(argv)
    from orchestrator.contract.result import LAUNCH_ID_ENV
    from trainer_entry.results.failure import write_failure  # noqa: F401  # the handler's

    signal.signal(signal.SIGTERM, _on_sigterm)

    if os.environ.get(LAUNCH_ID_ENV):
        _die_with_launcher()

    from orchestrator.contract.errors import UserError
    from orchestrator.contract.launch import marker
    from orchestrator.contract.spec import read_spec

    try:
        specs = [read_spec(path) for path in args.spec]
    except UserError as exc:
        print(f"trainer_entry: error: {exc}", file=sys.stderr)
        return 2

    process_start = _process_start()
    timings: dict[str, float] = {"interpreter_start_s": _WALL_START - process_start}
    for position, spec in enumerate(specs):
        if len(specs) > 1:  # where the parent cuts the launch's logs into the runs' own
            _mark(marker(position + 1, len(specs), spec.experiment_id))
        code = _one_run(spec, timings, process_start, first=position == 0)
        if code != 0:
            return code
        # the next run of the launch: the imports are paid, its clock starts now
        timings, process_start = {}, time.time()
    return 0


def _die_with_launcher() -> None:
    """Started by tunematrix: have the kernel end this process when its launcher dies.

    torchrun (``accelerate launch --multi_gpu``) starts each rank in a session of its
    own, out of reach of a stop that kills the launch's process group, and Ray's
    cancel kills a task's worker and its children but not their children: a launcher
    killed outright would leave its ranks training, on a GPU, with no one to end them.
    A rank in a session of its own gets SIGKILL: its launcher passes SIGTERM on before
    it dies, unless it was killed outright (as the tether kills it when the
    orchestrator dies). One in the launcher's group (a single process) gets SIGTERM,
    and ends as if stopped, its failure recorded. By hand (no
    launch id) a run outlives its shell as any command does.
    """
    from orchestrator.contract.parentdeath import die_with_parent

    death = signal.SIGKILL if os.getsid(0) == os.getpid() else signal.SIGTERM
    die_with_parent(death, _PARENT)


def _mark(line: str) -> None:
    for stream in (sys.stdout, sys.stderr):
        print(line, file=stream, flush=True)


def _one_run(
    spec: "RunSpec", timings: dict[str, float], process_start: float, *, first: bool
) -> int:
    """One spec's run; its exit code. ``first``: the launch's first run, which pays the
    imports; a later one starts by freeing what the run before it left."""
    from orchestrator.contract.outcome import Status
    from trainer_entry.measure.memory import is_oom
    from trainer_entry.results.failure import write_failure

    timings["run_start_unix"] = process_start
    _RUNNING.append((spec, timings))  # what a SIGTERM records from here on
    try:
        from trainer_entry.run.preflight import preflight

        preflight(spec)
        t = time.perf_counter()
        from trainer_entry.run import train

        backend = train.load_backend(spec)  # its training stack, timed with the rest
        notes: list[str] = []
        if first:
            timings["import_s"] = time.perf_counter() - t
        else:
            notes = train.between_runs()  # and what stays of the earlier runs, noted
        timings["imports_end_unix"] = time.time()
        train.run(spec, timings, process_start, backend, notes=notes)
        _RUNNING.clear()  # its result is written: a stop now leaves it as it is
        return 0
    except KeyboardInterrupt as exc:
        _RUNNING.clear()
        write_failure(spec, "interrupted", exc, timings)
        return 130
    except BaseException as exc:
        _RUNNING.clear()
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # ending anyway: the record is finished
        from trainer_entry.spec_errors import SpecError

        if not isinstance(exc, SpecError):
            traceback.print_exc()
        status: Status = "oom" if is_oom(exc) else "failed"
        line = write_failure(spec, status, exc, timings)
        print(f"trainer_entry: error: {line}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
