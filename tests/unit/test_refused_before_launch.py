"""A cell that names what cannot run is refused before launch, by the child's own check.

The check (``trainer_entry.check.check``, in this process: the same code the
subprocess runs) builds every cell's model on the meta device as its job will
and loads the fms-acceleration plugins its job environment names. What would
fail after launch comes back as one problem naming the setting to blame:
flash-attn asked of a CPU cell, LoRA on a model PEFT has no targets for, a
length past a model's learned positions, a plugin configuration that cannot
run here. The parent's side (``plan --memory`` showing every refusal, ``run``
stopping at the first) is at the end; ``tests/e2e/test_stackcheck_e2e.py``
runs both for real.
"""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path
from typing import Any, ClassVar

import pytest

from orchestrator.contract.gpumemory import MemoryPrediction
from orchestrator.contract.plugins import CONFIG_ENV, nearest, refusal, sections
from orchestrator.running.memoryfit import memory_table, with_memory
from orchestrator.running.stackcheck import check_stack

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "fms_sample_configurations"
FOAK = FIXTURES / "foak-fast-kernels-sample-configuration.yaml"


def _check(*cells: tuple[str, dict[str, Any]], memory: tuple[str, ...] = ()) -> dict[str, Any]:
    from trainer_entry.check import check

    return check({"cells": [{"id": i, "spec": s} for i, s in cells], "memory": list(memory)})


def _problems(answer: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {p["cell"]: p for p in answer["problems"]}


def _cpu(**arguments: Any) -> dict[str, Any]:
    return {"device": "cpu", "arguments": {"max_steps": 2, **arguments}}


@pytest.fixture
def bigcode(tmp_path: Path) -> Path:
    """A GPT-BigCode model's folder (its config alone) with 64 learned positions."""
    folder = tmp_path / "bigcode"
    folder.mkdir()
    config = {
        "architectures": ["GPTBigCodeForCausalLM"],
        "model_type": "gpt_bigcode",
        "n_embd": 32,
        "n_head": 2,
        "n_layer": 2,
        "n_positions": 64,
        "vocab_size": 128,
        "multi_query": True,
    }
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_flash_attention_on_a_cpu_cell_is_refused_naming_the_key_it_was_written_as() -> None:
    pytest.importorskip("transformers")
    if "flash_attn" in sys.modules or _installed("flash_attn"):
        pytest.skip("flash-attn is installed here: the CPU build of it is the library's to refuse")
    problems = _problems(
        _check(
            ("flag", _cpu(model_name_or_path="tiny-llama", use_flash_attn=True)),
            (
                "named",
                _cpu(model_name_or_path="tiny-llama", attn_implementation="flash_attention_2"),
            ),
            ("sdpa", _cpu(model_name_or_path="tiny-llama")),
        )
    )
    assert set(problems) == {"flag", "named"}
    assert problems["flag"]["key"] == "use_flash_attn"
    assert problems["named"]["key"] == "attn_implementation"
    message = problems["flag"]["message"]
    assert message.startswith("attention flash_attention_2 cannot be built for a CPU cell: ")
    assert "\n" not in message


def _installed(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def test_lora_without_targets_on_a_model_peft_has_none_for_is_refused() -> None:
    problems = _problems(
        _check(
            ("whisper", _cpu(model_name_or_path="tiny-whisper", peft_method="lora")),
            ("llama", _cpu(model_name_or_path="tiny-llama", peft_method="lora")),
        )
    )
    assert set(problems) == {"whisper"}
    assert problems["whisper"]["key"] == "target_modules"
    assert "target_modules" in problems["whisper"]["message"]
    # the layers it could take are named, so the fix is in the line
    assert "q_proj" in problems["whisper"]["message"]


def test_a_length_past_the_models_learned_positions_is_refused_and_rotary_ones_are_not(
    bigcode: Path,
) -> None:
    problems = _problems(
        _check(
            ("long", _cpu(model_name_or_path=str(bigcode), max_seq_len=128)),
            ("fits", _cpu(model_name_or_path=str(bigcode), max_seq_len=64)),
            # tiny-llama's rotary positions have no table: any length is built
            ("rotary", _cpu(model_name_or_path="tiny-llama", max_seq_len=4096)),
        )
    )
    assert set(problems) == {"long"}
    assert problems["long"]["key"] == "max_seq_len"
    assert problems["long"]["message"] == (
        "max_seq_len 128 is longer than the model's 64 learned positions (n_positions): its "
        "embedding table has no row past 63; set max_seq_len to 64 or less"
    )


def test_every_task_familys_tiny_model_passes_the_build() -> None:
    """The build refuses what would fail, nothing else: a model of each task (a
    vision-language model's lengths are its images', known only from its data)."""
    cells = [
        ("vlm", _cpu(model_name_or_path="tiny-vlm", task="vision-language")),
        ("t5", _cpu(model_name_or_path="tiny-t5", task="seq2seq-lm")),
        ("bert", _cpu(model_name_or_path="tiny-bert", task="masked-lm", max_seq_len=128)),
        ("whisper", _cpu(model_name_or_path="tiny-whisper", task="speech-recognition")),
        ("vit", _cpu(model_name_or_path="tiny-vit", task="image-classification")),
    ]
    assert _check(*cells)["problems"] == []


def test_a_plugin_cell_without_fms_acceleration_is_refused_with_the_nearest_setting() -> None:
    if _installed("fms_acceleration"):
        pytest.skip("fms-acceleration is installed here; the fake framework below covers it")
    spec = _cpu(model_name_or_path="tiny-llama")
    spec["env"] = {CONFIG_ENV: str(FOAK)}
    problems = _problems(_check(("foak", spec)))
    assert problems["foak"]["key"] == "framework_config"
    assert problems["foak"]["message"] == (
        "fms-acceleration configuration foak-fast-kernels-sample-configuration.yaml asks for "
        "training.fused_ops_and_kernels (fused Triton kernels, fms-acceleration-foak): "
        "fms-acceleration is not installed here; the cell is refused rather than measured as "
        "the plain baseline under its name; the nearest setting tunematrix runs without it: "
        "use_liger_kernel: true"
    )


def test_a_gpu_cells_flash_attention_is_predicted_with_its_stand_in_named() -> None:
    spec = {
        "device": "gpu",
        "num_gpus": 1,
        "arguments": {
            "model_name_or_path": "tiny-llama",
            "use_flash_attn": True,
            "max_seq_len": 64,
            "per_device_train_batch_size": 2,
        },
    }
    answer = _check(("flash", spec), memory=("flash",))
    assert answer["problems"] == []
    predicted = answer["memory"]["flash"]
    assert predicted["peak_bytes"] > 0, predicted
    assert any(
        f.startswith("attention: flash_attention_2 stood in by SDPA") for f in predicted["formulas"]
    )


# -- the plugin configurations ---------------------------------------------------------------
def test_every_sample_configuration_has_sections_and_each_known_section_a_nearest_setting() -> None:
    import yaml

    for path in sorted(FIXTURES.glob("*-sample-configuration.yaml")):
        found = sections(yaml.safe_load(path.read_text())["plugins"])
        assert found, path.name
    assert sections({"peft": {"quantization": {"bitsandbytes": {"quant_type": "nf4"}}}}) == [
        "peft.quantization.bitsandbytes"
    ]
    assert nearest(["peft.quantization.bitsandbytes", "training.attention.padding_free"]) == [
        "peft_method: qlora",
        "padding_free: true",
    ]
    line = refusal("x.yaml", ["training.moe.scattermoe"], "why")
    assert "nearest" not in line  # nothing of ours stands in for ScatterMoE


@pytest.fixture
def fake_framework(monkeypatch: pytest.MonkeyPatch) -> types.SimpleNamespace:
    """fms-acceleration's interface as its 0.6 framework has it (``AccelerationFramework``
    with class-level active plugins, ``PLUGIN_REGISTRATIONS`` with AND/OR paths), with one
    plugin registered for ``training.fused_ops_and_kernels``: the child's reading of it
    (which plugins are active, which sections none claims), without its GPU kernels."""
    from trainer_entry.models import acceleration

    class FastKernels:
        requires_custom_loading = False
        requires_augmentation = True

    registration = types.SimpleNamespace(
        plugin=FastKernels, AND=["training.fused_ops_and_kernels"], OR=None
    )

    class Framework:
        # class-level, as fms-acceleration 0.6 keeps them
        active_plugins: ClassVar[list[Any]] = []
        plugins_require_custom_loading: ClassVar[list[Any]] = []

        def __init__(self, path: str) -> None:
            import yaml

            if "fused_ops_and_kernels" in str(yaml.safe_load(Path(path).read_text())):
                self.active_plugins.append(("FastKernels", FastKernels()))
            if not self.active_plugins:
                raise ValueError("No plugins could be configured.")

        @property
        def requires_custom_loading(self) -> bool:
            return False

    package = types.ModuleType("fms_acceleration")
    package.AccelerationFramework = Framework  # type: ignore[attr-defined]
    plugin_module = types.ModuleType("fms_acceleration.framework_plugin")
    plugin_module.PLUGIN_REGISTRATIONS = [registration]  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "fms_acceleration", package)
    monkeypatch.setitem(sys.modules, "fms_acceleration.framework_plugin", plugin_module)
    acceleration._built.cache_clear()
    yield types.SimpleNamespace(Framework=Framework)
    acceleration._built.cache_clear()


def test_the_active_plugins_are_read_from_the_framework_and_a_cpu_cell_is_refused(
    fake_framework: types.SimpleNamespace,
) -> None:
    from trainer_entry.models.acceleration import load_acceleration
    from trainer_entry.spec_errors import SpecError

    built = load_acceleration(str(FOAK), on_gpu=True)
    assert built.plugins == ("FastKernels",)
    # a second build in one process does not add to the first's class-level list
    assert fake_framework.Framework.active_plugins == []
    with pytest.raises(SpecError, match=r"its plugins \(FastKernels\) run CUDA kernels"):
        load_acceleration(str(FOAK), on_gpu=False)


def test_a_section_no_installed_plugin_claims_is_refused(
    fake_framework: types.SimpleNamespace,
) -> None:
    from trainer_entry.models.acceleration import load_acceleration
    from trainer_entry.spec_errors import SpecError

    # foak is claimed; padding_free (fms-acceleration-aadp) is not: the framework would
    # skip it without a word
    both = FIXTURES / "accelerated-peft-bnb-nf4-foak-padding-free-sample-configuration.yaml"
    with pytest.raises(SpecError) as refused:
        load_acceleration(str(both), on_gpu=True)
    message = str(refused.value)
    assert (
        "peft.quantization.bitsandbytes (4-bit bitsandbytes LoRA, fms-acceleration-peft)" in message
    )
    assert (
        "training.attention.padding_free (padding-free batches, fms-acceleration-aadp)" in message
    )
    assert "no installed plugin takes it" in message
    assert "fused_ops_and_kernels" not in message.split(": ", 1)[1].split(":")[0]
    # a file no plugin claims at all: the framework's own refusal
    with pytest.raises(SpecError, match="fms-acceleration refuses it"):
        load_acceleration(
            str(FIXTURES / "aadp-padding-free-sample-configuration.yaml"), on_gpu=True
        )


# -- the parent: plan --memory shows every refusal, run stops at the first ----------------------
SCENARIOS = """\
scenarios:
  - name: a
    framework_config: [null, fast]
    arguments: {model_name_or_path: config:llama-3.2-1b, max_seq_len: 512}
frameworks:
  fast: {env: {FAST: "1"}}
"""


def _answer(refuse: str) -> Any:
    def run(python: str, cells: Any, memory: Any = ()) -> dict[str, Any]:
        return {
            "versions": {},
            "models": {},
            "unbuilt": 0,
            "problems": [
                {"cell": e.cell_id, "key": "framework_config", "message": "no plugin here"}
                for e in cells
                if e.framework == refuse
            ],
            "memory": {
                e.cell_id: MemoryPrediction(peak_bytes=10**9).as_answer()
                for e in cells
                if e.framework != refuse and e.cell_id in memory
            },
        }

    return run


def test_plan_memory_refuses_each_cell_and_predicts_the_rest_while_run_stops(plan) -> None:
    from orchestrator.contract.errors import UserError

    built = plan(SCENARIOS, num_gpus=(1,), effective_batch_size=(4,))
    done = check_stack(built, run=_answer("fast"), memory=lambda e: True, stop=False)
    (refused,) = done.refused
    line = done.refused[refused]
    assert "framework 'fast': no plugin here" in line and "scenarios.yaml" in line
    memory = {**done.memory, refused: MemoryPrediction(refused=line)}
    table = "\n".join(memory_table(with_memory(done.plan, memory, 80 * 2**30, "flag")))
    assert f"refused before launch: {line}" in table
    assert "1.0 GB" in table  # the other cell is predicted
    with pytest.raises(UserError, match="no plugin here"):
        check_stack(built, run=_answer("fast"), memory=lambda e: True)
