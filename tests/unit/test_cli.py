"""The command line: plan output, plan.csv, commands, errors, help. Run in-process."""

from __future__ import annotations

import argparse
import csv
import io
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.cli.app import build_parser, main

REPO = Path(__file__).resolve().parents[2]
SHIPPED = ["--scenarios", str(REPO / "scenarios.yaml")]


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_plan_prints_header_and_table(capsys) -> None:
    code, out, err = run_cli(capsys, "plan", *SHIPPED, "--device", "cpu")
    assert code == 0, err
    assert "tunematrix plan: 6 experiments from" in out
    assert "device:    cpu (requested)" in out
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.lstrip().startswith("#  experiment_id"))
    table = lines[header + 2 : header + 8]
    assert [line.split()[2] for line in table] == [
        "tiny-full-finetuning",
        "tiny-full-finetuning",
        "tiny-lora",
        "tiny-lora",
        "tiny-sft-vs-hf",
        "tiny-sft-vs-hf",
    ]
    assert (
        "procs" in lines[header] and "per_dev_bs" in lines[header] and "grad_acc" in lines[header]
    )


def test_plan_csv_has_key_columns_and_swept_values(capsys, tmp_path) -> None:
    out_csv = tmp_path / "plan.csv"
    code, _, err = run_cli(
        capsys,
        "plan",
        *SHIPPED,
        "--device",
        "gpu",
        "--filter",
        "lora-rank-sweep",
        "--num-gpus",
        "1 2",
        "--output",
        str(out_csv),
    )
    assert code == 0, err
    rows = list(csv.DictReader(out_csv.open()))
    assert len(rows) == 3 * 2 * 2  # r values × GPU counts × effective batch sizes
    for column in (
        "experiment_id",
        "scenario",
        "framework_config",
        "model_name_or_path",
        "num_gpus",
        "per_device_train_batch_size",
        "gradient_accumulation_steps",
        "effective_batch_size",
        "max_seq_len",
        "repeat",
        "r",
    ):
        assert column in rows[0], column
    assert [row["r"] for row in rows[::4]] == ["8", "16", "64"]
    assert {row["status"] for row in rows} == {"planned"}
    for row in rows:
        assert int(row["per_device_train_batch_size"]) * int(
            row["gradient_accumulation_steps"]
        ) * int(row["num_gpus"]) == int(row["effective_batch_size"])


def test_plan_output_dash_writes_only_csv(capsys) -> None:
    code, out, _ = run_cli(capsys, "plan", *SHIPPED, "--device", "cpu", "--output", "-")
    assert code == 0
    rows = list(csv.DictReader(io.StringIO(out)))
    assert len(rows) == 6
    assert rows[0]["device"] == "cpu"


def _commands(out: str) -> dict[str, list[str]]:
    lines = out.splitlines()
    found = {}
    for i, line in enumerate(lines):
        if line.startswith("# ") and i + 1 < len(lines) and lines[i + 1].startswith("env "):
            found[line[2:]] = shlex.split(lines[i + 1])
    return found


def test_commands_are_exact_accelerate_launches(capsys) -> None:
    code, out, _ = run_cli(
        capsys,
        "plan",
        *SHIPPED,
        "--device",
        "cpu",
        "--num-gpus",
        "1 2",
        "--commands",
        "--results",
        "res",
    )
    assert code == 0
    commands = _commands(out)
    assert len(commands) == 10  # tiny-sft-vs-hf runs on 1 process only
    for eid, argv in commands.items():
        assert argv[0] == "env"
        launch = next(i for i, word in enumerate(argv) if word.endswith("accelerate"))
        env = dict(word.split("=", 1) for word in argv[1:launch])
        assert env["CUDA_VISIBLE_DEVICES"] == ""
        # the accelerate of the interpreter running tunematrix, not whatever is on the PATH
        assert argv[launch : launch + 2] == [
            str(Path(sys.executable).with_name("accelerate")),
            "launch",
        ]
        assert argv[-4:] == ["-m", "trainer_entry", "--spec", f"res/runs/{eid}/spec.json"]
        n = argv[argv.index("--num_processes") + 1]
        assert (".g1." in eid) == (n == "1")
        assert ("--cpu" in argv) == (n == "1")
        assert ("--multi_gpu" in argv) == (n == "2")
        assert argv[argv.index("--config_file") + 1] == str(REPO / "accelerate-ddp.yaml")


def test_commands_of_a_launch_per_family_run_its_specs_in_turn(capsys) -> None:
    common = ("plan", *SHIPPED, "--device", "cpu", "--num-gpus", "1", "--commands")
    code, out, _ = run_cli(capsys, *common, "--results", "res", "--launch", "family")
    assert code == 0
    launches: list[tuple[list[str], list[str]]] = []  # (ids named above it, its argv)
    named: list[str] = []
    for line in out.splitlines():
        if line.startswith("# ") and "." in line and " " not in line[2:]:
            named.append(line[2:])
        elif line.startswith("env "):
            launches.append((named, shlex.split(line)))
            named = []
    alone = _commands(run_cli(capsys, *common, "--results", "res")[1])
    assert [eid for ids, _ in launches for eid in ids] == list(alone)  # each once, in order
    assert [len(ids) for ids, _ in launches] == [5, 1]  # the sft family, then hf alone
    for ids, argv in launches:
        start = argv.index("trainer_entry") + 1
        assert argv[start:] == [w for eid in ids for w in ("--spec", f"res/runs/{eid}/spec.json")]
        # the command of its first experiment, the later ones' specs added
        assert argv[:start] == alone[ids[0]][:start]


def test_gpu_commands_leave_the_distributed_type_to_the_config(capsys) -> None:
    code, out, _ = run_cli(
        capsys,
        "plan",
        *SHIPPED,
        "--device",
        "gpu",
        "--num-gpus",
        "2",
        "--filter",
        "full-finetuning",
        "--commands",
    )
    assert code == 0
    for argv in _commands(out).values():
        assert "--multi_gpu" not in argv and "--cpu" not in argv
        assert argv[argv.index("--config_file") + 1] == str(REPO / "accelerate.yaml")
        assert "CUDA_VISIBLE_DEVICES=0,1" in argv


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--num-gpus", "0"], "--num-gpus: 0 is not a positive integer (got '0')"),
        (["--num-gpus", "1 x"], "--num-gpus: 'x' is not an integer"),
        (["--num-gpus", "-2"], "--num-gpus: -2 is not a positive integer"),
        (["--effective-batch-size", "4 4"], "--effective-batch-size: 4 is listed twice"),
        (["--effective-batch-size", " "], "--effective-batch-size: no values given"),
        (["--filter", "nope"], "filter 'nope' matches no scenario in"),
        (
            ["--device", "gpu", "--num-gpus", "3", "--filter", "full-finetuning"],
            "is not divisible by num_gpus 3",
        ),
        (["--scenarios", "/no/such/file.yaml"], "/no/such/file.yaml: scenarios file not found"),
        (
            ["--defaults", "/no/such/defaults.yaml"],
            "/no/such/defaults.yaml: defaults file not found",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys, argv: list[str], expected: str) -> None:
    if "--scenarios" not in argv:
        argv = [*SHIPPED, *argv]
    code, out, err = run_cli(capsys, "plan", *argv)
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1, err
    assert err.startswith("tunematrix: error: ")
    assert expected in err
    assert "Traceback" not in err


def test_usage_errors_are_one_line(capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(["plan", "--device", "tpu"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "invalid choice: 'tpu'" in err and "(see --help)" in err


def test_every_command_has_examples_in_its_help() -> None:
    parser = build_parser()
    assert "Examples:" in parser.format_help()
    sub = next(a for a in parser._actions if a.dest == "command")
    for name, subparser in sub.choices.items():  # type: ignore[union-attr]
        assert "Examples:" in subparser.format_help(), name
        assert f"tunematrix {name}" in subparser.format_help(), name


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    return dict(sub.choices)  # type: ignore[arg-type]


def test_every_command_is_documented_in_the_readme() -> None:
    text = (REPO / "README.md").read_text()
    table = text.split("## Commands", 1)[1].split("\n## ", 1)[0]
    documented = re.findall(r"^\| `tunematrix ([a-z-]+)", table, re.M)
    assert sorted(documented) == sorted(_subcommands()), (
        "the README's Commands table and the CLI's commands differ"
    )


def test_every_help_example_runs_a_command_that_exists() -> None:
    commands = _subcommands()
    for name, subparser in commands.items():
        examples = subparser.format_help().split("Examples:", 1)[1]
        used = set(re.findall(r"^  tunematrix ([a-z-]+)", examples, re.M))
        assert name in used, name
        assert used <= set(commands), (name, used - set(commands))


def test_plan_writes_nothing(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "keep.txt").write_text("old")
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    code, _, _ = run_cli(capsys, "plan", *SHIPPED, "--commands", "--results", "results")
    assert code == 0
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
    assert (tmp_path / "results" / "keep.txt").read_text() == "old"


def test_default_scenarios_file_is_the_one_in_the_current_folder(
    tmp_path, capsys, monkeypatch, write
) -> None:
    write(
        "scenarios.yaml",
        "scenarios:\n  - name: mine\n    device: cpu\n    arguments: {model_name_or_path: m}\n",
    )
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(capsys, "plan", "--device", "cpu")
    assert code == 0, err
    assert "scenarios: mine" in out
    # no defaults.yaml beside it: the shipped one applies, and the header says so
    assert f"(defaults: {REPO / 'defaults.yaml'})" in out


BLOCKER = """
import sys
BLOCKED = {"torch", "transformers", "trl", "peft", "accelerate", "pandas", "datasets"}

class Blocker:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ImportError(f"the plan imported {name}")
        return None

sys.meta_path.insert(0, Blocker())
from orchestrator.cli.app import main
code = main(sys.argv[1:])
loaded = sorted(m for m in sys.modules if m.partition(".")[0] in BLOCKED)
assert not loaded, loaded
sys.exit(code)
"""


@pytest.mark.parametrize("device", ["cpu", "gpu"])
def test_plan_does_not_import_the_training_stack(tmp_path, device: str) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            BLOCKER,
            "plan",
            *SHIPPED,
            "--device",
            device,
            "--commands",
            "--output",
            str(tmp_path / "plan.csv"),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "plan.csv").stat().st_size > 0


def test_python_dash_m_orchestrator(tmp_path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "orchestrator", "--version"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert result.returncode == 0
    assert result.stdout.startswith("tunematrix ")


def test_the_reading_commands_start_without_the_planner_and_executors(tmp_path) -> None:
    """report, compare and history import their own command alone: not the matrix
    planner, the executors or the job runner (a third of a second of every start)."""
    import subprocess
    import sys

    heavy = ("orchestrator.executors.base", "orchestrator.job.execute", "orchestrator.cli.run")
    code = (
        "import sys\n"
        "from orchestrator.cli.app import main\n"
        f"assert main(['history', {str(tmp_path)!r}]) == 0\n"
        f"loaded = [m for m in {heavy!r} if m in sys.modules]\n"
        "assert not loaded, loaded\n"
        "assert main(['--version']) == 0\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=False
    )
    # --version exits through argparse, after building every command's parser
    assert proc.returncode == 0, proc.stderr
    assert "no runs recorded" in proc.stdout and "tunematrix" in proc.stdout


def test_a_command_named_alone_parses_and_fails_as_with_every_command(capsys) -> None:
    """The parser of the named command alone gives the same answers and errors."""
    for argv in (["report", "--rank-by", "nope", "x"], ["compare"], ["history", "a", "b"]):
        with pytest.raises(SystemExit) as alone:
            build_parser(argv[0]).parse_args(argv)
        err_alone = capsys.readouterr().err
        with pytest.raises(SystemExit) as every:
            build_parser().parse_args(argv)
        assert (alone.value.code, err_alone) == (every.value.code, capsys.readouterr().err)
    assert build_parser("report").parse_args(["report", "r"]).source == "r"
