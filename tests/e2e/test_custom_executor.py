"""A new executor, written here and registered with one line, runs a real tiny CPU matrix.

What adding an executor takes: a subclass of ``Executor`` (its flag, its typed
section of the scenarios file, how it runs a plan) and one registry line. The
experiments run through the same in-job code as every executor's
(``run_experiment``), so the rows, logs and outcome records are the usual ones.
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

import pytest

from orchestrator.cli.app import main
from orchestrator.executors import registry
from orchestrator.executors.base import (
    Executor,
    ExecutorSection,
    Flags,
    RunContext,
)
from orchestrator.job.execute import Placement, run_experiment

pytestmark = [pytest.mark.e2e, pytest.mark.long]

REPO = Path(__file__).resolve().parents[2]

DEFAULTS = """\
max_steps: 3
logging_steps: 1
learning_rate: 1e-3
report_to: none
save_strategy: "no"
"""


class InOrderSection(ExecutorSection):
    """The scenarios file's ``inorder:`` section."""

    #: run the plan last experiment first
    reverse: bool = False
    #: the prefix of the job ids it hands out
    prefix: str = "job"


class InOrderExecutor(Executor):
    """Each experiment in turn, in plan order or reversed, with job ids of its own."""

    name = "inorder"
    title = "in-order"
    summary = "run here, in plan order or reversed (a test's)"
    flags_title = "in-order (--executor inorder; defaults from the file's inorder: section)"
    section = InOrderSection

    def __init__(self, reverse: bool, prefix: str) -> None:
        self.reverse = reverse
        self.prefix = prefix

    @classmethod
    def add_flags(cls, flags: Flags) -> None:
        flags.add_argument("--inorder-reverse", action="store_true", help="last experiment first")

    @classmethod
    def from_args(cls, args: argparse.Namespace, section: ExecutorSection | None) -> Executor:
        file = section if isinstance(section, InOrderSection) else InOrderSection()
        return cls(reverse=args.inorder_reverse or file.reverse, prefix=file.prefix)

    def run(self, ctx: RunContext) -> None:
        order = list(ctx.plan.experiments)
        if self.reverse:
            order.reverse()
        for n, experiment in enumerate(order):
            ready = ctx.prepare(experiment, gpus=0)
            if ready is None:
                continue
            ctx.progress.begin(experiment.experiment_id, ready.run.progress)
            outcome = run_experiment(
                experiment,
                ready.run,
                ctx.layout,
                ctx.options,
                Placement(executor=self.name, job_id=f"{self.prefix}-{n}"),
                attempt=ready.attempt,
                on_tick=ctx.progress.tick,
            )
            ctx.record(experiment.experiment_id, outcome)


SCENARIOS = f"""\
inorder:
  prefix: tiny
frameworks:
  ddp: {{accelerate_config: {REPO / "accelerate-ddp.yaml"}}}
matrix:
  effective_batch_size: [4]
scenarios:
  - name: custom
    device: cpu
    framework_config: [ddp]
    num_gpus: [1]
    arguments:
      model_name_or_path: tiny-llama
      max_seq_len: 64
      trainer: hf  # fixed packed blocks: the exact token count below
    sweep:
      learning_rate: [1e-4, 2e-4]
"""


def test_a_registered_executor_runs_a_tiny_matrix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # the one registry line (undone after the test)
    monkeypatch.setitem(registry.EXECUTORS, InOrderExecutor.name, InOrderExecutor)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "defaults.yaml").write_text(DEFAULTS)
    (tmp_path / "scenarios.yaml").write_text(SCENARIOS)
    code = main(
        [
            "run",
            "--scenarios",
            "scenarios.yaml",
            "--results",
            "results",
            "--device",
            "cpu",
            "--executor",
            "inorder",
            "--inorder-reverse",
            "--no-check",  # the executor is the subject (the check: test_stackcheck_e2e.py)
            "--no-report",
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0, out[-3000:] + err[-3000:]
    results = tmp_path / "results"
    with (results / "raw_summary.csv").open() as f:
        table = list(csv.DictReader(f))
    assert [r["status"] for r in table] == ["ok", "ok"], table
    for r in table:
        assert int(r["tokens_total"]) == 3 * 4 * 64
        assert float(r["tokens_per_second_global"]) > 0
        assert r["executor"] == "inorder"
    outcomes = {
        r["experiment_id"]: json.loads(
            (results / "runs" / r["experiment_id"] / "outcome.json").read_text()
        )
        for r in table
    }
    assert {o["executor"] for o in outcomes.values()} == {"inorder"}
    # the file's section (prefix) and the flag (reverse: the plan's last ran first)
    first, second = (table[0]["experiment_id"], table[1]["experiment_id"])
    assert outcomes[second]["job_id"] == "tiny-0" and outcomes[first]["job_id"] == "tiny-1"
    assert outcomes[second]["started_at"] < outcomes[first]["started_at"]
    env = json.loads((results / "env.json").read_text())
    assert env["executor"] == "inorder"


def test_its_flag_is_refused_with_another_executor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(registry.EXECUTORS, InOrderExecutor.name, InOrderExecutor)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "scenarios.yaml").write_text(SCENARIOS)
    code = main(["run", "--scenarios", "scenarios.yaml", "--device", "cpu", "--inorder-reverse"])
    err = capsys.readouterr().err
    assert code == 2
    assert err == "tunematrix: error: --inorder-reverse: only with --executor inorder\n"
    assert not (tmp_path / "results").exists()
