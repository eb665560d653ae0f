"""One launch per family (``--launch family``), for real: the orchestrator runs a family's
experiments in one ``accelerate launch`` and each still gets its own outcome, figures,
logs and time limit; a run that does not finish ends the launch and the rest run afresh.

- The same three cells (full fine-tuning at two batch sizes, then LoRA: one family) run
  a launch per cell and one launch for all: equal losses, statuses and steps; the rows
  say which launch each ran in, and where.
- Under a 2 GiB memory cgroup, a family whose second cell is killed by the kernel's OOM
  killer: that cell ``oom``, the larger one pruned, the two after it launched afresh in
  one launch, where the last runs past its own time limit (``timeout``) while the one
  before it finishes ``ok``; no process is left (marked ``faults``: root, a cgroup).
- Ctrl-C in the middle of a launch keeps the finished experiment's result.
"""

from __future__ import annotations

import itertools
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import memcgroup
import pytest
from test_run import REPO, assert_phases_add_up, env, processes_mentioning, rows, tunematrix

pytestmark = [pytest.mark.e2e, pytest.mark.long]

DEFAULTS = "max_steps: 4\nlogging_steps: 1\nreport_to: none\nsave_strategy: 'no'\nseed: 42\n"


def _scenarios(*blocks: str, matrix: str = "[2, 4]", seq: int = 64) -> str:
    return (
        f"accelerate_config: {REPO / 'accelerate-ddp.yaml'}\n"
        f"matrix:\n  effective_batch_size: {matrix}\n  max_seq_len: [{seq}]\n"
        "scenarios:\n" + "".join(blocks)
    )


def _block(name: str, extra: str = "") -> str:
    return (
        f"  - name: {name}\n"
        "    device: cpu\n"
        "    num_gpus: [1]\n"
        "    arguments:\n"
        "      model_name_or_path: tiny-llama\n"
        "      torch_dtype: float32\n"
        "      learning_rate: 1e-3\n"
        "      warmup_steps: 0\n"
        f"{extra}"
    )


LORA = "      peft_method: lora\n      effective_batch_size: 2\n"


def _result(results: Path, eid: str) -> dict:
    return json.loads((results / "runs" / eid / "result.json").read_text())


def test_a_shared_launch_measures_what_launches_of_their_own_do(tmp_path) -> None:
    (tmp_path / "defaults.yaml").write_text(DEFAULTS)
    (tmp_path / "scenarios.yaml").write_text(_scenarios(_block("full"), _block("lora", LORA)))
    common = ("--scenarios", "scenarios.yaml", "--defaults", "defaults.yaml", "--device", "cpu")
    common += ("--no-check",)
    alone = tunematrix(tmp_path, *common, "--results", "alone", "--no-report")
    assert alone.returncode == 0, alone.stderr[-3000:]
    shared = tunematrix(tmp_path, *common, "--results", "shared", "--launch", "family")
    assert shared.returncode == 0, shared.stderr[-3000:]

    by_alone = {r["experiment_id"]: r for r in rows(tmp_path / "alone")}
    by_shared = {r["experiment_id"]: r for r in rows(tmp_path / "shared")}
    assert list(by_alone) == list(by_shared) and len(by_shared) == 3
    launches = {r["launch_id"] for r in by_shared.values()}
    assert len(launches) == 1 and "" not in launches
    assert len({r["launch_id"] for r in by_alone.values()}) == 3
    for position, (eid, row) in enumerate(by_shared.items(), start=1):
        assert row["status"] == by_alone[eid]["status"] == "ok"
        assert (row["run_mode"], row["launch_position"], row["launch_size"]) == (
            "shared",
            str(position),
            "3",
        )
        assert by_alone[eid]["run_mode"] == "alone" and by_alone[eid]["launch_size"] == "1"
        # the same training: the same seed, data, steps and losses as a launch of its own
        mine, theirs = _result(tmp_path / "shared", eid), _result(tmp_path / "alone", eid)
        assert mine["loss_history"] == theirs["loss_history"]
        assert mine["metrics"]["steps"] == theirs["metrics"]["steps"] == 4
        assert mine["flops"] == theirs["flops"]
        # each run's own figures: its memory samples, its peak, its log from its marker on
        run = tmp_path / "shared" / "runs" / eid
        assert float(row["mem_tree_peak_pss_bytes"] or row["mem_tree_peak_rss_bytes"]) > 0
        assert float(row["mem_peak_rss_bytes"]) > 0
        assert f"run {position} of 3: {eid}" in run.joinpath("stderr.log").read_text()
        assert len(run.joinpath("memory.csv").read_text().splitlines()) > 2
    # each run's progress lines in turn: the next starts once the last one's line is out
    events = [
        (words[1], words[2])
        for words in (line.split() for line in shared.stderr.splitlines())
        if len(words) > 2 and words[0].startswith("[") and words[1] in ("start", "ok")
    ]
    assert events == [(kind, eid) for eid in by_shared for kind in ("start", "ok")], events
    # the launch's start-up, paid once: on every row of the launch, and only the first
    # row's wall time holds it
    overheads = {r["launch_overhead_s"] for r in by_shared.values()}
    assert len(overheads) == 1 and float(overheads.pop()) > 0
    first = next(iter(by_shared.values()))
    timings = [_result(tmp_path / "shared", eid)["timings"] for eid in by_shared]
    assert timings[0]["import_s"] > 0 and timings[0]["interpreter_start_s"] >= 0
    # each run's wall in phases: a later run of the launch imports nothing, and its
    # launch phase is the hand-over from the run before, not a launcher's start
    phases = [assert_phases_add_up(r) for r in by_shared.values()]
    alone_phases = [assert_phases_add_up(r) for r in by_alone.values()]
    assert len(phases) == len(alone_phases) == 3
    for before, mine in itertools.pairwise(timings):
        assert mine.get("import_s") is None and mine.get("interpreter_start_s") is None
        # its clock starts after the run before it trained: what it waited for is not its own
        assert mine["run_start_unix"] >= before["train_end_unix"]
    # and its row's wall starts at the hand-over: where the run before it ended
    outcomes = [
        json.loads((tmp_path / "shared" / "runs" / eid / "outcome.json").read_text())
        for eid in by_shared
    ]
    for before, mine in itertools.pairwise(outcomes):
        assert mine["started_at"] == before["finished_at"], (before, mine)
    (launch,) = (tmp_path / "shared" / "launches").iterdir()
    assert launch.name == first["launch_id"]
    assert launch.joinpath("stderr.log").read_text().count("==> tunematrix shared launch") == 3
    summary = (tmp_path / "shared" / "summary.md").read_text()
    assert "**Shared launches**: 3 of 3 experiment(s)" in summary


@pytest.mark.faults
def test_an_oom_mid_launch_ends_it_and_the_rest_run_afresh(tmp_path) -> None:
    shipped = (REPO / "trainer_entry" / "assets" / "instructions.jsonl").read_text()
    (tmp_path / "long.jsonl").write_text(shipped * 20)  # enough for a batch of 128
    data = f"      dataset: {tmp_path / 'long.jsonl'}\n"
    (tmp_path / "defaults.yaml").write_text(DEFAULTS)
    # one family: full fine-tuning at batch 1 (fits), 128 (killed) and 256 (pruned), then
    # LoRA at batch 1 and a LoRA run too long for its scenario's 8 s
    endless = "      peft_method: lora\n      effective_batch_size: 1\n      max_steps: 100000\n"
    (tmp_path / "scenarios.yaml").write_text(
        "launch: family\n"
        + _scenarios(
            _block("full", data),
            _block("lora", data + LORA.replace("2\n", "1\n")),
            _block("long", data + endless) + "    timeout_s: 8\n",
            matrix="[1, 128, 256]",
            seq=1024,
        )
    )
    with memcgroup.memory_cgroup("family-oom", 2048 * 1024 * 1024) as folder:
        proc = subprocess.run(
            [
                sys.executable,
                *("-m", "orchestrator", "run", "--device", "cpu", "--no-check"),
                *("--scenarios", "scenarios.yaml", "--defaults", "defaults.yaml"),
                *("--results", "res"),
            ],
            cwd=tmp_path,
            env={**env(), "OMP_NUM_THREADS": "1"},
            capture_output=True,
            text=True,
            preexec_fn=memcgroup.joining(folder),
            timeout=400,
        )
        assert memcgroup.left_in(folder) == []
    assert proc.returncode == 1, proc.stderr[-3000:]  # the time limit fails the run
    by = {(r["scenario"], r["per_device_train_batch_size"]): r for r in rows(tmp_path / "res")}
    fits, killed, larger = by[("full", "1")], by[("full", "128")], by[("full", "256")]
    lora, long = by[("lora", "1")], by[("long", "1")]
    assert fits["status"] == "ok" and killed["status"] == "oom", killed["error"]
    assert "out-of-memory killer" in killed["error"]
    assert fits["launch_id"] == killed["launch_id"]
    assert (fits["launch_position"], killed["launch_position"]) == ("1", "2")
    assert (larger["status"], larger["error"]) == (
        "skipped",
        f"pruned: {killed['experiment_id']} ran out of memory",
    )
    # nothing of the launch it never ran in is left in its folder
    assert [p.name for p in (tmp_path / "res" / "runs" / larger["experiment_id"]).iterdir()] == [
        "outcome.json"
    ]
    # afresh: a launch of their own, where the second's limit counts from its own start
    assert lora["launch_id"] == long["launch_id"] != killed["launch_id"]
    assert lora["status"] == "ok", lora["error"]
    assert long["status"] == "timeout", long["error"]
    assert long["error"].startswith("exceeded the time limit of 8 s")
    assert 8 <= float(long["wall_s"]) < 25
    for row in (fits, killed, lora, long):
        spec = str(tmp_path / "res" / "runs" / row["experiment_id"] / "spec.json")
        assert processes_mentioning(spec) == []


def test_ctrl_c_mid_launch_keeps_the_finished_run(tmp_path) -> None:
    (tmp_path / "defaults.yaml").write_text(DEFAULTS)
    (tmp_path / "scenarios.yaml").write_text(
        _scenarios(_block("quick"), _block("long", "      max_steps: 100000\n"), matrix="[2]")
    )
    orchestrator = subprocess.Popen(
        [
            sys.executable,
            *("-m", "orchestrator", "run", "--device", "cpu", "--no-check", "--launch", "family"),
            *("--scenarios", "scenarios.yaml", "--defaults", "defaults.yaml", "--results", "res"),
        ],
        cwd=tmp_path,
        env=env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    runs = tmp_path / "res" / "runs"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and not list(runs.glob("long.*/progress.json")):
        time.sleep(0.2)  # the long run trains once the quick one's result is in
    assert list(runs.glob("quick.*/result.json")), "the long run began before the quick one ended"
    orchestrator.send_signal(signal.SIGINT)
    _stdout, stderr = orchestrator.communicate(timeout=60)
    assert orchestrator.returncode == 130, stderr[-2000:]
    by = {r["scenario"]: r for r in rows(tmp_path / "res")}
    assert by["quick"]["status"] == "ok" and by["long"]["status"] == "interrupted"
    assert by["quick"]["launch_id"] == by["long"]["launch_id"]
    assert (
        json.loads((runs / by["quick"]["experiment_id"] / "result.json").read_text())["status"]
        == "ok"
    )
    time.sleep(0.5)
    assert processes_mentioning(str(runs / by["long"]["experiment_id"] / "spec.json")) == []
