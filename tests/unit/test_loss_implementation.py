"""What shapes a run's memory, named from its real objects: the loss each backend's trainer
computes (``TrainerBackend.loss_implementation``), the dtypes of weights, gradients and
optimizer states, and the optimizer, on the tiny model's real Trainer and SFTTrainer."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from orchestrator.contract.spec import RunSpec
from trainer_entry.run.parse import parse_arguments

pytest.importorskip("trl")

from trainer_entry.backends import get_backend
from trainer_entry.backends.losses import FULL_LOGITS, LIGER_FUSED, trl_fused
from trainer_entry.results.memoryshape import read_memory_shape


def built(tmp_path: Path, **arguments: Any) -> tuple[Any, Any, Any, Any]:
    """(backend, parsed arguments, built trainer, model) of a tiny run, as the child builds them."""
    from trainer_entry.models.load import load_model
    from trainer_entry.tasks import get_task

    spec = RunSpec(
        device="cpu",
        arguments={
            "model_name_or_path": "tiny-llama",
            "max_steps": 2,
            "max_seq_len": 32,
            "packing": True,
            **arguments,
        },
    ).resolve(tmp_path)
    parsed = parse_arguments(spec)
    backend = get_backend(parsed.backend)
    settings = backend.configure(spec, parsed, on_gpu=False)
    task = get_task(parsed.task)
    loaded = load_model(
        parsed.model,
        parsed.peft,
        task=task,
        task_kwargs=task.model_kwargs(parsed),
        on_gpu=False,
        local_rank=0,
    )
    data = task.prepare(
        dataclasses.replace(parsed, data=backend.data_settings(parsed)),
        loaded.tokenizer,
        Path(spec.data_dir),
        as_given=False,
        model_config=None,
    )
    run = backend.build(
        settings,
        model=loaded.model,
        tokenizer=loaded.tokenizer,
        task=task,
        data=data,
        parsed=parsed,
        hooks=None,
    )
    return backend, parsed, run, loaded.model


def test_hf_computes_the_loss_from_full_fp32_logits_and_sft_through_trls_fused_head(
    tiny_path: Path, tmp_path: Path
) -> None:
    rows = {}
    for trainer in ("hf", "sft"):
        backend, parsed, run, model = built(tmp_path / trainer, trainer=trainer)
        # what the built trainer will compute, before training, and what it did after
        before = backend.loss_implementation(run, parsed)
        run.train()
        shape = read_memory_shape(run, backend, parsed, model)
        assert shape.loss_implementation == before
        # a trainer built elsewhere is named alike (what the memory predictor hands in)
        assert backend.loss_implementation(run.trainer, parsed) == before
        rows[trainer] = shape
    assert rows["hf"].loss_implementation == FULL_LOGITS
    assert rows["sft"].loss_implementation == trl_fused("nll") == "trl fused LM head (chunked nll)"
    for shape in rows.values():
        # the tiny model trains in float32 with torch's AdamW: its two moments per weight
        assert shape.weights_dtype == shape.gradients_dtype == "float32"
        assert shape.optimizer_states_dtype == "float32 (exp_avg, exp_avg_sq)"
        assert shape.optimizer is not None and "(AdamW" in shape.optimizer
        assert shape.notes == ()


def test_what_trl_and_transformers_compute_instead_is_named(
    tiny_path: Path, tmp_path: Path
) -> None:
    backend, parsed, run, _ = built(tmp_path / "dft", loss_type="dft")
    assert backend.loss_implementation(run, parsed) == "trl fused LM head (chunked dft)"
    # label smoothing needs the full logits, under both trainers (TRL: under nll)
    for trainer in ("hf", "sft"):
        backend, parsed, run, _ = built(
            tmp_path / f"smooth-{trainer}", trainer=trainer, label_smoothing_factor=0.1
        )
        assert backend.loss_implementation(run, parsed) == "label smoothing 0.1 (full logits)"
    backend, parsed, run, _ = built(tmp_path / "func", trainer="hf")

    def token_loss(outputs: Any, labels: Any, num_items_in_batch: Any = None) -> Any:
        return outputs.loss

    run.trainer.compute_loss_func = token_loss
    assert backend.loss_implementation(run, parsed).startswith(
        "custom compute_loss_func test_what_trl_and_transformers_compute_instead_is_named."
    )


def test_liger_is_named_where_asked_for_and_its_package_checked_before_anything_loads(
    tiny_path: Path, tmp_path: Path
) -> None:
    import importlib.util

    from trainer_entry.run.preflight import preflight
    from trainer_entry.settings.installed import MissingPackage

    # transformers applies liger when training starts: a trainer built with it will
    # compute liger's fused linear cross-entropy
    backend, parsed, run, _ = built(tmp_path / "liger", trainer="hf", use_liger_kernel=True)
    assert (
        backend.loss_implementation(run, parsed)
        == LIGER_FUSED
        == ("liger fused linear cross-entropy")
    )
    run.trainer.args.liger_kernel_config = {"fused_linear_cross_entropy": False}
    assert backend.loss_implementation(run, parsed) == FULL_LOGITS
    if importlib.util.find_spec("liger_kernel") is not None:
        pytest.skip("liger-kernel is installed here: nothing to refuse")
    spec = RunSpec(
        device="cpu",
        arguments={"model_name_or_path": "tiny-llama", "trainer": "hf", "use_liger_kernel": True},
    ).resolve(tmp_path / "check")
    with pytest.raises(MissingPackage) as refused:
        preflight(spec)
    assert refused.value.key == "use_liger_kernel"
    # the check before launch places it at the line that set the key
    from trainer_entry.check import _problem

    assert _problem("cell", refused.value)["key"] == "use_liger_kernel"
    assert str(refused.value) == (
        "use_liger_kernel: liger-kernel is not installed in this interpreter "
        "(pip install liger-kernel, or remove use_liger_kernel)"
    )


def test_lora_in_bf16_keeps_its_adapters_and_their_states_in_fp32_and_sgd_keeps_none(
    tiny_path: Path, tmp_path: Path
) -> None:
    backend, parsed, run, model = built(
        tmp_path / "lora",
        trainer="hf",
        peft_method="lora",
        r=4,
        target_modules=["q_proj", "v_proj"],
        torch_dtype="bfloat16",
        max_steps=1,
    )
    run.train()
    shape = read_memory_shape(run, backend, parsed, model)
    assert shape.weights_dtype == "bfloat16 frozen, float32 trainable"
    assert shape.gradients_dtype == "float32"
    assert shape.optimizer_states_dtype == "float32 (exp_avg, exp_avg_sq)"

    backend, parsed, run, model = built(tmp_path / "sgd", trainer="hf", optim="sgd", max_steps=1)
    run.train()
    shape = read_memory_shape(run, backend, parsed, model)
    assert (shape.optimizer, shape.optimizer_states_dtype) == ("sgd (SGD)", None)
    assert shape.notes == ("optimizer_states_dtype is empty: the optimizer (SGD) kept no state",)


def test_a_classifier_s_loss_is_its_model_s_own(tiny_path: Path, tmp_path: Path) -> None:
    backend, parsed, run, _ = built(
        tmp_path, model_name_or_path="tiny-bert", task="seq-classification", packing=False
    )
    assert backend.loss_implementation(run, parsed) == (
        "BertForSequenceClassification's own loss (cross-entropy, 3 labels)"
    )
