"""The shipped framework overlays dp, deepspeed-zero2 and deepspeed-zero3: their
accelerate configs, plans, commands, batch arithmetic, SLURM request, and the
child's check that the engine a config names is the one that trained.

DataParallel needs several GPUs, so the dp path is tested here up to the launch;
DeepSpeed runs for real on the CPU in tests/e2e/test_deepspeed_e2e.py.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from orchestrator.config.scenarios import load_config
from orchestrator.contract import columns as registry
from orchestrator.contract.errors import UserError
from orchestrator.contract.spec import RunSpec
from orchestrator.executors.slurm import SlurmSettings, shape
from orchestrator.job.command import job_env, launch_argv
from orchestrator.matrix.expand import Selection, build_plan
from orchestrator.matrix.experiment import Experiment
from orchestrator.matrix.frameworks import cpu_launch_flag, distributed_type, processes
from orchestrator.matrix.table import format_table, plan_rows
from orchestrator.results.collect import normalise
from orchestrator.running.needs import require
from trainer_entry.measure.engine import (
    check_devices,
    check_engine,
    configured_type,
    devices_per_process,
)
from trainer_entry.measure.steps import RankStats, summarize
from trainer_entry.spec_errors import SpecError

REPO = Path(__file__).resolve().parents[2]
SCENARIOS = REPO / "scenarios.yaml"
NEW = ("dp", "deepspeed-zero2", "deepspeed-zero3")


@pytest.fixture(scope="module")
def shipped():
    return load_config(SCENARIOS, defaults_file=REPO / "defaults.yaml")


def _plan(config, *filters: str, device: str, gpus: tuple[int, ...]) -> list[Experiment]:
    selection = Selection(device=device, num_gpus=gpus, filters=filters)
    return list(build_plan(config, selection, gpu_count=0).experiments)


# ---- the shipped configs ---------------------------------------------------------------


def test_each_new_framework_has_a_description_and_its_own_accelerate_config(shipped) -> None:
    for name in NEW:
        framework = shipped.frameworks[name]
        assert framework.accelerate is not None
        assert framework.accelerate.path == (REPO / f"accelerate-{name}.yaml").resolve()
    text = SCENARIOS.read_text()
    for name in NEW:
        block = text[text.index(f"  {name}:\n") :].split("accelerate_config")[0]
        assert "description:" in block, name
    dp = shipped.frameworks["dp"].accelerate
    # quoted: YAML 1.1 would read a bare NO as false
    assert dp.data["distributed_type"] == "NO" and dp.data["num_processes"] == 1


@pytest.mark.parametrize("stage", [2, 3])
def test_deepspeed_configs_leave_the_batch_to_the_trainer_and_keep_offload_commented(
    shipped, stage: int
) -> None:
    accelerate = shipped.frameworks[f"deepspeed-zero{stage}"].accelerate
    ds = accelerate.data["deepspeed_config"]
    assert accelerate.data["distributed_type"] == "DEEPSPEED"
    assert ds["zero_stage"] == stage
    # the plan's accumulation and the scenario's clipping, not numbers of the file
    assert ds["gradient_accumulation_steps"] == "auto"
    assert ds["gradient_clipping"] == "auto"
    assert ds["offload_optimizer_device"] == "none"
    assert ds["offload_param_device"] == "none"
    assert ds["zero3_init_flag"] is (stage == 3)
    text = accelerate.path.read_text()
    assert "# offload_optimizer_device: cpu" in text
    assert ("# offload_param_device: cpu" in text) is (stage == 3)


# ---- plans of the shipped file ---------------------------------------------------------


def test_every_shipped_scenario_plans_by_name_on_its_device(shipped) -> None:
    for scenario in shipped.scenarios:
        experiments = _plan(shipped, scenario.name, device=scenario.device, gpus=(1, 2))
        assert experiments, scenario.name
        for e in experiments:
            expected = 1 if e.framework == "dp" else e.num_gpus
            assert e.processes == expected, e.experiment_id
            assert e.per_device_train_batch_size * e.gradient_accumulation_steps * (e.num_gpus) == (
                e.effective_batch_size
            )
            RunSpec.model_validate(e.spec())  # a spec.json the child reads


def test_the_default_cpu_matrix_gains_no_cells(shipped) -> None:
    experiments = _plan(shipped, device="cpu", gpus=(1, 2))
    assert {e.scenario for e in experiments} == {
        "tiny-full-finetuning",
        "tiny-lora",
        "tiny-sft-vs-hf",
    }
    assert {e.framework for e in experiments} == {"ddp"}
    # the framework studies run only by name
    gpu = {e.scenario for e in _plan(shipped, device="gpu", gpus=(1, 2))}
    assert not gpu & {"zero2-vs-zero3-vs-fsdp", "dp-vs-ddp-lora", "tiny-deepspeed"}


def test_tiny_deepspeed_launches_the_configs_own_launcher_on_the_cpu(shipped) -> None:
    experiments = _plan(shipped, "tiny-deepspeed", device="cpu", gpus=(1, 2))
    frameworks = {e.framework for e in experiments}
    assert frameworks == {"ddp", "deepspeed-zero2", "deepspeed-zero3"}
    assert {e.num_gpus for e in experiments} == {2}
    assert {e.peft_method for e in experiments} == {"none", "lora"}
    for e in experiments:
        argv = launch_argv(e, Path("spec.json"), port=29500)
        assert argv[argv.index("--num_processes") + 1] == "2"
        if e.framework == "ddp":
            assert "--multi_gpu" in argv and "--cpu" not in argv
        else:
            # either flag would override the DeepSpeed config (silently: plain DDP)
            assert "--multi_gpu" not in argv and "--cpu" not in argv
            assert argv[argv.index("--config_file") + 1].endswith(f"accelerate-{e.framework}.yaml")


def test_a_one_process_deepspeed_cpu_launch_gets_no_cpu_flag(plan, write) -> None:
    write("ds.yaml", "distributed_type: DEEPSPEED\ndeepspeed_config: {zero_stage: 2}\n")
    (e,) = plan(
        """
        frameworks:
          z2: {accelerate_config: ds.yaml}
        scenarios:
          - name: a
            device: cpu
            framework_config: [z2]
            arguments: {model_name_or_path: tiny-llama, effective_batch_size: 4}
        """,
        device="cpu",
    ).experiments
    argv = launch_argv(e, Path("spec.json"), port=1)
    assert "--cpu" not in argv and "--multi_gpu" not in argv
    assert cpu_launch_flag(None, single=True) == "--cpu"
    assert cpu_launch_flag(None, single=False) == "--multi_gpu"


# ---- dp --------------------------------------------------------------------------------


def test_dp_is_one_process_driving_all_the_cells_gpus(shipped) -> None:
    experiments = _plan(shipped, "dp-vs-ddp-lora", device="gpu", gpus=(1, 2))
    by_framework = {e.framework: e for e in experiments if e.effective_batch_size == 8}
    dp, ddp = by_framework["dp"], by_framework["ddp"]
    assert (dp.num_gpus, dp.processes) == (2, 1)
    assert (ddp.num_gpus, ddp.processes) == (2, 2)
    # the batch arithmetic is unchanged: per GPU, the Trainer feeds per_device × n_gpu
    assert (dp.per_device_train_batch_size, dp.gradient_accumulation_steps) == (
        ddp.per_device_train_batch_size,
        ddp.gradient_accumulation_steps,
    )
    assert dp.per_device_train_batch_size * dp.gradient_accumulation_steps * 2 == 8
    argv = launch_argv(dp, Path("spec.json"), port=29500)
    assert argv[argv.index("--num_processes") + 1] == "1"
    assert "--multi_gpu" not in argv and "--cpu" not in argv
    assert argv[argv.index("--config_file") + 1] == str(REPO / "accelerate-dp.yaml")
    # the job sees both GPUs: DataParallel uses every GPU the process sees
    assert job_env(dp, ["0", "1"])["CUDA_VISIBLE_DEVICES"] == "0,1"
    spec = RunSpec.model_validate(dp.spec())
    assert (spec.num_gpus, spec.processes) == (2, 1)
    (row,) = [r for r in plan_rows(_as_plan(shipped, dp)) if r["experiment_id"] == dp.experiment_id]
    assert (row["num_gpus"], row["processes"]) == (2, 1)


def _as_plan(config, experiment: Experiment):
    return build_plan(
        config,
        Selection(device="gpu", num_gpus=(experiment.num_gpus,), filters=(experiment.scenario,)),
        gpu_count=0,
    )


def test_the_plan_table_shows_processes_only_where_they_differ_from_gpus(shipped) -> None:
    with_dp = format_table(
        _as_plan(shipped, _plan(shipped, "dp-vs-ddp-lora", device="gpu", gpus=(2,))[0])
    )
    assert "procs" in with_dp.splitlines()[0]
    without = format_table(
        build_plan(shipped, Selection(device="gpu", num_gpus=(2,), filters=("standard-peft",)), 0)
    )
    assert "procs" not in without.splitlines()[0]


def test_a_dp_slurm_job_is_one_task_with_all_its_gpus_on_one_node(shipped) -> None:
    dp = next(
        e for e in _plan(shipped, "dp-vs-ddp-lora", device="gpu", gpus=(2,)) if e.framework == "dp"
    )
    ddp = next(
        e for e in _plan(shipped, "dp-vs-ddp-lora", device="gpu", gpus=(2,)) if e.framework == "ddp"
    )
    # nodes, GPUs per node, CPUs per task (one task per node)
    assert shape(dp, SlurmSettings(), gpus_per_node=8) == (1, 2, 8)
    # nodes of one GPU: ddp spans two, dp cannot (the cluster check then refuses it)
    assert shape(ddp, SlurmSettings(), gpus_per_node=1) == (2, 1, 4)
    assert shape(dp, SlurmSettings(), gpus_per_node=1) == (1, 2, 8)


def test_dp_on_the_cpu_is_left_out_with_a_note_naming_the_scenario(plan, write) -> None:
    write("dp.yaml", "distributed_type: 'NO'\nnum_processes: 1\n")
    text = """
        frameworks:
          dp: {accelerate_config: dp.yaml}
        scenarios:
          - name: both
            device: cpu
            framework_config: [null, dp]
            arguments: {model_name_or_path: tiny-llama}
        """
    result = plan(text, device="cpu")
    assert {e.framework for e in result.experiments} == {"none"}
    (note,) = [n for n in result.notes if "framework dp" in n]
    assert "scenario 'both'" in note and "scenarios.yaml:4)" in note
    assert "the 1-process ddp cell" in note
    only = text.replace("[null, dp]", "[dp]")
    with pytest.raises(UserError, match=r"matrix is empty: framework dp is left out"):
        plan(only, device="cpu")


def test_frameworks_read_the_distributed_type_however_yaml_spelled_it(load, write) -> None:
    write("bare.yaml", "distributed_type: NO\n")  # YAML 1.2: the string NO, not false
    config = load(
        "frameworks:\n  b: {accelerate_config: bare.yaml}\n"
        "scenarios:\n  - name: a\n    framework_config: [b]\n"
        "    arguments: {model_name_or_path: m}\n"
    )
    accelerate = config.frameworks["b"].accelerate
    assert distributed_type(accelerate) == "NO"
    assert processes(accelerate, 4) == 1
    assert distributed_type(None) is None and processes(None, 4) == 4


# ---- what a run needs, and what the tables say -------------------------------------------


def test_a_missing_deepspeed_is_one_line(shipped) -> None:
    experiments = _plan(shipped, "tiny-deepspeed", device="cpu", gpus=(2,))
    with pytest.raises(UserError) as caught:
        require(experiments, "local", find=lambda m: None if m == "deepspeed" else object())
    message = str(caught.value)
    assert "\n" not in message
    assert message == (
        "not installed: deepspeed (for framework 'deepspeed-zero2' (distributed_type: "
        "DEEPSPEED): pip install 'tunematrix[deepspeed]'); nothing was started"
    )


def test_processes_is_a_plan_key_and_what_ran_is_a_child_column() -> None:
    assert "processes" in registry.KEY_COLUMNS
    for name in ("distributed_type", "zero_stage", "params_partitioned"):
        column = registry.find(name)
        assert column is not None and column.source == "child" and not column.key
        assert column.where == (name,)


def test_a_table_written_before_processes_existed_still_reads() -> None:
    import pandas as pd

    old = pd.DataFrame(
        [{"experiment_id": "a", "scenario": "s", "num_gpus": 2, "status": "ok", "cell_id": "a"}]
    )
    df = normalise(old)
    assert "processes" in df.columns and df["processes"].isna().all()


# ---- the child's side ------------------------------------------------------------------


def test_a_deepspeed_config_that_did_not_run_deepspeed_fails(tmp_path) -> None:
    config = tmp_path / "ds.yaml"
    config.write_text("distributed_type: DEEPSPEED\n")
    configured = configured_type(str(config))
    assert configured == "DEEPSPEED"
    with pytest.raises(
        SpecError, match="names distributed_type DEEPSPEED, but accelerate set up MULTI_CPU"
    ):
        check_engine(configured, "MULTI_CPU", on_gpu=False)
    with pytest.raises(SpecError, match="FSDP, but accelerate set up MULTI_GPU"):
        check_engine("FSDP", "MULTI_GPU", on_gpu=True)
    assert check_engine(configured, "DEEPSPEED", on_gpu=False) is None
    # DDP configs are whatever accelerate makes of them (NO with one process)
    assert check_engine("MULTI_GPU", "NO", on_gpu=False) is None
    # accelerate runs FSDP on GPUs only: a CPU run goes on, saying so
    note = check_engine("FSDP", "MULTI_CPU", on_gpu=False)
    assert note is not None and "GPUs only" in note
    bare = tmp_path / "dp.yaml"
    bare.write_text("distributed_type: NO\n")
    assert configured_type(str(bare)) == "NO"
    assert configured_type(None) is None
    assert configured_type(str(tmp_path / "gone.yaml")) is None


def test_a_gpu_run_must_train_on_the_gpus_its_cell_counts() -> None:
    check_devices(2, 1, 2, on_gpu=True)  # dp: one process, two GPUs
    check_devices(2, 2, 1, on_gpu=True)  # ddp
    check_devices(2, 2, 1, on_gpu=False)  # the CPU counts processes
    check_devices(None, 1, 1, on_gpu=True)  # a spec by hand
    with pytest.raises(SpecError, match="the cell is for 2 GPU"):
        check_devices(2, 1, 1, on_gpu=True)

    class Args:
        n_gpu = 2

    assert devices_per_process(Args(), on_gpu=True) == 2
    assert devices_per_process(Args(), on_gpu=False) == 1
    assert devices_per_process(object(), on_gpu=True) == 1


def test_per_device_figures_divide_by_gpus_not_processes() -> None:
    # one DataParallel process fed 100 tokens a step over two GPUs
    rank = RankStats(
        rank=0, step_times_s=[1.0] * 5, step_tokens=[100] * 5, step_padded_tokens=[100] * 5
    )
    one = summarize([rank], warmup=1)
    dp = summarize([rank], warmup=1, devices=2)
    assert one["tokens_per_second_global"] == dp["tokens_per_second_global"] == 100
    assert dp["tokens_per_second_per_device"] == 50
    assert math.isclose(one["tokens_per_second_per_device"], 100)


def _zero3(module, share: int):
    """Mark ``module``'s parameters as ZeRO-3 would: empty, a shard of ``share`` kept aside."""
    import torch

    for p in module.parameters():
        p.ds_numel = p.numel()
        p.ds_shape = tuple(p.shape)
        p.ds_tensor = torch.zeros(min(share, p.numel()))
        p.data = torch.empty(0)
    return module


def test_zero3_partitioning_is_read_from_the_parameters() -> None:
    import torch

    from trainer_entry.measure.engine import (
        built_by_zero_init,
        params_partitioned,
        partitioned_flops_problem,
    )

    whole = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
    assert not params_partitioned(whole) and not built_by_zero_init(whole)
    sharded = _zero3(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2)), 4)
    assert params_partitioned(sharded) and built_by_zero_init(sharded)
    # one rank holding every shard whole (one process) is not partitioned
    alone = _zero3(torch.nn.Sequential(torch.nn.Linear(8, 8)), 1000)
    assert not params_partitioned(alone) and built_by_zero_init(alone)
    # linear layers keep in/out features; a convolution's FLOPs come from its emptied weight
    assert partitioned_flops_problem(sharded) is None
    conv = _zero3(torch.nn.Sequential(torch.nn.Conv2d(3, 4, 2), torch.nn.Linear(4, 2)), 4)
    problem = partitioned_flops_problem(conv)
    assert problem is not None and "Conv2d" in problem


def test_the_seed_is_set_again_before_the_model_is_built() -> None:
    import torch

    from trainer_entry.measure.engine import seed_before_load

    class Args:
        seed = 7

    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.rand(5)  # what a framework's setup may draw
    seed_before_load(Args())
    assert torch.equal(torch.rand(3), expected)
    seed_before_load(object())  # a backend without a seed: nothing to do
