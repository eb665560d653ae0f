"""The SLURM executor's pure logic: times, GPU counts, job shapes, SLURM endings -> statuses.

The real cluster path (submission, waiting, time limits, cancelling) is in
tests/e2e/test_slurm.py; here only what needs no cluster.
"""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from orchestrator.cli.app import build_parser, main
from orchestrator.contract.errors import UserError
from orchestrator.contract.layout import ResultsLayout
from orchestrator.contract.outcome import Outcome, write_outcome
from orchestrator.executors.slurm import (
    SlurmModel,
    SlurmSettings,
    Unreachable,
    final_outcome,
    gres_gpus,
    job_minutes,
    parse_time,
    settings_from,
    shape,
    states,
)


def slurm_settings(args, file: dict) -> SlurmSettings:
    """The settings of the flags over the file's ``slurm:`` section (given as a mapping)."""
    return settings_from(args, SlurmModel.model_validate(file))


REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("text", "minutes"),
    [
        ("30", 30),
        ("90", 90),
        ("10:30", 11),  # MM:SS, rounded up to whole minutes
        ("1:30:00", 90),
        ("2-00:00:00", 2880),
        ("1-1:00:01", 1501),
    ],
)
def test_parse_time(text: str, minutes: int) -> None:
    assert parse_time(text) == minutes


@pytest.mark.parametrize("text", ["", "abc", "1h", "0", "0:00:00", "1:2:3:4"])
def test_parse_time_refuses(text: str) -> None:
    with pytest.raises(UserError, match="--slurm-time"):
        parse_time(text)


@pytest.mark.parametrize(
    ("gres", "gpus"),
    [
        ("gpu:a100:4(S:0-1)", 4),
        ("gpu:8", 8),
        ("gpu:a100:4,gpu:v100:2", 6),
        ("gpu:h100:8(S:0-1),shard:16", 8),
        ("(null)", 0),
        ("shard:8", 0),
    ],
)
def test_gres_gpus(gres: str, gpus: int) -> None:
    assert gres_gpus(gres) == gpus


GPU_SCENARIO = """\
scenarios:
  - name: big
    num_gpus: [8]
    arguments:
      model_name_or_path: tiny-llama
"""

CPU_SCENARIO = """\
scenarios:
  - name: small
    device: cpu
    num_gpus: [2]
    arguments:
      model_name_or_path: tiny-llama
"""


def test_shape_spans_nodes_when_a_job_needs_more_gpus_than_a_node(plan) -> None:
    (experiment,) = plan(GPU_SCENARIO, num_gpus=[8], effective_batch_size=[8]).experiments
    assert shape(experiment, SlurmSettings(), gpus_per_node=4) == (2, 4, 16)
    assert shape(experiment, SlurmSettings(), gpus_per_node=8) == (1, 8, 32)
    # the user's GPUs per node win over the cluster's, and so do their CPUs
    assert shape(experiment, SlurmSettings(gpus_per_node=2, cpus_per_task=6), 8) == (4, 2, 6)


def test_shape_of_a_cpu_job_is_one_node_with_a_cpu_per_process(plan) -> None:
    (experiment,) = plan(
        CPU_SCENARIO, device="cpu", num_gpus=[2], effective_batch_size=[4]
    ).experiments
    assert shape(experiment, SlurmSettings(), gpus_per_node=8) == (1, None, 2)


def test_job_minutes() -> None:
    # ours stops a job before SLURM does: our limit + 5 minutes, within the partition's maximum
    assert job_minutes(SlurmSettings(), 3600, None) == 65
    assert job_minutes(SlurmSettings(), 3601, None) == 66
    assert job_minutes(SlurmSettings(), 3600, 30) == 30
    # the user's limit is theirs
    assert job_minutes(SlurmSettings(time_min=10), 3600, 30) == 10


@pytest.mark.parametrize(
    ("recorded", "state", "status", "says"),
    [
        (None, "TIMEOUT", "timeout", "SLURM ended job 7 as TIMEOUT"),
        ("interrupted", "TIMEOUT", "timeout", "the job's own record: stopped"),
        ("failed", "OUT_OF_MEMORY", "oom", "as OUT_OF_MEMORY"),
        (None, "CANCELLED+", "interrupted", "as CANCELLED"),
        (None, "NODE_FAIL", "failed", "as NODE_FAIL"),
        ("ok", "COMPLETED", "ok", None),
        # the job's work finished before SLURM's ending: its result stands
        ("ok", "TIMEOUT", "ok", None),
        # the job's own diagnosis is more precise than SLURM's FAILED
        ("oom", "FAILED", "oom", "CUDA out of memory"),
        ("failed", "FAILED", "failed", "exit 1"),
        ("oom", "CANCELLED", "oom", "CUDA out of memory"),
        (None, "COMPLETED", "failed", "ended COMPLETED without an outcome"),
        (None, "UNKNOWN", "failed", "ended UNKNOWN without an outcome"),
    ],
)
def test_final_outcome_maps_slurm_endings(
    tmp_path: Path, recorded: str | None, state: str, status: str, says: str | None
) -> None:
    layout = ResultsLayout(tmp_path)
    run = layout.run("exp-1")
    run.dir.mkdir(parents=True)
    if recorded is not None:
        error = {"interrupted": "stopped", "oom": "CUDA out of memory", "failed": "exit 1"}.get(
            recorded
        )
        write_outcome(run, Outcome(status=recorded, error=error, job_s=12.5))
    outcome = final_outcome(run, layout, "7", state)
    assert outcome.status == status
    if says is None:
        assert outcome.error is None
    else:
        assert says in (outcome.error or "")
    assert outcome.executor == "slurm" and outcome.job_id == "7"
    written = json.loads((run.dir / "outcome.json").read_text())
    assert written["status"] == status
    if recorded is not None:
        assert written["job_s"] == 12.5  # the job's own measurements are kept


def _args(*argv: str):
    return build_parser().parse_args(["run", "--executor", "slurm", *argv])


def test_settings_take_the_file_and_let_flags_override() -> None:
    file = {
        "partition": "a100",
        "account": "team",
        "time": "1:00:00",
        "options": {"qos": "low", "constraint": "nvlink"},
        "array": True,
        "array_parallelism": 4,
    }
    settings = slurm_settings(_args(), file)
    assert settings.partition == "a100" and settings.account == "team"
    assert settings.time_min == 60 and settings.array and settings.array_parallelism == 4
    assert settings.options == {"qos": "low", "constraint": "nvlink"}
    settings = slurm_settings(
        _args(
            "--slurm-partition",
            "h100",
            "--slurm-time",
            "15",
            "--slurm-option",
            "qos=high",
            "--slurm-option=--exclusive=",
            "--no-wait",
        ),
        file,
    )
    assert settings.partition == "h100" and settings.time_min == 15 and not settings.wait
    assert settings.options == {"qos": "high", "constraint": "nvlink", "exclusive": ""}
    assert settings.account == "team"


def test_settings_refuse_an_option_without_a_value() -> None:
    with pytest.raises(UserError, match="NAME=VALUE"):
        slurm_settings(_args("--slurm-option", "qos"), {})


def _fake(folder: Path, name: str, script: str) -> None:
    path = folder / name
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def test_states_raise_when_the_controller_does_not_answer(tmp_path, monkeypatch) -> None:
    # a fake squeue for this one pure case; the real one is used end to end
    _fake(
        tmp_path,
        "squeue",
        "echo 'slurm_load_jobs error: Unable to contact slurm controller' >&2; exit 1\n",
    )
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(Unreachable, match="Unable to contact"):
        states(["12"])


def test_states_of_forgotten_jobs_are_unknown(tmp_path, monkeypatch) -> None:
    _fake(
        tmp_path, "squeue", "echo 'slurm_load_jobs error: Invalid job id specified' >&2; exit 1\n"
    )
    monkeypatch.setenv("PATH", str(tmp_path))
    assert states(["12", "13"]) == {"12": "UNKNOWN", "13": "UNKNOWN"}


def test_states_fall_back_to_the_completion_log(tmp_path, monkeypatch) -> None:
    _fake(tmp_path, "squeue", "echo '12 RUNNING'\n")
    _fake(
        tmp_path,
        "sacct",
        'case "$*" in *--completion*) echo "13|TIMEOUT";; esac\n',
    )
    monkeypatch.setenv("PATH", str(tmp_path))
    assert states(["12", "13"]) == {"12": "RUNNING", "13": "TIMEOUT"}


def test_no_sbatch_on_the_path_is_one_line_before_anything_is_written(
    tmp_path, capsys, monkeypatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.chdir(tmp_path)
    code = main(
        [
            "run",
            "--scenarios",
            str(REPO / "scenarios.yaml"),
            "--device",
            "cpu",
            "--executor",
            "slurm",
            "--results",
            "results",
        ]
    )
    out, err = capsys.readouterr()
    assert code == 2
    assert err == (
        "tunematrix: error: --executor slurm: sbatch is not on the PATH "
        "(is this a SLURM login node?)\n"
    )
    assert out == ""
    assert not (tmp_path / "results").exists()


def test_a_cluster_that_does_not_answer_is_one_line_before_anything_is_written(
    tmp_path, capsys, monkeypatch
) -> None:
    # sbatch and sinfo exist, but this machine has no slurm.conf (a fake sinfo
    # saying what Debian's says; the real cluster is used end to end)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _fake(bin_dir, "sbatch", "exit 1\n")
    _fake(
        bin_dir,
        "sinfo",
        "echo 'sinfo: error: fetch_config: DNS SRV lookup failed' >&2\n"
        "echo 'sinfo: fatal: Could not establish a configuration source' >&2; exit 1\n",
    )
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.chdir(tmp_path)
    code = main(["run", "--device", "cpu", "--executor", "slurm", "--results", "results"])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err == (
        "tunematrix: error: sinfo failed (sinfo: fatal: Could not establish a configuration "
        "source); is this machine a node of a SLURM cluster (its slurm.conf, or SLURM_CONF)?\n"
    )
    assert not (tmp_path / "results").exists()


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--executor", "slurm", "--pack"], "--pack is for one machine"),
        (["--slurm-partition", "gpu"], "--slurm-partition: only with --executor slurm"),
        (["--no-wait", "--array"], "--array, --no-wait: only with --executor slurm"),
    ],
)
def test_slurm_flags_in_the_wrong_place(tmp_path, capsys, monkeypatch, argv, expected) -> None:
    monkeypatch.chdir(tmp_path)
    code = main(["run", "--scenarios", str(REPO / "scenarios.yaml"), "--device", "cpu", *argv])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and expected in err, err
    assert not (tmp_path / "results").exists()


def test_slurm_section_of_the_scenarios_file_is_checked(load) -> None:
    from orchestrator.contract.errors import ConfigError

    config = load(
        "slurm:\n  partition: gpu\n  time: '2:00:00'\n  options: {qos: high}\n"
        "scenarios:\n  - name: a\n    arguments: {model_name_or_path: tiny-llama}\n"
    )
    assert config.executors["slurm"].model_dump(exclude_none=True) == {
        "partition": "gpu",
        "time": "2:00:00",
        "exclusive": False,
        "options": {"qos": "high"},
        "array": False,
    }
    with pytest.raises(ConfigError, match="partion"):
        load(
            "slurm:\n  partion: gpu\n"
            "scenarios:\n  - name: a\n    arguments: {model_name_or_path: tiny-llama}\n"
        )
