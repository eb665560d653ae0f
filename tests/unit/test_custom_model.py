"""``python:<module>:<function>`` models: the name, the plan, and the child's build."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.config.values import check_model_name
from orchestrator.contract.errors import ConfigError
from orchestrator.contract.modelnames import python_factory
from orchestrator.contract.spec import RunSpec, read_spec, write_spec
from orchestrator.matrix.ids import model_short_name
from trainer_entry.models.custom import check_findable, factory_arguments
from trainer_entry.models.kinds import model_kind
from trainer_entry.spec_errors import SpecError
from trainer_entry.tasks.causal_lm import CausalLMTask

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "custom_model"
FACTORY = "python:my_models.zoo"


@pytest.fixture
def clean_imports() -> Iterator[None]:
    """Leave no trace of the fixture package in this interpreter's path or modules."""
    saved = list(sys.path)
    yield
    sys.path[:] = saved
    for name in [m for m in sys.modules if m == "my_models" or m.startswith("my_models.")]:
        del sys.modules[name]


# ---------------------------------------------------------------------------
# The name (both sides, no training stack)
# ---------------------------------------------------------------------------


def test_a_python_name_is_a_module_and_a_function() -> None:
    assert python_factory("python:my_pkg.models:build_tiny") == ("my_pkg.models", "build_tiny")
    assert python_factory("python:top:make") == ("top", "make")
    assert model_kind("python:my_pkg.models:build_tiny") == "python"
    assert check_model_name("python:my_pkg.models:build_tiny") is None


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("python:", "names no factory; write python:<module>:<function>"),
        ("python:my_pkg.models", "names no factory"),
        ("python:my_pkg.models:", "names no factory"),
        ("python::build", "names no factory"),
        ("python:my-pkg:build", "'my-pkg' is not a dotted module path"),
        ("python:.relative:build", "'.relative' is not a dotted module path"),
        ("python:a/b:build", "'a/b' is not a dotted module path"),
        ("python:pkg:build-it", "'build-it' is not a function name"),
        ("python:pkg:Cls.method", "'Cls.method' is not a function name"),
    ],
)
def test_a_malformed_python_name_is_one_line(name: str, problem: str) -> None:
    found = check_model_name(name)
    assert found is not None and problem in found and "\n" not in found
    with pytest.raises(ValueError, match="python"):
        python_factory(name)


@pytest.mark.parametrize(
    ("name", "short"),
    [
        ("python:my_pkg.models:build_tiny", "build_tiny"),
        ("python:top:make", "make"),
        ("python:", "model"),
    ],
)
def test_the_short_name_of_a_python_model_is_its_function(name: str, short: str) -> None:
    assert model_short_name(name) == short


SCENARIO = """\
matrix:
  effective_batch_size: [4]
scenarios:
  - name: mine
    device: cpu
    num_gpus: [1]
    arguments:
      model_name_or_path: [{models}]
      model_kwargs: {{hidden_size: 32}}
"""


def test_the_plan_gives_the_scenarios_folder_to_python_models_only(
    plan: Callable[..., Any], tmp_path: Path
) -> None:
    built = plan(SCENARIO.format(models=f"{FACTORY}:build_tiny, tiny-llama"), device="cpu")
    by_model = {e.model_name_or_path: e for e in built.experiments}
    mine = by_model[f"{FACTORY}:build_tiny"]
    assert mine.python_path == (str(tmp_path.resolve()),)
    assert by_model["tiny-llama"].python_path == ()
    assert mine.experiment_id.startswith("mine.build_tiny.none.g1.eb4-")
    assert mine.spec()["python_path"] == [str(tmp_path.resolve())]
    assert mine.arguments["model_kwargs"] == {"hidden_size": 32}


def test_the_id_does_not_depend_on_where_the_scenarios_file_is(tmp_path: Path) -> None:
    from orchestrator.config.scenarios import load_config
    from orchestrator.matrix.expand import Selection, build_plan

    ids = []
    for folder in ("a", "b"):
        path = tmp_path / folder / "scenarios.yaml"
        path.parent.mkdir()
        path.write_text(SCENARIO.format(models=f"{FACTORY}:build_tiny"))
        config = load_config(path, defaults_file=None)
        (experiment,) = build_plan(config, Selection(device="cpu"), 0).experiments
        assert experiment.python_path == (str(path.parent.resolve()),)
        ids.append(experiment.experiment_id)
    assert ids[0] == ids[1]


def test_a_malformed_python_name_fails_the_scenarios_file(load: Callable[..., Any]) -> None:
    with pytest.raises(ConfigError, match="'my-models' is not a dotted module path") as caught:
        load(SCENARIO.format(models="python:my-models:build"))
    assert "scenarios.yaml" in str(caught.value)


def test_the_spec_resolves_python_path_against_its_folder(tmp_path: Path) -> None:
    spec = RunSpec(arguments={"model_name_or_path": "python:m:f"}, python_path=["models", "/abs"])
    path = tmp_path / "run" / "spec.json"
    path.parent.mkdir()
    write_spec(spec, path)
    assert json.loads(path.read_text())["python_path"] == ["models", "/abs"]
    assert read_spec(path).python_path == [str(tmp_path / "run" / "models"), "/abs"]
    assert RunSpec().python_path == []


# ---------------------------------------------------------------------------
# The factory's arguments
# ---------------------------------------------------------------------------


def test_task_and_num_labels_go_only_to_a_function_that_names_them() -> None:
    offered = {"task": "seq-classification", "num_labels": 3, "id2label": {0: "a"}}

    def named(num_labels: int, task: str, width: int = 1) -> None: ...

    def anything(**kwargs: Any) -> None: ...

    def keyword_only(*, task: str) -> None: ...

    assert factory_arguments(named, {"width": 2}, offered) == {
        "width": 2,
        "num_labels": 3,
        "task": "seq-classification",
    }
    assert factory_arguments(anything, {"width": 2}, offered) == {"width": 2}
    assert factory_arguments(keyword_only, {}, offered) == {"task": "seq-classification"}
    # the scenario's model_kwargs win over what the task offers
    assert factory_arguments(named, {"num_labels": 5}, offered)["num_labels"] == 5


# ---------------------------------------------------------------------------
# The checks before training: nothing of the user's code runs
# ---------------------------------------------------------------------------


def test_preflight_finds_the_package_without_running_it(
    clean_imports: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = tmp_path / "imported"
    monkeypatch.setenv("MY_MODELS_IMPORT_MARKER", str(marker))
    before = list(sys.path)
    check_findable(f"{FACTORY}:build_tiny", [str(FIXTURE)])
    assert sys.path == before
    assert "my_models" not in sys.modules and "my_models.zoo" not in sys.modules
    assert not marker.exists()
    with pytest.raises(SpecError) as caught:
        check_findable("python:no_such_models.factory:build", [str(tmp_path)])
    assert str(caught.value) == (
        "model 'python:no_such_models.factory:build' could not be built: ModuleNotFoundError: "
        f"No module named 'no_such_models' (looked in {tmp_path}, then the PYTHONPATH and "
        "installed packages)"
    )
    with pytest.raises(SpecError, match="names no factory"):
        check_findable("python:my_models", [str(FIXTURE)])


def test_preflight_refuses_model_kwargs_for_other_models(tmp_path: Path) -> None:
    from trainer_entry.run.preflight import preflight

    spec = RunSpec(arguments={"model_name_or_path": "tiny-llama", "model_kwargs": {"a": 1}})
    with pytest.raises(SpecError, match="model 'tiny-llama' takes none"):
        preflight(spec)
    missing = RunSpec(
        arguments={"model_name_or_path": "python:absent_pkg.m:f"}, python_path=[str(tmp_path)]
    )
    with pytest.raises(SpecError, match="No module named 'absent_pkg'"):
        preflight(missing)


# ---------------------------------------------------------------------------
# The child's build (the training stack)
# ---------------------------------------------------------------------------


def _load(name: str, kwargs: dict[str, Any] | None = None, **options: Any) -> Any:
    from trainer_entry.models.load import load_model
    from trainer_entry.run.parse import ModelConfig, PeftConfig

    model_options = {
        k: options.pop(k) for k in ("tokenizer", "dtype", "attn_implementation") if k in options
    }
    peft = options.pop("peft", PeftConfig())
    options.setdefault("task", CausalLMTask())
    return load_model(
        ModelConfig(name=name, kwargs=kwargs or {}, **model_options),
        peft,
        on_gpu=False,
        local_rank=0,
        search_path=[str(FIXTURE)],
        **options,
    )


def test_a_function_without_a_tokenizer_gets_tiny_llamas(
    clean_imports: None, tiny_tokenizer: Any
) -> None:
    loaded = _load(f"{FACTORY}:build_tiny", {"hidden_size": 32, "layers": 1})
    assert type(loaded.model).__name__ == "LlamaForCausalLM"
    assert loaded.model.config.hidden_size == 32 and loaded.model.config.num_hidden_layers == 1
    assert loaded.tokenizer.get_vocab() == tiny_tokenizer.get_vocab()  # type: ignore[attr-defined]
    assert loaded.info["kind"] == "python"
    assert loaded.info["architecture"] == "LlamaForCausalLM"
    assert loaded.info["dtype"] == "float32"
    assert loaded.info["total_params"] == sum(p.numel() for p in loaded.model.parameters())
    assert sys.path[0] == str(FIXTURE)


def test_a_returned_tokenizer_is_used_and_checked(clean_imports: None, tiny_path: Path) -> None:
    loaded = _load(f"{FACTORY}:build_with_tokenizer", {"tokenizer": str(tiny_path)})
    assert loaded.tokenizer.pad_token_id is not None
    assert len(loaded.tokenizer) <= loaded.model.get_input_embeddings().num_embeddings
    with pytest.raises(SpecError, match="returned a tokenizer and the scenario sets"):
        _load(
            f"{FACTORY}:build_with_tokenizer",
            {"tokenizer": str(tiny_path)},
            tokenizer=str(tiny_path),
        )


def test_the_scenarios_dtype_and_lora_apply_to_a_built_model(clean_imports: None) -> None:
    from trainer_entry.run.parse import PeftConfig

    loaded = _load(
        f"{FACTORY}:build_tiny",
        {"hidden_size": 32, "layers": 1},
        dtype="bfloat16",
        peft=PeftConfig(method="lora", r=4, target_modules=["q_proj", "v_proj"]),
    )
    assert loaded.info["dtype"] == "bfloat16"
    assert loaded.info["peft_method"] == "lora"
    assert 0 < loaded.info["trainable_params"] < loaded.info["total_params"]


def test_a_classification_function_gets_num_labels_and_task(clean_imports: None) -> None:
    from trainer_entry.tasks import get_task

    task = get_task("seq-classification")
    offered = {"num_labels": 3, "id2label": {0: "a", 1: "b", 2: "c"}}
    loaded = _load(f"{FACTORY}:build_classifier", task=task, task_kwargs=offered)
    assert type(loaded.model).__name__ == "LlamaForSequenceClassification"
    assert loaded.model.config.num_labels == 3
    # a classification head finds each row's last token by the pad id
    assert loaded.model.config.pad_token_id == loaded.tokenizer.pad_token_id
    # a function whose model has another number of labels than the data is refused
    with pytest.raises(SpecError, match="has 2 labels but the data has 3"):
        _load(
            f"{FACTORY}:build_classifier",
            {"num_labels": 2},
            task=task,
            task_kwargs=offered,
        )


@pytest.mark.parametrize(
    ("function", "kwargs", "error"),
    [
        (
            "broken",
            {"width": -1},
            "ValueError: width must be positive, got -1",
        ),
        (
            "no_such_function",
            {},
            "AttributeError: module 'my_models.zoo' has no attribute 'no_such_function'",
        ),
        (
            "not_a_model",
            {},
            "TypeError: not_a_model returned a dict, not a transformers PreTrainedModel; "
            "return the model or (model, tokenizer)",
        ),
        (
            "three_things",
            {},
            "TypeError: three_things returned a tuple of 3; return the model or (model, tokenizer)",
        ),
        (
            "build_tiny",
            {"depth": 3},
            "TypeError: model_kwargs ['depth'] do not fit build_tiny: "
            "got an unexpected keyword argument 'depth'",
        ),
    ],
)
def test_what_goes_wrong_in_the_users_code_is_one_line(
    clean_imports: None,
    capsys: pytest.CaptureFixture[str],
    function: str,
    kwargs: dict[str, Any],
    error: str,
) -> None:
    name = f"{FACTORY}:{function}"
    with pytest.raises(SpecError) as caught:
        _load(name, kwargs)
    assert str(caught.value) == f"model '{name}' could not be built: {error}"
    if function == "broken":
        # the function's own traceback goes to the log (stderr)
        err = capsys.readouterr().err
        assert "Traceback" in err and 'zoo.py", line' in err and "in broken" in err


def test_a_module_that_is_nowhere_names_where_it_was_looked_for(
    clean_imports: None, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SpecError) as caught:
        _load("python:my_models.nothing_here:build")
    assert str(caught.value) == (
        "model 'python:my_models.nothing_here:build' could not be built: ModuleNotFoundError: "
        f"No module named 'my_models.nothing_here' (looked in {FIXTURE}, then the PYTHONPATH "
        "and installed packages)"
    )
    assert "ModuleNotFoundError" in capsys.readouterr().err


def test_qlora_is_refused_for_a_built_model(clean_imports: None) -> None:
    from trainer_entry.models.load import _qlora_quantization

    with pytest.raises(SpecError, match="a python: model has none"):
        _qlora_quantization(True, "auto", "python")


def test_a_config_the_flops_formula_cannot_read_gives_no_figure(clean_imports: None) -> None:
    """A model of the user's own whose config has no attention fields: no FLOPs figure
    (and no crash where the hooks ask for its sliding windows)."""
    from trainer_entry.measure.flops import FlopsUnavailable, estimate_flops, sliding_windows
    from trainer_entry.measure.recompute import Recomputed

    mixer = _load(f"{FACTORY}:build_mixer").model
    with pytest.raises(FlopsUnavailable, match="MixerConfig\\) has no num_hidden_layers"):
        sliding_windows(mixer)
    with pytest.raises(FlopsUnavailable, match="has no num_attention_heads"):
        estimate_flops(mixer, 64, Recomputed())
    # a Llama built by a function is counted like any Llama
    llama = _load(f"{FACTORY}:build_tiny", {"hidden_size": 32, "layers": 1}).model
    flops = estimate_flops(llama, 64, Recomputed())
    linear = sum(m.weight.numel() for m in llama.modules() if type(m).__name__ == "Linear")
    assert flops.linear_forward == pytest.approx(2 * linear)
    assert flops.attention == pytest.approx(3 * 4 * 32 * 64)
