"""The check before launch, for real: the child's own check in a subprocess, the
installed transformers and trl refusing a value, models resolved once (offline, a hub
that does not answer, the hub cache), and a matrix stopping early on a repeated failure.
"""

from __future__ import annotations

import csv
import os
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.long]

REPO = Path(__file__).resolve().parents[2]


def _run(cwd: Path, scenarios: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    (cwd / "scenarios.yaml").write_text(scenarios)
    (cwd / "defaults.yaml").write_text("max_steps: 3\nlogging_steps: 1\nreport_to: none\n")
    base = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "HF_ENDPOINT")}
    command = ["run", "--scenarios", "scenarios.yaml", "--results", "results", *args]
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", *command],
        cwd=cwd,
        env={**base, "PYTHONPATH": str(REPO), **env},
        capture_output=True,
        text=True,
        timeout=600,
    )


def _scenario(model: str, extra: str = "") -> str:
    return (
        "matrix:\n  effective_batch_size: [2, 4]\n  max_seq_len: [64]\n"
        "scenarios:\n"
        "  - name: s\n"
        "    device: cpu\n"
        "    arguments:\n"
        f"      model_name_or_path: {model}\n"
        f"{extra}"
    )


def _one_line_exit_2(done: subprocess.CompletedProcess[str], cwd: Path) -> str:
    assert done.returncode == 2, (done.stdout[-2000:], done.stderr[-2000:])
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tunematrix: error: "), done.stderr
    assert not (cwd / "results").exists(), "no results folder is left behind"
    return lines[0]


def test_a_value_the_installed_trainer_refuses_is_one_line_before_anything_starts(
    tmp_path: Path,
) -> None:
    from importlib.metadata import version

    done = _run(tmp_path, _scenario("tiny-llama", "      lr_scheduler_type: bogus\n"))
    line = _one_line_exit_2(done, tmp_path)
    # the place that set it, the key, the library and its version
    assert (
        f"scenarios.yaml:9: scenarios[0].arguments.lr_scheduler_type: trl {version('trl')}'s SFTConfig refuses 'bogus'"
        in line
    )
    assert line.endswith("(2 cell(s) of s); nothing was started")


def test_an_unknown_hub_model_offline_is_one_line_for_all_its_experiments(
    tmp_path: Path,
) -> None:
    done = _run(tmp_path, _scenario("no-such-org/no-such-model"), HF_HUB_OFFLINE="1")
    line = _one_line_exit_2(done, tmp_path)
    assert "scenarios.yaml:8: scenarios[0].arguments.model_name_or_path: model " in line
    assert "is neither a local folder nor in the hub cache, and the hub is offline" in line
    assert line.endswith("(2 cell(s) of s); nothing was started")


@pytest.fixture
def silent_hub() -> Iterator[str]:
    """An address that takes connections and never answers (a hub behind a dead proxy)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}"
    finally:
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        server.close()


def test_a_hub_that_does_not_answer_is_asked_once_with_a_time_limit(
    tmp_path: Path, silent_hub: str
) -> None:
    scenarios = _scenario("no-such-org/model-a") + (
        "  - name: t\n    device: cpu\n    arguments:\n      model_name_or_path: no-such-org/model-b\n"
    )
    done = _run(tmp_path, scenarios, HF_ENDPOINT=silent_hub, HF_HOME=str(tmp_path / "hf"))
    line = _one_line_exit_2(done, tmp_path)
    assert (
        "model 'no-such-org/model-a' is neither a local folder nor in the hub cache, and the hub did not answer in 5 s"
        in line
    )
    assert "set HF_HUB_OFFLINE=1" in line


def _cache_tiny_model(hf_home: Path, repo: str) -> None:
    """The tiny model as the hub cache keeps a download of ``repo``."""
    sys.path.insert(0, str(REPO))
    from trainer_entry.models.tiny import ensure_tiny

    source = ensure_tiny()
    folder = hf_home / "hub" / ("models--" + repo.replace("/", "--"))
    snapshot = folder / "snapshots" / ("0" * 40)
    shutil.copytree(source, snapshot)
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text("0" * 40)


def test_a_cached_model_runs_offline_when_the_hub_does_not_answer(
    tmp_path: Path, silent_hub: str
) -> None:
    hf_home = tmp_path / "hf"
    _cache_tiny_model(hf_home, "tunematrix/tiny-cached")
    done = _run(
        tmp_path,
        _scenario("tunematrix/tiny-cached").replace("[2, 4]", "[2]"),
        "--no-report",
        HF_ENDPOINT=silent_hub,
        HF_HOME=str(hf_home),
    )
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:])
    assert (
        "model tunematrix/tiny-cached: hub cache; the hub did not answer in 5 s: its jobs run "
        "offline" in done.stdout
    )
    (run,) = (tmp_path / "results" / "runs").iterdir()
    assert "export HF_HUB_OFFLINE=1" in (run / "command.sh").read_text()


def test_a_repeated_failure_spares_the_rest_of_its_model(tmp_path: Path) -> None:
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"instruction": "a", "output": "b"}\nnot json\n')
    scenarios = _scenario("tiny-llama", f"      dataset: {broken}\n").replace("[2, 4]", "[1, 2, 4]")
    done = _run(tmp_path, scenarios, HF_HUB_OFFLINE="1")
    assert done.returncode == 1, done.stderr[-2000:]
    with (tmp_path / "results" / "raw_summary.csv").open() as f:
        rows = {r["effective_batch_size"]: r for r in csv.DictReader(f)}
    # smaller cells first: eb 1 and 2 fail alike, eb 4 is not launched
    assert [rows[b]["status"] for b in ("1", "2", "4")] == ["failed", "failed", "skipped"]
    assert rows["4"]["error"] == f"not launched: same error as {rows['1']['experiment_id']}"
    assert not (tmp_path / "results" / "runs" / rows["4"]["experiment_id"] / "stderr.log").exists()
    assert "failed 2, spared 1" in done.stdout
    summary = (tmp_path / "results" / "summary.md").read_text()
    assert "**Spared**: 1 experiment(s) were not launched" in summary


def test_a_second_check_of_the_same_cells_on_the_same_stack_asks_the_child_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real child answers once; its verdicts are kept, and the second check of the same
    cells reads them (the interpreter's packages looked at, nothing imported)."""
    from orchestrator.config.scenarios import load_config
    from orchestrator.matrix.expand import Selection, build_plan
    from orchestrator.running.stackcheck import check_stack, run_check

    monkeypatch.setenv("TUNEMATRIX_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "scenarios.yaml").write_text(_scenario("tiny-llama"))
    config = load_config(tmp_path / "scenarios.yaml", defaults_file=None)
    plan = build_plan(config, Selection(device="cpu"), 0)
    asked: list[int] = []

    def child(python, cells):
        asked.append(len(cells))
        return run_check(python, cells)

    first = check_stack(plan, run=child, keep=True)
    second = check_stack(plan, run=child, keep=True)
    assert asked == [2]
    assert first.checked[0].versions == second.checked[0].versions
    assert first.checked[0].versions["transformers"]
    assert second.checked[0].models == {"tiny-llama": {**first.checked[0].models["tiny-llama"]}}
    assert "all kept from an earlier check" in second.lines()[0]


def test_a_plugin_cell_that_cannot_run_its_plugins_is_refused_and_never_ok(
    tmp_path: Path,
) -> None:
    """A foak cell on the CPU (fms-acceleration absent, or its Triton kernels without a
    GPU): one line before anything starts; with ``--no-check`` its job fails saying why,
    and its row is never ``ok`` as the plain baseline under the plugin's name."""
    contents = tmp_path / "sample-configurations"
    shutil.copytree(REPO / "tests" / "fixtures" / "fms_sample_configurations", contents)
    scenarios = (
        _scenario("tiny-llama")
        .replace(
            "    device: cpu\n", "    device: cpu\n    framework_config: [foak-fast-kernels]\n"
        )
        .replace("[2, 4]", "[2]")
    )
    frameworks = ("--frameworks", str(contents / "CONTENTS.yaml"))
    line = _one_line_exit_2(_run(tmp_path, scenarios, *frameworks, HF_HUB_OFFLINE="1"), tmp_path)
    assert "CONTENTS.yaml" in line and "framework 'foak-fast-kernels'" in line
    assert "training.fused_ops_and_kernels" in line and "use_liger_kernel: true" in line
    assert line.endswith("(1 cell(s) of s); nothing was started")

    done = _run(tmp_path, scenarios, *frameworks, "--no-check", HF_HUB_OFFLINE="1")
    assert done.returncode != 0, done.stdout[-2000:]
    with open(tmp_path / "results" / "raw_summary.csv", newline="") as f:
        (row,) = list(csv.DictReader(f))
    assert row["framework_config"] == "foak-fast-kernels"
    assert row["status"] == "failed", row
    assert "training.fused_ops_and_kernels" in row["error"]
    assert row.get("acceleration_plugins", "") == ""
