"""Progress that a person can follow: the child's progress file, and the parent's lines and ETA."""

from __future__ import annotations

import io
import json
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from orchestrator.contract.layout import RunPaths
from orchestrator.contract.spec import RunSpec, read_spec
from orchestrator.executors.console import Progress, StepProgress
from trainer_entry.measure.progressfile import ProgressFile


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


class Clocks:
    """A monotonic clock and a Unix clock that move together, by hand."""

    def __init__(self) -> None:
        self.t = 100.0
        self.unix = 1_000_000.0

    def mono(self) -> float:
        return self.t

    def wall(self) -> float:
        return self.unix

    def advance(self, seconds: float) -> None:
        self.t += seconds
        self.unix += seconds


def write_progress(path: Path, **fields: object) -> None:
    record = {
        "step": 37,
        "max_steps": 100,
        "tokens_per_second_rank0": 1234.0,
        "world_size": 1,
        "phase": "measuring",
        "updated": 1_000_000.0,
        "train_started": 1_000_000.0,
        **fields,
    }
    path.write_text(json.dumps(record))


def progress(total: int, stream: io.StringIO, clocks: Clocks, **kwargs: object) -> Progress:
    return Progress(total, stream, clock=clocks.mono, wall=clocks.wall, **kwargs)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------
# The file's record
# ---------------------------------------------------------------------------


def test_a_record_reads_back_as_written(tmp_path: Path) -> None:
    record = StepProgress(
        step=3,
        max_steps=8,
        tokens_per_second_rank0=512.5,
        world_size=2,
        phase="warmup",
        updated=10.0,
        train_started=4.0,
    )
    path = tmp_path / "progress.json"
    path.write_text(record.to_json())
    assert StepProgress.read(path) == record
    assert record.describe() == "step 3/8, 512 tok/s/device, warmup"


@pytest.mark.parametrize(
    "text",
    [
        "",
        "{not json",
        "[1, 2]",
        json.dumps({"step": 1}),
        json.dumps({"step": "37", "max_steps": 100}),
    ],
)
def test_an_unreadable_file_is_no_record(tmp_path: Path, text: str) -> None:
    path = tmp_path / "progress.json"
    path.write_text(text)
    assert StepProgress.read(path) is None
    assert StepProgress.read(tmp_path / "missing.json") is None


@pytest.mark.parametrize(
    "bad",
    [
        {"step": 101},
        {"step": -1},
        {"step": True},
        {"max_steps": 0},
        {"world_size": 0},
        {"phase": "training"},
        {"tokens_per_second_rank0": -5.0},
        {"tokens_per_second_rank0": "fast"},
        {"updated": None},
        {"updated": float("nan")},
    ],
)
def test_a_record_that_makes_no_sense_is_no_record(tmp_path: Path, bad: dict) -> None:
    path = tmp_path / "progress.json"
    write_progress(path, **bad)
    assert StepProgress.read(path) is None


def test_seconds_left_from_the_pace_so_far() -> None:
    p = StepProgress(20, 100, None, 1, "measuring", updated=1030.0, train_started=1010.0)
    assert p.seconds_left(1030.0) == pytest.approx(80.0)  # 20 steps in 20 s, 80 to go
    assert p.seconds_left(1040.0) == pytest.approx(70.0)  # 10 s since it was written
    assert StepProgress(0, 100, None, 1, "warmup", 1030.0, 1010.0).seconds_left(1030.0) is None
    assert StepProgress(100, 100, None, 1, "done", 1030.0, 1010.0).seconds_left(1030.0) == 0.0


# ---------------------------------------------------------------------------
# The parent's lines
# ---------------------------------------------------------------------------


def test_live_line_shows_steps_and_tokens(tmp_path: Path) -> None:
    clocks = Clocks()
    out = Terminal()
    file = tmp_path / "progress.json"
    p = progress(2, out, clocks)
    p.begin("exp-a", file)
    p.tick()
    assert "step" not in out.getvalue()  # nothing written yet: no step figures

    write_progress(file, updated=clocks.unix, train_started=clocks.unix - 37)
    clocks.advance(1)
    p.tick()
    last = out.getvalue().rsplit("\r\033[K", 1)[1]
    assert last.startswith("[0/2] elapsed 0:01 eta ")
    assert "step 37/100, 1,234 tok/s, 0:01 exp-a" in last
    assert "\n" not in last  # redrawn in place


def test_plain_lines_when_piped_and_not_a_flood(tmp_path: Path) -> None:
    clocks = Clocks()
    out = io.StringIO()
    file = tmp_path / "progress.json"
    p = progress(1, out, clocks)
    p.begin("exp-a", file)
    assert out.getvalue() == "[1/1] start exp-a\n"
    began = clocks.unix

    # one tick a second for 5 minutes, a step every second, 1,000 steps in all
    for second in range(1, 301):
        clocks.advance(1)
        write_progress(file, step=second, max_steps=1000, updated=clocks.unix, train_started=began)
        p.tick()
    steps = [line for line in out.getvalue().splitlines() if " running " in line]
    # every 10% of the steps (100 s here), which is rarer than every 30 s
    assert [line.split("step ")[1].split(",")[0] for line in steps] == [
        "100/1000",
        "200/1000",
        "300/1000",
    ]
    assert steps[0] == "[0/1] running     exp-a  step 100/1000, 1,234 tok/s, 1:40 in; eta 15:00"
    assert "\r" not in out.getvalue()


def test_plain_lines_at_most_every_30_s(tmp_path: Path) -> None:
    clocks = Clocks()
    out = io.StringIO()
    file = tmp_path / "progress.json"
    p = progress(1, out, clocks)
    p.begin("exp-a", file)
    for second in range(1, 91):  # 10 steps a second: 10% of the steps every 10 s
        clocks.advance(1)
        write_progress(file, step=10 * second, max_steps=1000, updated=clocks.unix)
        p.tick()
    said = [line for line in out.getvalue().splitlines() if " running " in line]
    assert [line.split("step ")[1].split(",")[0] for line in said] == [
        "300/1000",
        "600/1000",
        "900/1000",
    ]


def test_finish_says_the_step_reached(tmp_path: Path) -> None:
    clocks = Clocks()
    out = io.StringIO()
    file = tmp_path / "progress.json"
    p = progress(2, out, clocks)
    p.begin("killed", file)
    write_progress(file, step=312, max_steps=100000, updated=clocks.unix)
    p.finish("killed", "timeout", 12.0, "exceeded the time limit")
    assert out.getvalue().splitlines()[-1] == (
        "[1/2] timeout     killed  12.0s, step 312/100000  exceeded the time limit"
    )
    p.begin("quiet", tmp_path / "none.json")
    p.finish("quiet", "failed", 1.0)
    assert out.getvalue().splitlines()[-1] == "[2/2] failed      quiet  1.0s"


@pytest.mark.parametrize("live", [True, False])
def test_missing_corrupt_or_stale_files_give_no_step_figures(tmp_path: Path, live: bool) -> None:
    clocks = Clocks()
    out = Terminal() if live else io.StringIO()
    p = progress(3, out, clocks, plain_every_s=0.0, plain_every_fraction=0.0)
    corrupt, stale = tmp_path / "corrupt.json", tmp_path / "stale.json"
    corrupt.write_text('{"step": 5, "max_')
    # an earlier launch's file, written long before this one began
    write_progress(stale, updated=clocks.unix - 3600)
    p.begin("missing", tmp_path / "missing.json")
    p.begin("corrupt", corrupt)
    p.begin("stale", stale)
    p.begin("no-file")
    for _ in range(3):
        clocks.advance(1)
        p.tick()
    for eid in ("missing", "corrupt", "stale", "no-file"):
        p.finish(eid, "ok", 3.0)
    assert "step" not in out.getvalue()
    assert out.getvalue().count("ok ") == 4


# ---------------------------------------------------------------------------
# The ETA
# ---------------------------------------------------------------------------


def test_first_eta_comes_from_the_running_job_before_any_finished(tmp_path: Path) -> None:
    clocks = Clocks()
    file = tmp_path / "progress.json"
    p = progress(3, io.StringIO(), clocks)
    p.begin("first", file)
    clocks.advance(10)  # loading: 10 s before training starts
    train_started = clocks.unix
    clocks.advance(20)
    p.tick()
    assert p.eta_s() is None  # no step yet: nothing to go on
    write_progress(file, step=20, updated=clocks.unix, train_started=train_started)
    p.tick()
    # 20 of 100 steps in 20 s: 80 s left; the job takes 30 + 80 s, and two more wait
    assert p.eta_s() == pytest.approx(80 + 2 * 110)


def test_eta_combines_finished_durations_with_the_running_job(tmp_path: Path) -> None:
    clocks = Clocks()
    file = tmp_path / "progress.json"
    p = progress(4, io.StringIO(), clocks)
    p.begin("a")
    p.finish("a", "ok", 60.0)
    p.begin("b", file)
    clocks.advance(30)
    write_progress(file, step=50, updated=clocks.unix, train_started=clocks.unix - 25)
    p.tick()
    assert p.eta_s() == pytest.approx(25 + 2 * 60)  # b: 25 s left at its pace; two to go
    p.begin("c")  # packed beside b, without step figures yet: the mean duration left
    clocks.advance(10)
    assert p.eta_s() == pytest.approx(15 + 50 + 60)


def test_packed_jobs_from_threads(tmp_path: Path) -> None:
    out = io.StringIO()
    p = Progress(40, out, parallel=4, plain_every_s=0.0, plain_every_fraction=0.0)
    errors: list[BaseException] = []

    def job(i: int) -> None:
        try:
            file = tmp_path / f"p{i}.json"
            p.begin(f"e{i}", file)
            for step in range(1, 6):
                write_progress(file, step=step, max_steps=5, updated=9e9)
                p.tick()
            p.finish(f"e{i}", "ok", 1.0)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=job, args=(i,)) for i in range(40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert p.done == 40 and not p.running
    assert out.getvalue().count(", step 5/5") == 40


# ---------------------------------------------------------------------------
# The child's side
# ---------------------------------------------------------------------------


def test_child_writes_steps_throttled_and_atomically(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import trainer_entry.measure.progressfile as child

    path = tmp_path / "progress.json"
    replaced: list[tuple[str, str]] = []
    real_replace = child.os.replace

    def spy(src: str, dst: str) -> None:
        replaced.append((str(src), str(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(child.os, "replace", spy)
    unix = iter(range(1_000, 10_000))
    writer = ProgressFile(
        path, world_size=1, warmup_steps=2, wall=lambda: float(next(unix)), clock=lambda: 0.0
    )
    writer.begin(12)
    first = StepProgress.read(path)
    assert first is not None and (first.step, first.max_steps, first.phase) == (0, 12, "warmup")

    shown = []
    for step in range(1, 13):
        writer.step(step, tokens=100, seconds=0.25)
        reading = StepProgress.read(path)
        assert reading is not None
        shown.append((reading.step, reading.phase))
    # the first step at once, then once per second of steps (4 × 0.25 s)
    assert shown == [(1, "warmup")] * 4 + [(5, "measuring")] * 4 + [(9, "measuring")] * 4
    last = StepProgress.read(path)
    assert last is not None and last.tokens_per_second_rank0 == pytest.approx(400.0)
    writer.end(12)
    done = StepProgress.read(path)
    assert done is not None and (done.step, done.max_steps, done.phase) == (12, 12, "done")
    assert done.train_started == 1_000.0 and done.updated > done.train_started

    # every write is a whole file renamed over the old one, in the same folder
    assert len(replaced) == 5
    assert all(Path(src).parent == tmp_path and dst == str(path) for src, dst in replaced)
    assert [p.name for p in tmp_path.iterdir()] == ["progress.json"]


def test_slow_writes_are_spaced_out(tmp_path: Path) -> None:
    """A write that takes 10 ms (a slow network filesystem) comes every 10 s, not every 1 s."""
    path = tmp_path / "progress.json"
    ticks = iter(range(0, 10**6, 10))
    writer = ProgressFile(path, world_size=1, clock=lambda: next(ticks) / 1000)
    writer.begin(100)
    shown = []
    for step in range(1, 44):
        writer.step(step, tokens=10, seconds=0.75)
        reading = StepProgress.read(path)
        assert reading is not None
        shown.append(reading.step)
    assert sorted(set(shown)) == [1, 15, 29, 43]  # every 14 steps of 0.75 s


def test_child_carries_on_when_the_file_cannot_be_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    writer = ProgressFile(tmp_path / "no-such-folder" / "progress.json", world_size=1)
    writer.begin(5)
    for step in range(1, 6):
        writer.step(step, tokens=10, seconds=2.0)
    writer.end(5)
    err = capsys.readouterr().err
    assert err.count("cannot write the progress file") == 1
    assert "training goes on without it" in err


def test_the_trainer_callback_reports_the_steps(tmp_path: Path) -> None:
    from trainer_entry.backends.hf import MeasureCallback
    from trainer_entry.measure.hooks import StepHooks
    from trainer_entry.measure.steps import StepRecorder

    path = tmp_path / "progress.json"
    recorder = StepRecorder(0)
    callback = MeasureCallback(
        StepHooks(recorder, progress=ProgressFile(path, world_size=2, warmup_steps=None))
    )
    state = SimpleNamespace(max_steps=6, global_step=0)
    callback.on_train_begin(None, state, None)
    for step in range(1, 7):
        recorder.add_batch(64, 80)
        state.global_step = step
        callback.on_step_end(None, state, None)
    reading = StepProgress.read(path)
    assert reading is not None and reading.step == 1  # the first step; the rest took < 1 s
    assert reading.world_size == 2 and reading.tokens_per_second_rank0 is not None
    callback.on_train_end(None, state, None)
    reading = StepProgress.read(path)
    assert reading is not None and (reading.step, reading.max_steps) == (6, 6)
    assert reading.phase == "done"
    assert len(recorder.stats.step_times_s) == 6


def test_the_spec_names_the_progress_file(tmp_path: Path) -> None:
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"arguments": {"model_name_or_path": "m"}}))
    assert read_spec(spec).progress_path == str(tmp_path / "progress.json")
    spec.write_text(json.dumps({"progress_path": None}))
    assert read_spec(spec).progress_path is None
    assert RunSpec().progress_path == "progress.json"
    assert RunPaths(tmp_path).progress == tmp_path / "progress.json"
