"""The executor seam: the registry, each executor's flags and file section, the run context,
and that nothing outside an executor branches on its name."""

from __future__ import annotations

import ast
import io
import json
from pathlib import Path

import pytest

from orchestrator.api import choose_executor
from orchestrator.cli.app import build_parser
from orchestrator.contract.errors import UserError
from orchestrator.contract.layout import ResultsLayout
from orchestrator.contract.outcome import Outcome, read_outcome, write_outcome
from orchestrator.executors import registry
from orchestrator.executors.base import Executor, ExecutorSection, Flags, RunContext
from orchestrator.executors.console import Progress
from orchestrator.executors.local import LocalExecutor
from orchestrator.executors.packed import PackedExecutor
from orchestrator.executors.raycluster import RayModel
from orchestrator.executors.slurm import SlurmExecutor, SlurmModel
from orchestrator.job.execute import RunOptions

REPO = Path(__file__).resolve().parents[2]
ORCHESTRATOR = REPO / "orchestrator"


def _choose(*argv: str) -> type[Executor]:
    return choose_executor(build_parser().parse_args(["run", *argv]))


def test_the_flags_choose_the_executor() -> None:
    assert _choose() is LocalExecutor
    assert _choose("--pack") is PackedExecutor
    assert _choose("--executor", "packed", "--slots", "2") is PackedExecutor
    assert _choose("--executor", "slurm", "--no-wait") is SlurmExecutor


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--slots", "2"], "--slots only has a meaning with --pack"),
        (["--executor", "slurm", "--pack"], "--pack is for one machine; SLURM schedules"),
        (["--slurm-mem", "2G", "--array"], "--slurm-mem, --array: only with --executor slurm"),
        (["--pack", "--slurm-time", "5"], "--slurm-time: only with --executor slurm"),
    ],
)
def test_flags_where_they_mean_nothing(argv: list[str], message: str) -> None:
    with pytest.raises(UserError, match=message):
        _choose(*argv)


def test_every_section_is_a_key_of_the_scenarios_file(load) -> None:
    assert registry.sections() == {"slurm": SlurmModel, "ray": RayModel}
    config = load(
        "slurm: {partition: gpu}\n"
        "scenarios:\n  - name: a\n    arguments: {model_name_or_path: tiny-llama}\n"
    )
    assert config.section("slurm") == SlurmModel(partition="gpu")
    assert config.section("local") is None


class _Tagged(Executor):
    """An executor with a flag and a section, registered only for a test."""

    name = "tagged"
    title = "tagged"
    summary = "run nowhere (a test's)"

    class Section(ExecutorSection):
        tag: str = "none"

    section = Section

    def __init__(self, tag: str) -> None:
        self.tag = tag

    @classmethod
    def add_flags(cls, flags: Flags) -> None:
        flags.add_argument("--tag", help="a tag")

    @classmethod
    def from_args(cls, args, section):  # type: ignore[no-untyped-def]
        return cls(args.tag or (section.tag if section else "none"))

    def run(self, ctx: RunContext) -> None:
        raise AssertionError("not run in this test")


def test_one_registry_line_adds_the_flags_and_the_file_section(
    monkeypatch: pytest.MonkeyPatch, load
) -> None:
    monkeypatch.setitem(registry.EXECUTORS, _Tagged.name, _Tagged)
    assert _choose("--executor", "tagged", "--tag", "x") is _Tagged
    with pytest.raises(UserError, match="--tag: only with --executor tagged"):
        _choose("--tag", "x")
    config = load(
        "tagged: {tag: y}\nscenarios:\n  - name: a\n    arguments: {model_name_or_path: tiny-llama}\n"
    )
    made = _Tagged.from_args(build_parser().parse_args(["run"]), config.section("tagged"))
    assert isinstance(made, _Tagged) and made.tag == "y"
    from orchestrator.contract.errors import ConfigError

    with pytest.raises(ConfigError, match="tagged: unknown key 'tga'; allowed: tag"):
        load(
            "tagged: {tga: y}\nscenarios:\n  - name: a\n    arguments: {model_name_or_path: tiny-llama}\n"
        )


def test_a_name_is_registered_once() -> None:
    class Other(LocalExecutor):
        pass

    with pytest.raises(ValueError, match="'local' is already registered"):
        registry.register(Other)
    with pytest.raises(UserError, match="unknown executor 'nope'; executors: local, packed, slurm"):
        registry.get("nope")


def _context(tmp_path: Path, plan, **options) -> RunContext:  # type: ignore[no-untyped-def]
    return RunContext(
        plan,
        ResultsLayout(tmp_path),
        RunOptions(**options),
        Progress(len(plan.experiments), stream=io.StringIO()),
        say=lambda line: None,
    )


GPU_SCENARIO = "scenarios:\n  - name: a\n    arguments: {model_name_or_path: tiny-llama}\n"


def test_prepare_skips_what_is_ok_on_resume_and_keeps_earlier_attempts(tmp_path, plan) -> None:
    the_plan = plan(GPU_SCENARIO, num_gpus=[2], effective_batch_size=[4])
    (experiment,) = the_plan.experiments
    run = ResultsLayout(tmp_path).run(experiment.experiment_id)
    run.dir.mkdir(parents=True)
    run.result.write_text(json.dumps({"status": "ok"}))
    write_outcome(run, Outcome(status="ok", job_s=3.0, executor="slurm", job_id="7"))
    ctx = _context(tmp_path, the_plan, resume=True)
    assert ctx.prepare(experiment, gpus=8) is None
    skipped = ctx.outcomes[experiment.experiment_id]
    assert (skipped.status, skipped.job_s, skipped.job_id) == ("skipped", 3.0, "7")
    # without resume: the earlier files go to attempts/1, this is attempt 2
    fresh = _context(tmp_path, the_plan)
    ready = fresh.prepare(experiment, gpus=8)
    assert ready is not None and ready.attempt == 2
    assert (run.attempts / "1" / "outcome.json").is_file()


def test_prepare_fails_what_needs_more_gpus_than_the_executor_has(tmp_path, plan) -> None:
    the_plan = plan(GPU_SCENARIO, num_gpus=[2], effective_batch_size=[4])
    (experiment,) = the_plan.experiments
    ctx = _context(tmp_path, the_plan)
    assert ctx.prepare(experiment, gpus=1) is None
    outcome = read_outcome(ResultsLayout(tmp_path).run(experiment.experiment_id))
    assert outcome is not None and outcome.status == "failed"
    assert outcome.error == "needs 2 GPU(s); 1 visible to the orchestrator"
    # an executor that does not count GPUs here (a cluster's) lets it through
    assert _context(tmp_path / "other", the_plan).prepare(experiment, gpus=None) is not None


# ---------------------------------------------------------------------------
# Nothing outside an executor's own modules branches on its name
# ---------------------------------------------------------------------------


def _modules_outside(*inside: str) -> list[Path]:
    return [
        p
        for p in ORCHESTRATOR.rglob("*.py")
        if not any(p.is_relative_to(ORCHESTRATOR / part) for part in inside)
    ]


def _strings_and_imports(path: Path) -> tuple[list[str], list[str]]:
    tree = ast.parse(path.read_text())
    strings = [
        n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
    ]
    imports = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)] + [
        a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names
    ]
    return strings, imports


def test_only_the_slurm_executor_and_the_registry_know_slurm() -> None:
    for path in _modules_outside("executors/slurm", "executors/registry.py"):
        strings, imports = _strings_and_imports(path)
        where = path.relative_to(REPO)
        assert not [m for m in imports if m.startswith("orchestrator.executors.slurm")], where
        # its name and its file names (docstrings, which describe, may mention it; the
        # column name of older tables, ``slurm_job_id``, is an alias of ``job_id``)
        named = [s for s in strings if s.lower() in ("slurm", "slurm.json", "sbatch", "squeue")]
        assert not named, (where, named)


def test_the_runner_never_branches_on_an_executor_name() -> None:
    strings, _ = _strings_and_imports(ORCHESTRATOR / "running" / "runner.py")
    assert not set(strings) & set(registry.EXECUTORS)
