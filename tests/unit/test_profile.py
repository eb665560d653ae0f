"""Profiles: the trace analysis on hand-made events, the window they leave, the planner's
opt-in and refusal, the spec, and summary.md's communication section."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from pydantic import ValidationError

from orchestrator import api
from orchestrator.contract.errors import ConfigError
from orchestrator.contract.layout import RunPaths
from orchestrator.contract.spec import RunSpec, read_spec, write_spec
from orchestrator.contract.window import DEFAULT_PROFILE_STEPS, profile_problem
from orchestrator.results.communication import communication_markdown
from trainer_entry.measure.profile import (
    RankProfile,
    StepProfiler,
    analyze_events,
    intersect,
    profile_figures,
    profile_notes,
    subtract,
    top_ops,
    union,
)
from trainer_entry.measure.steps import RankStats, measured_window, summarize


def x(name: str, ts: float, dur: float, *, tid: int = 1, cat: str = "cpu_op", **args: Any):
    event: dict[str, Any] = {
        "ph": "X",
        "cat": cat,
        "name": name,
        "pid": 7,
        "tid": tid,
        "ts": ts,
        "dur": dur,
    }
    if args:
        event["args"] = {k.replace("_", " "): v for k, v in args.items()}
    return event


def steps(*bounds: tuple[float, float]) -> list[dict[str, Any]]:
    return [
        x(f"ProfilerStep#{i}", a, b - a, cat="user_annotation") for i, (a, b) in enumerate(bounds)
    ]


# ---------------------------------------------------------------------------
# interval arithmetic
# ---------------------------------------------------------------------------


def test_union_merges_overlapping_and_touching_intervals() -> None:
    assert union([(5, 8), (0, 2), (1, 3), (3, 4), (9, 9)]) == [(0, 4), (5, 8)]


def test_intersect_and_subtract() -> None:
    a = [(0.0, 10.0), (20.0, 30.0)]
    b = [(5.0, 25.0)]
    assert intersect(a, b) == [(5.0, 10.0), (20.0, 25.0)]
    assert subtract(a, b) == [(0.0, 5.0), (25.0, 30.0)]
    assert subtract(a, []) == a
    assert subtract([(0.0, 10.0)], [(2.0, 3.0), (4.0, 5.0)]) == [
        (0.0, 2.0),
        (3.0, 4.0),
        (5.0, 10.0),
    ]


# ---------------------------------------------------------------------------
# the analysis of one rank's trace
# ---------------------------------------------------------------------------


def cpu_trace() -> list[dict[str, Any]]:
    """Two 100 µs steps on thread 1; gloo's collective on thread 2, half hidden by compute."""
    return [
        *steps((0, 100), (100, 200)),
        # step 0: a linear (10..50) with a matmul inside (15..45); the collective's enqueue
        x("aten::linear", 10, 40),
        x("aten::mm", 15, 30),
        x("c10d::allreduce_", 50, 2),
        # gloo runs the all-reduce on its own thread: 40 µs, 10 of them beside the linear
        x("gloo:all_reduce", 40, 40, tid=2, cat="user_annotation"),
        # step 1: one op; a collective running past the profiled steps is cut at their end
        x("aten::add_", 120, 20),
        x("gloo:all_reduce", 190, 30, tid=2, cat="user_annotation"),
        # outside the profiled steps: not counted
        x("aten::mm", 300, 50),
        # not complete events: ignored
        {"ph": "M", "name": "thread_name", "pid": 7, "tid": 2, "args": {"name": "gloo"}},
        {"ph": "i", "name": "marker", "ts": 50},
    ]


def test_cpu_trace_communication_compute_and_exposed() -> None:
    rank = analyze_events(cpu_trace())
    assert rank is not None
    assert rank.source == "cpu ops" and rank.steps == 2
    assert rank.step_us == pytest.approx(200)
    # gloo: 40..80 and 190..200 (cut at the end of the steps)
    assert rank.comm_us == pytest.approx(50)
    # compute: linear 10..50 and add_ 120..140; the enqueue is not compute
    assert rank.compute_us == pytest.approx(60)
    # communication without compute: 50..80 and 190..200
    assert rank.comm_exposed_us == pytest.approx(40)


def test_cpu_self_times_subtract_children() -> None:
    rank = analyze_events(cpu_trace())
    assert rank is not None
    ops = rank.op_self_us
    assert ops["aten::linear"] == pytest.approx(10)  # 40 less the matmul's 30
    assert ops["aten::mm"] == pytest.approx(30)  # the one outside the steps not counted
    assert ops["gloo:all_reduce"] == pytest.approx(70)  # on its own thread, whole
    assert ops["c10d::allreduce_"] == pytest.approx(2)


def test_gpu_trace_uses_kernels_and_names_them_by_their_operator() -> None:
    events = [
        *steps((0, 100)),
        x("aten::mm", 5, 5, External_id=11),
        x("record_param_comms", 12, 2, External_id=12),
        x("ampere_sgemm_128x64_nn", 10, 30, tid=20, cat="kernel", External_id=11),
        x(
            "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
            30,
            40,
            tid=21,
            cat="kernel",
            External_id=12,
        ),
        # a kernel without its operator in the trace: counted under its own short name
        x(
            "void at::native::vectorized_elementwise_kernel<4, X>(int)",
            80,
            10,
            tid=20,
            cat="kernel",
        ),
    ]
    rank = analyze_events(events)
    assert rank is not None and rank.source == "kernels"
    assert rank.comm_us == pytest.approx(40)  # 30..70
    assert rank.compute_us == pytest.approx(40)  # 10..40 and 80..90
    assert rank.comm_exposed_us == pytest.approx(30)  # 40..70
    assert rank.op_self_us == pytest.approx(
        {
            "aten::mm": 30,
            "ncclDevKernel_AllReduce_Sum_f32_RING_LL": 40,
            "void at::native::vectorized_elementwise_kernel": 10,
        }
    )


def test_a_kernel_tagged_with_a_collective_is_communication() -> None:
    events = [
        *steps((0, 10)),
        x("custom_kernel", 0, 5, cat="kernel", tid=3, Collective_name="allgather"),
    ]
    rank = analyze_events(events)
    assert rank is not None and rank.comm_us == pytest.approx(5) and rank.compute_us == 0


def test_a_trace_without_steps_has_no_figures() -> None:
    assert analyze_events([x("aten::mm", 0, 5)]) is None
    assert analyze_events([]) is None


def test_a_single_process_has_no_communication() -> None:
    rank = analyze_events([*steps((0, 50)), x("aten::mm", 0, 25)])
    assert rank is not None and rank.comm_us == 0 and rank.compute_us == pytest.approx(25)


# ---------------------------------------------------------------------------
# the result's figures from every rank
# ---------------------------------------------------------------------------


def test_top_ops_are_shares_of_all_self_time() -> None:
    assert top_ops({"a": 50, "b": 30, "c": 20}, n=2) == "a 50%, b 30%"
    assert top_ops({"x, y": 1}) == "x  y 100%"  # a comma in a name does not split the list
    assert top_ops({}) is None


def test_profile_figures_are_the_mean_over_the_ranks() -> None:
    r0 = RankProfile(
        steps=2,
        step_us=200,
        comm_us=50,
        compute_us=60,
        comm_exposed_us=40,
        op_self_us={"aten::mm": 30, "gloo:all_reduce": 70},
        export_s=0.5,
    )
    r1 = RankProfile(
        steps=2,
        step_us=100,
        comm_us=30,
        compute_us=50,
        comm_exposed_us=10,
        op_self_us={"aten::mm": 50, "gloo:all_reduce": 50},
        export_s=0.25,
    )
    figures = profile_figures([r0, r1, None])
    assert figures["comm_time_pct"] == pytest.approx((25 + 30) / 2)
    assert figures["compute_time_pct"] == pytest.approx((30 + 50) / 2)
    assert figures["comm_exposed_time_pct"] == pytest.approx((20 + 10) / 2)
    # µs over steps, in ms: (25 + 15) / 2
    assert figures["comm_time_per_step_ms"] == pytest.approx(0.020)
    assert figures["profiled_step_time_ms"] == pytest.approx(0.075)
    assert figures["profile_export_s"] == 0.5
    assert figures["top_ops"] == "gloo:all_reduce 60%, aten::mm 40%"
    notes = profile_notes([r0, r1, None])
    assert any("2 of 3 ranks" in n for n in notes)
    assert profile_figures([None]) == {}


# ---------------------------------------------------------------------------
# the window: warm-up, profiled steps, measured steps
# ---------------------------------------------------------------------------


def test_the_profiled_steps_are_left_out_of_the_window() -> None:
    assert measured_window(10, 2, (2, 3)) == (2, 5)
    assert measured_window(10, 2, None) == (2, 2)
    assert measured_window(10, None, (3, 3)) == (3, 6)  # default warm-up max(3, 10%)
    times = [9.0, 9.0, 5.0, 5.0, 1.0, 2.0, 1.0]
    rank = RankStats(rank=0, step_times_s=times, step_tokens=[10] * 7, step_padded_tokens=[10] * 7)
    m = summarize([rank], warmup=2, profiled=(2, 2))
    assert m["warmup_steps_excluded"] == 2 and m["profiled_steps"] == 2
    assert m["steps_measured"] == 3
    # 30 tokens over the last three steps' 4 s: the slow profiled steps are not in it
    assert m["tokens_per_second_global"] == pytest.approx(7.5)
    assert m["step_time_max_s"] == 2.0
    assert summarize([rank], warmup=2)["profiled_steps"] is None


def test_a_profile_reaching_the_end_leaves_no_figure() -> None:
    rank = RankStats(
        rank=0, step_times_s=[1.0] * 4, step_tokens=[1] * 4, step_padded_tokens=[1] * 4
    )
    m = summarize([rank], warmup=1, profiled=(1, 3))
    assert m["steps_measured"] == 0 and "tokens_per_second_global" not in m


def test_profile_problem_names_what_to_change() -> None:
    assert profile_problem(8, 2, 2) is None
    problem = profile_problem(5, None, DEFAULT_PROFILE_STEPS)
    assert problem is not None and "max_steps 5" in problem and "above 6" in problem
    assert profile_problem(5, None, 1) is None  # 3 + 1 < 5
    assert profile_problem(5, None, 0) is None


def test_the_profiler_skips_a_run_too_short_without_importing_torch(tmp_path: Path) -> None:
    profiler = StepProfiler(3, tmp_path, 0, warmup=None, on_gpu=False)
    profiler.train_begin(5)  # warm-up 3 + 3 profiled > 5 steps
    for i in range(5):
        profiler.step_ending()
        profiler.step_ended(i)
    profiler.train_end()
    assert profiler.profiled is None and profiler.figures() is None
    assert profiler.notes == [f"no profile: {profile_problem(5, None, 3)}"]
    assert any("leaves no measured step" in n for n in profiler.notes)
    assert not any(tmp_path.iterdir())


def test_the_profiler_records_the_steps_after_the_warm_up(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    barriers: list[int] = []
    profiler = StepProfiler(
        2, tmp_path / "profile", 1, warmup=1, on_gpu=False, barrier=lambda: barriers.append(1)
    )
    profiler.train_begin(5)
    a = torch.ones(64, 64)
    for i in range(5):
        _ = a @ a
        profiler.step_ending()
        profiler.step_ended(i)
    profiler.train_end()
    assert profiler.profiled == (1, 2)
    trace = tmp_path / "profile" / "rank1.json"
    assert trace == RunPaths(tmp_path).profile_trace(1)
    events = json.loads(trace.read_text())["traceEvents"]
    names = [e.get("name") for e in events]
    assert names.count("ProfilerStep#0") == 1 and names.count("ProfilerStep#1") == 1
    assert "ProfilerStep#2" not in names
    assert barriers == [1]  # once, after the export
    figures = profiler.figures()
    assert figures is not None and figures.steps == 2 and figures.comm_us == 0
    assert figures.op_self_us.get("aten::mm", 0) > 0
    assert figures.export_s is not None and figures.export_s > 0


# ---------------------------------------------------------------------------
# planning and the spec
# ---------------------------------------------------------------------------

SCENARIOS = """\
matrix:
  effective_batch_size: [4]
scenarios:
  - name: plain
    device: cpu
    arguments: {model_name_or_path: tiny-llama, max_seq_len: 64, max_steps: 8}
  - name: profiled
    device: cpu
    profile: true
    arguments:
      model_name_or_path: tiny-llama
      max_seq_len: 64
      max_steps: 8
"""


def _plan(tmp_path: Path, text: str = SCENARIOS, **options: Any):
    path = tmp_path / "scenarios.yaml"
    path.write_text(text)
    return api.plan(path, device="cpu", num_gpus=2, gpus=0, **options)


def test_profile_true_profiles_its_scenario_only(tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    by_scenario = {e.scenario: e for e in plan.experiments}
    assert by_scenario["profiled"].profile_steps == DEFAULT_PROFILE_STEPS
    assert by_scenario["plain"].profile_steps == 0
    assert "profile_steps" not in by_scenario["plain"].spec()
    assert by_scenario["profiled"].spec()["profile_steps"] == DEFAULT_PROFILE_STEPS
    assert any("profiled" in n and "torch.profiler" in n for n in plan.notes)
    # the profile does not change what is measured: the ids are those of an unprofiled plan
    unprofiled = _plan(tmp_path, SCENARIOS.replace("    profile: true\n", ""))
    assert [e.experiment_id for e in plan.experiments] == [
        e.experiment_id for e in unprofiled.experiments
    ]


def test_the_command_line_profiles_every_cell(tmp_path: Path) -> None:
    plan = _plan(tmp_path, profile_steps=2)
    assert {e.profile_steps for e in plan.experiments} == {2}
    assert {e.profile_steps for e in _plan(tmp_path, profile=True).experiments} == {3}


def test_a_profiled_run_too_short_is_refused_at_its_line(tmp_path: Path) -> None:
    text = SCENARIOS.replace("      max_steps: 8\n", "      max_steps: 6\n")
    with pytest.raises(ConfigError) as exc:
        _plan(tmp_path, text)
    message = str(exc.value)
    assert "scenarios.yaml:13" in message and "max_steps 6" in message
    assert "\n" not in message
    # fewer profiled steps fit
    assert _plan(tmp_path, text, profile_steps=2).experiments[1].profile_steps == 2


def test_the_spec_carries_the_profile_and_its_folder(tmp_path: Path) -> None:
    spec = RunSpec(profile_steps=3, profile_dir="runs/x/profile")
    write_spec(spec, tmp_path / "spec.json")
    read = read_spec(tmp_path / "spec.json")
    assert read.profile_steps == 3
    assert read.profile_dir == str((tmp_path / "runs/x/profile").resolve())
    assert RunSpec().profile_steps == 0
    with pytest.raises(ValidationError):
        RunSpec(profile_steps=-1)


# ---------------------------------------------------------------------------
# summary.md
# ---------------------------------------------------------------------------


def test_the_communication_section_lists_the_profiled_cells() -> None:
    cells = pd.DataFrame(
        [
            {
                "scenario": "s",
                "model_name_or_path": "tiny-llama",
                "framework_config": "ddp",
                "num_gpus": 2,
                "comm_time_pct": 37.04,
                "compute_time_pct": 44.8,
                "comm_exposed_time_pct": 34.2,
                "comm_time_per_step_ms": 22.509,
                "profiled_step_time_ms": 60.87,
                "top_ops": "gloo:all_gather 23%, aten::mm 8%",
            },
            {
                "scenario": "s",
                "model_name_or_path": "tiny-llama",
                "framework_config": "ddp",
                "num_gpus": 1,
                "comm_time_pct": None,
            },
        ]
    )
    lines = communication_markdown(cells)
    text = "\n".join(lines)
    assert "## Communication" in text
    rows = [line for line in lines if line.startswith("| s ")]
    assert rows == [
        "| s | tiny-llama | ddp | 2 | 22.51 | 37.0 | 34.2 | 44.8 | 60.87 "
        "| gloo:all_gather 23%, aten::mm 8% |"
    ]
    assert communication_markdown(cells.drop(index=0)) == []
    assert communication_markdown(pd.DataFrame([{"scenario": "s"}])) == []


def test_run_benchmarks_sh_profile_true_profiles_every_cell(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    (tmp_path / "scenarios.yaml").write_text(
        SCENARIOS.replace("    profile: true\n", "").replace("max_steps: 8", "max_steps: 5")
    )
    script = Path(__file__).resolve().parents[2] / "run_benchmarks.sh"
    base = {k: v for k, v in os.environ.items() if k not in ("DRY_RUN", "PROFILE", "DEVICE")}

    def dry_run(**env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", str(script), "2", "results", str(tmp_path / "scenarios.yaml")],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env={**base, "PYTHON": sys.executable, "DRY_RUN": "true", "DEVICE": "cpu", **env},
            timeout=60,
        )

    assert dry_run().returncode == 0
    # max_steps 5 leaves no measured step after a warm-up of 3 and 3 profiled steps
    refused = dry_run(PROFILE="true")
    assert refused.returncode != 0 and "is profiled, but max_steps 5" in refused.stderr
    assert dry_run(PROFILE="maybe").returncode == 2


def test_an_unprofiled_result_reports_every_profile_column_empty() -> None:
    from orchestrator.contract import columns as registry
    from trainer_entry.measure.profile import PROFILE_COLUMNS, ProfileOutcome

    assert ProfileOutcome().columns() == dict.fromkeys(PROFILE_COLUMNS)
    figures = ProfileOutcome((3, 2), {"comm_time_pct": 12.5}).columns()
    assert figures["comm_time_pct"] == 12.5 and figures["top_ops"] is None
    # each is a declared column of the child's
    assert all(registry.get(name).child_metric for name in (*PROFILE_COLUMNS, "profiled_steps"))
