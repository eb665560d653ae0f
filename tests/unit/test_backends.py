"""The trainer-backend seam: the registry, the backend's arguments, and a backend added in one module."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from orchestrator.contract import trainers
from orchestrator.contract.applicability import BACKEND_KEY, inapplicable_argument, unknown_argument
from orchestrator.contract.result import load_result
from orchestrator.contract.spec import RunSpec
from orchestrator.contract.trainers import Trainer, trainer_names
from trainer_entry import backends
from trainer_entry.backends.trainer_protocol import TrainerBackend, TrainOutput, TrainSettings
from trainer_entry.run.parse import ParsedArguments, parse_arguments
from trainer_entry.spec_errors import SpecError


def test_the_default_backend_is_sft_and_a_name_must_be_registered() -> None:
    assert backends.backend_name({}) == backends.DEFAULT_BACKEND == "sft"
    assert backends.backend_name({BACKEND_KEY: None}) == "sft"
    assert backends.backend_name({BACKEND_KEY: "hf"}) == "hf"
    with pytest.raises(SpecError, match=r"^trainer must be one of sft, hf, got 'trl'$"):
        backends.backend_name({BACKEND_KEY: "trl"})
    with pytest.raises(SpecError, match=r"got 3$"):
        backends.backend_name({BACKEND_KEY: 3})


@pytest.mark.parametrize("name", trainer_names())
def test_every_registered_backend_loads_and_has_the_protocol(name: str) -> None:
    backend = backends.get_backend(name)
    for method in ("argument_fields", "configure", "build"):
        assert callable(getattr(backend, method)), f"{name} has no {method}"
    assert "max_steps" in backend.argument_fields()


def test_trainer_backend_is_an_argument_the_parent_accepts_and_the_trainer_never_sees() -> None:
    assert unknown_argument(BACKEND_KEY) is None  # planning does not refuse it
    parsed = parse_arguments(
        RunSpec(arguments={"model_name_or_path": "m", "max_steps": 2, BACKEND_KEY: "hf"})
    )
    assert parsed.backend == "hf" and parsed.training == {"max_steps": 2}
    with pytest.raises(SpecError, match="trainer must be one of"):
        parse_arguments(RunSpec(arguments={"model_name_or_path": "m", BACKEND_KEY: "nope"}))
    # the preflight check (names unchecked, no training stack) refuses it too
    with pytest.raises(SpecError, match="trainer must be one of"):
        parse_arguments(
            RunSpec(arguments={"model_name_or_path": "m", BACKEND_KEY: "nope"}), check_names=False
        )


def test_hf_settings_are_what_the_trainer_arguments_say(tmp_path: Path) -> None:
    backend = backends.get_backend("hf")
    spec = RunSpec(
        output_dir=str(tmp_path),
        arguments={
            "model_name_or_path": "m",
            BACKEND_KEY: "hf",
            "per_device_train_batch_size": 3,
            "gradient_accumulation_steps": 4,
            "activation_checkpointing": True,
        },
    )
    settings = backend.configure(spec, parse_arguments(spec), on_gpu=False)
    assert settings.per_device_train_batch_size == 3
    assert settings.gradient_accumulation_steps == 4
    assert settings.activation_checkpointing is True
    assert settings.mixed_precision == "no" and settings.tf32 is None and not settings.fsdp
    assert settings.native.output_dir == str(tmp_path) and settings.native.use_cpu is True
    bad = spec.model_copy(
        update={"arguments": {"model_name_or_path": "m", BACKEND_KEY: "hf", "optim": "nope"}}
    )
    with pytest.raises(
        SpecError,
        match=r"^invalid trainer arguments \(transformers [0-9.]+.s TrainingArguments\): .*nope",
    ):
        backend.configure(bad, parse_arguments(bad), on_gpu=False)


# ---------------------------------------------------------------------------
# A second backend, all in this module: a plain PyTorch loop
# ---------------------------------------------------------------------------


class _Loop:
    def __init__(self, model: Any, batches: list[dict[str, Any]], hooks: Any, lr: float) -> None:
        self.model, self.batches, self.hooks, self.lr = model, batches, hooks, lr

    def train(self) -> TrainOutput:
        import torch

        from trainer_entry.data.collate import pop_counts

        optimizer = torch.optim.SGD(self.model.parameters(), lr=self.lr)
        start, log = time.perf_counter(), []
        self.hooks.train_begin(len(self.batches))
        for step, batch in enumerate(self.batches, 1):
            self.hooks.batch(self.model, pop_counts(batch))
            loss = self.model(**batch).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            log.append({"step": step, "loss": float(loss.detach())})
            self.hooks.step_end(step)
        self.hooks.train_end(len(self.batches))
        runtime = time.perf_counter() - start
        return TrainOutput({"train_runtime": runtime, "train_loss": log[-1]["loss"]}, log)


class LoopBackend(TrainerBackend):
    """What a new backend module holds: its arguments, its settings, its trainer (the
    rest, such as its eval set and data settings, the Hugging Face defaults)."""

    def argument_fields(self) -> frozenset[str]:
        return frozenset({"max_steps", "per_device_train_batch_size", "learning_rate"})

    def configure(self, spec: RunSpec, parsed: ParsedArguments, *, on_gpu: bool) -> TrainSettings:
        return TrainSettings(
            per_device_train_batch_size=parsed.training.get("per_device_train_batch_size", 1),
            gradient_accumulation_steps=1,
            activation_checkpointing=False,
            fsdp=None,
            mixed_precision=None,
            tf32=None,
            native=parsed.training,
        )

    def build(
        self,
        settings: TrainSettings,
        *,
        model: Any,
        tokenizer: Any,
        task: Any,
        data: Any,
        parsed: ParsedArguments,
        hooks: Any,
    ) -> _Loop:
        from trainer_entry.data.collate import Collator, SequenceDataset

        rows, pd = SequenceDataset(data.examples), settings.per_device_train_batch_size
        collate = Collator(tokenizer.pad_token_id)
        batches = [
            collate([rows[i * pd + j] for j in range(pd)])
            for i in range(settings.native["max_steps"])
        ]
        return _Loop(model, batches, hooks, settings.native.get("learning_rate", 1e-3))


def test_a_backend_is_one_module_and_one_registry_line(
    tmp_path: Path, tiny_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trainer_entry.run import train

    # the one registry line: its name, the tasks it trains, its module
    loop = Trainer("loop", ("causal-lm",), f"{__name__}:LoopBackend", library="a plain loop")
    monkeypatch.setattr(trainers, "TRAINERS", (*trainers.TRAINERS, loop))
    # the planner knows it from that line: for the tasks it trains, and for no other
    assert (
        inapplicable_argument("trainer", "loop", task="causal-lm", backend="", arguments={}) is None
    )
    problem = inapplicable_argument(
        "trainer", "loop", task="seq-classification", backend="", arguments={}
    )
    assert problem is not None and problem.line == (
        "trainer loop does not train task seq-classification; it runs with hf "
        "(remove trainer for the default, hf)"
    )
    # the reason apart from what to do, for the note on a setting left out
    assert problem.why == "trainer loop does not train task seq-classification"
    spec = RunSpec(
        device="cpu",
        arguments={
            "model_name_or_path": "tiny-llama",
            BACKEND_KEY: "loop",
            "max_steps": 4,
            "per_device_train_batch_size": 2,
            "max_seq_len": 64,
            "warmup_steps_excluded": 1,
        },
    ).resolve(tmp_path)
    result = train.run(spec, {}, time.time())
    assert result is not None and result.status == "ok"
    assert result.per_device_train_batch_size == 2 and result.effective_batch_size == 2
    # the measurement is the child's own, whichever backend trained
    assert result.metrics is not None and result.metrics.steps == 4
    assert result.metrics.steps_measured == 3 and result.metrics.tokens_per_second_global
    assert result.metrics.loss_last == result.metrics.train_loss
    assert result.ranks is not None and sum(result.ranks[0].step_rows) == 8
    assert result.metrics.flops_per_token is not None
    progress = json.loads(Path(spec.progress_path or "").read_text())
    assert progress["step"] == 4 and progress["phase"] == "done"
    assert load_result(Path(spec.result_path)) == result
    # its arguments are its own: a TrainingArguments field it does not take is refused
    spec.arguments["lr_scheduler_type"] = "cosine"
    with pytest.raises(SpecError, match="unknown argument 'lr_scheduler_type'"):
        train.run(spec, {}, time.time())


def test_a_backend_s_package_is_checked_before_the_training_stack(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trainer_entry.run.preflight import preflight

    needy = Trainer(
        "needy",
        ("causal-lm",),
        f"{__name__}:LoopBackend",
        library="a plain loop",
        needs="tunematrix_no_such_package",
    )
    monkeypatch.setattr(trainers, "TRAINERS", (*trainers.TRAINERS, needy))
    spec = RunSpec(arguments={"model_name_or_path": "tiny-llama", BACKEND_KEY: "needy"})
    with pytest.raises(SpecError) as err:
        preflight(spec.resolve(tmp_path), models=False)
    assert str(err.value) == (
        "trainer needy needs tunematrix_no_such_package: pip install "
        "tunematrix_no_such_package, or set trainer: hf"
    )
