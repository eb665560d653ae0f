"""GPU memory stages without HF's polling thread, the loading peak apart from training's,
and where a ``config:`` model is built under FSDP. No GPU: torch.cuda's counters are faked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from orchestrator.contract.choices import MEMORY_LOGGING
from orchestrator.contract.spec import RunSpec, read_spec
from orchestrator.results.rows import build_row, to_csv
from trainer_entry.measure.memory import (
    MemoryCounters,
    MemoryReading,
    hf_stage_memory,
    memory_stages,
    stage_memory_figures,
)
from trainer_entry.models.load import Placement, config_placement, fsdp_loading
from trainer_entry.tasks.causal_lm import CausalLMTask


class FakeCuda:
    """torch.cuda's caching allocator counters, as far as the measurement reads them."""

    def __init__(self) -> None:
        self.now = 0
        self.peak = 0

    def alloc(self, n: int) -> None:
        self.now += n
        self.peak = max(self.peak, self.now)

    def free(self, n: int) -> None:
        self.now -= n

    def spike(self, n: int) -> None:
        """A temporary allocation, freed again."""
        self.alloc(n)
        self.free(n)

    def memory_allocated(self, device: object = None) -> int:
        return self.now

    def max_memory_allocated(self, device: object = None) -> int:
        return self.peak

    def reset_peak_memory_stats(self, device: object = None) -> None:
        self.peak = self.now


def counters(cuda: FakeCuda) -> MemoryCounters:
    return MemoryCounters(
        cuda.memory_allocated, cuda.max_memory_allocated, cuda.reset_peak_memory_stats
    )


def test_stage_figures_by_hand() -> None:
    readings = {
        "load_begin": MemoryReading(allocated=0, peak=0),
        # model load: 1000 kept, peaked at 1500
        "init_begin": MemoryReading(allocated=1000, peak=1500),
        # Trainer built: 200 more kept, peaked 300 above that
        "init_end": MemoryReading(allocated=1200, peak=1500),
        # train() before its first step (FSDP wrapping): a spike to 4000
        "train_begin": MemoryReading(allocated=1200, peak=4000),
        # training: 600 more kept (optimizer state), peaked at 3800
        "train_end": MemoryReading(allocated=1800, peak=3800),
    }
    figures = memory_stages(readings)
    assert figures == {
        "before_init_mem_gpu": 1000,
        "init_mem_gpu_alloc_delta": 200,
        "init_mem_gpu_peaked_delta": 300,
        "train_mem_gpu_alloc_delta": 600,
        # HF's train stage is all of train(): the wrapping spike is in it
        "train_mem_gpu_peaked_delta": 4000 - 1800,
        "mem_load_peak_bytes": 4000,
    }
    # the predecessor's sums: allocated 1000, 1200, 1800; peaks 1000, 1500, 4000
    assert hf_stage_memory({k: v for k, v in figures.items() if v is not None}) == (4000, 1800)


def test_stage_figures_are_none_without_their_points() -> None:
    assert set(memory_stages({}).values()) == {None}
    only_init = memory_stages(
        {"init_begin": MemoryReading(10, 10), "init_end": MemoryReading(30, 50)}
    )
    assert only_init["init_mem_gpu_alloc_delta"] == 20
    assert only_init["train_mem_gpu_alloc_delta"] is None
    assert only_init["mem_load_peak_bytes"] is None


def test_counters_reset_the_peak_except_where_told_not_to() -> None:
    cuda = FakeCuda()
    c = counters(cuda)
    c.mark("load_begin")
    cuda.alloc(1000)
    cuda.spike(500)
    c.mark("init_begin")
    assert c.readings["init_begin"] == MemoryReading(1000, 1500)
    assert cuda.max_memory_allocated() == 1000  # reset
    cuda.spike(2000)
    c.mark("train_end", reset=False)
    assert cuda.max_memory_allocated() == 3000  # kept for the training peak


def test_counters_give_what_hf_tracker_gives(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same allocations, measured once by HF's TrainerMemoryTracker and once by the
    counters read where the child reads them, give the same stage figures."""
    import transformers.trainer_utils as tu

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(tu, "is_torch_cuda_available", lambda: True)

    def one_run(use_hf: bool) -> tuple[dict[str, float], MemoryCounters, FakeCuda]:
        cuda = FakeCuda()
        for name in ("memory_allocated", "max_memory_allocated", "reset_peak_memory_stats"):
            monkeypatch.setattr(torch.cuda, name, getattr(cuda, name))
        ours = counters(cuda)
        tracker = tu.TrainerMemoryTracker(skip_memory_metrics=not use_hf)

        class Trainer:
            # HF's tracker names its stage after the calling function: __init__ and train
            def __init__(self) -> None:
                tracker.start()
                cuda.alloc(200)  # the model moved to the device
                cuda.spike(300)
                tracker.stop_and_update_metrics()

            def train(self) -> dict[str, float]:
                tracker.start()
                cuda.spike(2500)  # wrapping before the first step
                if not use_hf:
                    ours.mark("train_begin")  # on_train_begin
                cuda.alloc(600)  # optimizer state
                cuda.spike(1400)  # activations
                metrics: dict[str, float] = {}
                tracker.stop_and_update_metrics(metrics)
                if not use_hf:
                    ours.mark("train_end", reset=False)  # on_train_end
                return metrics

        ours.mark("load_begin")
        cuda.alloc(1000)  # the model loaded
        cuda.spike(500)
        ours.mark("init_begin")
        trainer = Trainer()
        ours.mark("init_end")
        return trainer.train(), ours, cuda

    hf, _, _ = one_run(use_hf=True)
    no_metrics, ours, cuda = one_run(use_hf=False)
    assert no_metrics == {}
    gpu = {k: v for k, v in hf.items() if "_mem_gpu" in k}
    assert len(gpu) == 5
    assert {k: v for k, v in memory_stages(ours.readings).items() if k in gpu} == gpu
    assert memory_stages(ours.readings)["mem_load_peak_bytes"] == 1200 + 2500
    # the training peak excludes loading and wrapping: reset at on_train_begin
    assert cuda.max_memory_allocated() == 1200 + 600 + 1400


def test_the_spec_names_the_one_source_of_the_stage_figures() -> None:
    counted = {
        "before_init_mem_gpu": 100,
        "init_mem_gpu_alloc_delta": 0,
        "init_mem_gpu_peaked_delta": 0,
        "train_mem_gpu_alloc_delta": 50,
        "train_mem_gpu_peaked_delta": 25,
        "mem_load_peak_bytes": 999,
    }
    hf = {"before_init_mem_gpu": 7, "train_mem_gpu_alloc_delta": 1, "train_runtime": 3.0}
    torch_fig = stage_memory_figures("torch", hf, counted)
    assert torch_fig["mem_stage_source"] == "torch.cuda counters"
    assert torch_fig["mem_peak_torch_mem_alloc_in_bytes"] == 175
    assert torch_fig["mem_torch_mem_alloc_in_bytes"] == 150
    assert "mem_load_peak_bytes" not in torch_fig["stages"]
    hf_fig = stage_memory_figures("hf-tracker", hf, counted)
    assert hf_fig["mem_stage_source"] == "hf TrainerMemoryTracker"
    assert hf_fig["mem_torch_mem_alloc_in_bytes"] == 8
    # HF's tracker asked for but silent (no psutil, or the CPU): no figures, no source
    assert (
        stage_memory_figures("hf-tracker", {"train_runtime": 3.0}, counted)["mem_stage_source"]
        is None
    )
    # on the CPU the counters are not read: every figure None
    cpu = stage_memory_figures("torch", hf, memory_stages({}))
    assert cpu["mem_peak_torch_mem_alloc_in_bytes"] is None and cpu["mem_stage_source"] is None
    assert stage_memory_figures(None, hf, counted)["mem_torch_mem_alloc_in_bytes"] is None


@pytest.mark.parametrize(
    ("logging", "sidecar", "stages"),
    [
        ("all", True, "torch"),
        ("nvidia", True, None),
        ("huggingface", False, "torch"),
        ("hf-tracker", True, "hf-tracker"),
    ],
)
def test_memory_logging_values(logging: str, sidecar: bool, stages: str | None) -> None:
    assert MEMORY_LOGGING[logging] == (sidecar, stages)


def test_default_memory_logging_does_not_run_hf_tracker(tmp_path: Path) -> None:
    """What the parent writes by default, read by the child: skip_memory_metrics stays on."""
    from orchestrator.job.execute import RunOptions
    from trainer_entry.backends.hf import training_arguments
    from trainer_entry.run.parse import parse_arguments

    stages = MEMORY_LOGGING[RunOptions().memory_logging][1]
    spec = RunSpec(memory_stages=stages, output_dir=str(tmp_path))
    parsed = parse_arguments(
        spec.model_copy(update={"arguments": {"model_name_or_path": "m", "trainer": "hf"}})
    )
    assert training_arguments(spec, parsed, on_gpu=True).skip_memory_metrics is True
    by_name = spec.model_copy(update={"memory_stages": "hf-tracker"})
    assert training_arguments(by_name, parsed, on_gpu=True).skip_memory_metrics is False
    assert training_arguments(by_name, parsed, on_gpu=False).skip_memory_metrics is True


@pytest.mark.parametrize(
    ("old", "new"), [({"hf_memory_metrics": True}, "torch"), ({"hf_memory_metrics": False}, None)]
)
def test_old_spec_files_still_read(tmp_path: Path, old: dict, new: str | None) -> None:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps({"arguments": {"model_name_or_path": "m"}, **old}))
    assert read_spec(path).memory_stages == new
    assert RunSpec().memory_stages == "torch"


def test_a_bad_old_memory_flag_is_one_clear_line(tmp_path: Path) -> None:
    from orchestrator.contract.errors import UserError

    path = tmp_path / "spec.json"
    path.write_text(json.dumps({"hf_memory_metrics": "yes"}))
    with pytest.raises(UserError, match=r"spec\.json: .*hf_memory_metrics must be true or false"):
        read_spec(path)
    path.write_text(json.dumps({"memory_stages": "nvml"}))
    with pytest.raises(UserError, match=r"spec\.json: memory_stages: Input should be 'torch'"):
        read_spec(path)


def test_summary_carries_the_loading_peak_and_the_stage_source() -> None:
    spec = {"experiment_id": "x", "arguments": {}}
    result = {
        "metrics": {
            "mem_load_peak_bytes": 4000,
            "mem_stage_source": "torch.cuda counters",
            "torch_max_memory_allocated_bytes": 2200,
        }
    }
    row = build_row(spec, {"status": "ok"}, result)
    assert row["mem_load_peak_bytes"] == 4000
    assert row["mem_stage_source"] == "torch.cuda counters"
    header = to_csv([row]).splitlines()[0].split(",")
    assert {"mem_load_peak_bytes", "mem_stage_source"} <= set(header)


@pytest.mark.parametrize(
    ("env", "argument", "expected"),
    [
        ({}, None, (False, False)),
        ({"ACCELERATE_USE_FSDP": "true"}, None, (True, False)),
        (
            {"ACCELERATE_USE_FSDP": "true", "FSDP_CPU_RAM_EFFICIENT_LOADING": "true"},
            None,
            (True, True),
        ),
        ({"FSDP_CPU_RAM_EFFICIENT_LOADING": "true"}, None, (False, False)),
        ({"FSDP_CPU_RAM_EFFICIENT_LOADING": "True"}, True, (True, True)),
        ({"ACCELERATE_USE_FSDP": "false"}, "", (False, False)),
    ],
)
def test_fsdp_is_read_from_the_launch(env: dict, argument: object, expected: tuple) -> None:
    assert fsdp_loading(env, argument) == expected


def test_config_models_are_built_on_the_cpu_under_fsdp() -> None:
    # DDP or one GPU: whole on this rank's GPU, as before
    assert config_placement(on_gpu=True, fsdp=False, broadcast=False, rank=1) == Placement("cuda")
    # FSDP: never whole on a GPU (FSDP moves it shard by shard); drawn there a module at a time
    drawn_on_gpu = Placement("cpu", init_weights=True, draw_on_gpu=True)
    assert config_placement(on_gpu=True, fsdp=True, broadcast=False, rank=1) == drawn_on_gpu
    # rank 0's weights are broadcast: only rank 0 draws them
    assert config_placement(on_gpu=True, fsdp=True, broadcast=True, rank=0) == drawn_on_gpu
    assert config_placement(on_gpu=True, fsdp=True, broadcast=True, rank=1) == Placement(
        "cpu", init_weights=False
    )
    assert config_placement(on_gpu=False, fsdp=True, broadcast=True, rank=1) == Placement("cpu")


def test_a_rank_that_does_not_draw_weights_keeps_correct_buffers(tmp_path: Path) -> None:
    """Skipped weights are overwritten by rank 0's broadcast; buffers that are not
    broadcast (rotary frequencies) must still be right."""
    from trainer_entry.models.load import load_model
    from trainer_entry.run.parse import ModelConfig, PeftConfig

    arch = tmp_path / "arch.json"
    arch.write_text(
        json.dumps(
            {
                "model_type": "llama",
                "hidden_size": 32,
                "intermediate_size": 64,
                "num_hidden_layers": 1,
                "num_attention_heads": 2,
                "num_key_value_heads": 2,
                "vocab_size": 1024,
            }
        )
    )
    cfg = ModelConfig(name=f"config:{arch}")
    drawn = load_model(cfg, PeftConfig(), on_gpu=False, local_rank=0, task=CausalLMTask())
    skipped = load_model(
        cfg,
        PeftConfig(),
        on_gpu=False,
        local_rank=0,
        placement=Placement("cpu", False),
        task=CausalLMTask(),
    )
    assert (drawn.info["built_on"], drawn.info["weights_drawn"]) == ("cpu", True)
    assert skipped.info["weights_drawn"] is False
    for (name, a), (_, b) in zip(
        drawn.model.named_buffers(), skipped.model.named_buffers(), strict=True
    ):
        assert torch.equal(a, b), name


def test_weights_drawn_a_module_at_a_time_are_the_models_own(tmp_path: Path) -> None:
    """draw_weights gives an uninitialised model what its own init gives (the same
    distributions, the same buffers), and leaves every tensor where it was."""
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.initialization import no_init_weights

    from trainer_entry.models.load import draw_weights

    config = AutoConfig.for_model(
        "llama",
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=4096,
        initializer_range=0.05,
    )
    torch.manual_seed(0)
    reference = AutoModelForCausalLM.from_config(config)
    with no_init_weights():
        model = AutoModelForCausalLM.from_config(config)
    for p in model.parameters():
        p.data.fill_(7.0)  # what an uninitialised tensor may hold
    # the meta device holds nothing: drawing there would leave the weights at 7
    draw_weights(model, "cpu")
    ours, theirs = dict(model.named_parameters()), dict(reference.named_parameters())
    assert ours.keys() == theirs.keys()
    for name, p in ours.items():
        assert p.device.type == "cpu", name
        if p.dim() == 1:  # norms: ones
            assert torch.equal(p, theirs[name]), name
        else:
            assert abs(p.std().item() - 0.05) < 0.005 and abs(p.mean().item()) < 0.005, name
    for (name, a), (_, b) in zip(model.named_buffers(), reference.named_buffers(), strict=True):
        assert torch.equal(a, b), name
    if config.tie_word_embeddings:
        assert model.lm_head.weight is model.model.embed_tokens.weight


@pytest.mark.parametrize("reset_at_begin", [True, False], ids=["torch", "hf-tracker"])
def test_the_hooks_read_the_counters_where_training_starts_and_ends(reset_at_begin: bool) -> None:
    """What every backend's trainer reports through StepHooks: training's peak is its own,
    unless HF's tracker (which measures all of train()) is the source."""
    from trainer_entry.data.collate import BatchCounts
    from trainer_entry.measure.hooks import StepHooks
    from trainer_entry.measure.steps import StepRecorder

    cuda = FakeCuda()
    c = counters(cuda)
    recorder = StepRecorder(0, clock=iter(range(100)).__next__)
    recorder.windows = ()
    hooks = StepHooks(recorder, c, reset_peak_at_begin=reset_at_begin)
    cuda.alloc(1000)
    cuda.spike(3000)  # loading and wrapping
    hooks.train_begin(max_steps=2)
    assert c.readings["train_begin"] == MemoryReading(1000, 4000)
    for _ in range(2):
        hooks.batch(None, BatchCounts(real=6, padded=8, lengths=[4, 2]))
        cuda.spike(500)  # activations
        hooks.step_end(global_step=1)
    hooks.train_end(global_step=2)
    assert c.readings["train_end"].allocated == 1000
    assert cuda.max_memory_allocated() == (1500 if reset_at_begin else 4000)
    assert recorder.stats.step_tokens == [6, 6] and recorder.stats.step_padded_tokens == [8, 8]
    assert recorder.stats.step_sq_tokens == [20, 20] and recorder.stats.step_rows == [2, 2]
