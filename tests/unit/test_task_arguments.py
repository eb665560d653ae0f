"""Which arguments belong to which task, trainer and PEFT method; the predecessor's names,
mapped or refused; and how the planner applies both: one line at the line that wrote it."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment, SandboxedEnvironment

from orchestrator.config.scenarios import BenchConfig, load_config
from orchestrator.contract import applicability
from orchestrator.contract.applicability import (
    REPLACED,
    TASKS,
    TEXT_TASKS,
    formatter_template,
    inapplicable_argument,
    predecessor_argument,
    training_fields,
    unknown_argument,
)
from orchestrator.contract.errors import ConfigError
from orchestrator.contract.spec import RunSpec
from orchestrator.matrix.expand import Selection, build_plan
from orchestrator.matrix.table import format_table, plan_rows
from trainer_entry.run.parse import parse_arguments
from trainer_entry.spec_errors import SpecError

#: every task that reads text, as the refusals list them
_TEXT = ", ".join(TEXT_TASKS)
#: the text tasks less those that read their text from other fields (seq2seq-lm's
#: source_field and target_field, vision-language's messages) and those that pad no
#: text to a multiple (speech's audio, vision-language's conversations)
_TEXT_FIELD = ", ".join(t for t in TEXT_TASKS if t not in ("seq2seq-lm", "vision-language"))
_PADDED = ", ".join(t for t in TEXT_TASKS if t not in ("speech-recognition", "vision-language"))

REPO = Path(__file__).resolve().parents[2]
#: SFTConfig's own settings, as a test stands them in
SFT_ONLY = frozenset({"padding_free", "packing_strategy", "packing", "max_length"})


@pytest.fixture
def sft_fields(monkeypatch: pytest.MonkeyPatch) -> None:
    """``SFTConfig``'s fields that ``TrainingArguments`` lacks, fixed for the test."""
    monkeypatch.setattr(
        applicability, "own_fields", lambda name: SFT_ONLY if name == "sft" else frozenset()
    )


def _check(
    key: str,
    value: object = True,
    *,
    task: str = "causal-lm",
    backend: str = "hf",
    arguments: dict[str, object] | None = None,
) -> str | None:
    """The refusal's line, or None."""
    problem = inapplicable_argument(
        key,
        value,
        task=task,
        backend=backend,
        arguments=arguments or {},
        backend_only={"padding_free": ("sft",), "packing_strategy": ("sft",)},
    )
    return None if problem is None else problem.line


# ---------------------------------------------------------------------------
# Applicability (orchestrator.contract.applicability)
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "task", "tasks"),
    [
        ("packing", "image-classification", "causal-lm"),
        ("packing", "seq-classification", "causal-lm"),
        ("formatting", "seq-classification", "causal-lm"),
        ("response_template", "image-classification", "causal-lm"),
        ("completion_only_loss", "seq-classification", "causal-lm"),
        ("data_formatter_template", "image-classification", "causal-lm"),
        (
            "max_seq_len",
            "image-classification",
            _TEXT,
        ),
        (
            "max_seq_length",
            "image-classification",
            _TEXT,
        ),
        ("dataset_text_field", "image-classification", _TEXT_FIELD),
        ("dataset_text_field", "seq2seq-lm", _TEXT_FIELD),
        ("pad_to_multiple_of", "image-classification", _PADDED),
        ("pad_to_multiple_of", "speech-recognition", _PADDED),
        (
            "tokenizer_name_or_path",
            "image-classification",
            _TEXT,
        ),
        ("label_field", "causal-lm", "seq-classification, image-classification"),
        ("image_field", "seq-classification", "image-classification, vision-language"),
        ("dataset_image_field", "causal-lm", "image-classification, vision-language"),
    ],
)
def test_a_setting_of_other_tasks_is_refused(key: str, task: str, tasks: str) -> None:
    assert _check(key, task=task) == (
        f"'{key}' means nothing for task {task} (it is for {tasks}); remove it"
    )


@pytest.mark.parametrize(
    ("key", "task"),
    [
        ("packing", "causal-lm"),
        ("max_seq_len", "seq-classification"),
        ("dataset_text_field", "seq-classification"),
        ("label_field", "image-classification"),
        ("image_field", "image-classification"),
        ("dataset", "image-classification"),
        ("learning_rate", "image-classification"),
        ("peft_method", "image-classification"),
        ("torch_dtype", "seq-classification"),
    ],
)
def test_a_setting_of_the_task_is_accepted(key: str, task: str) -> None:
    assert _check(key, task=task) is None


@pytest.mark.parametrize(
    "key", ["r", "lora_r", "lora_alpha", "lora_dropout", "target_modules", "modules_to_save"]
)
def test_lora_settings_need_a_peft_method(key: str) -> None:
    assert _check(key, 8) == f"'{key}' needs peft_method: lora; set peft_method or remove {key}"
    assert _check(key, 8, arguments={"peft_method": "none"}) is not None
    assert _check(key, 8, arguments={"peft_method": "lora"}) is None
    assert _check(key, 8, arguments={"peft_method": "QLoRA"}) is None


def test_the_predecessors_lora_bias_is_judged_as_ours() -> None:
    assert _check("bias", "all") == "'bias' needs peft_method: lora; set peft_method or remove bias"
    assert _check("bias", "all", arguments={"peft_method": "lora"}) is None


def test_sft_settings_belong_to_trainer_sft() -> None:
    assert _check("padding_free") == (
        "'padding_free' is an option of trainer sft (TRL); this scenario runs trainer hf"
    )
    assert _check("padding_free", backend="sft") is None
    assert _check("packing", backend="hf") is None  # ours: every trainer takes it


def test_trainer_and_task_names() -> None:
    assert _check("task", "vision") == (f"task must be one of {', '.join(TASKS)}, got 'vision'")
    assert _check("trainer", "trl") == "trainer must be one of sft, hf, got 'trl'"
    assert _check("trainer", "sft", task="image-classification") == (
        "trainer sft does not train task image-classification; it runs with hf "
        "(remove trainer for the default, hf)"
    )
    assert _check("trainer", "hf", task="seq-classification") is None


def test_sft_only_settings_come_from_the_saved_sft_fields(sft_fields) -> None:
    # ours (packing, max_length) are mapped onto TRL's by the sft backend: every trainer
    # takes them; what only SFTConfig has is for trainer sft
    assert applicability.backend_only_fields() == {
        "padding_free": ("sft",),
        "packing_strategy": ("sft",),
    }
    problem = inapplicable_argument(
        "packing_strategy", "bfd", task="causal-lm", backend="hf", arguments={}
    )
    assert problem is not None and problem.line == (
        "'packing_strategy' is an option of trainer sft (TRL); this scenario runs trainer hf"
    )
    assert problem.why == "'packing_strategy' is an option of trainer sft (TRL)"


def test_unknown_names_accept_sft_fields_for_trainer_sft_only(sft_fields) -> None:
    assert unknown_argument("padding_free") is None  # the trainer is not known yet
    assert unknown_argument("padding_free", backend="sft") is None
    assert unknown_argument("padding_free", backend="hf") == (
        "'padding_free' is an option of trainer sft (TRL); this scenario runs trainer hf"
    )
    assert unknown_argument("padding_fre") == (
        "unknown argument 'padding_fre': not a TrainingArguments or SFTConfig field nor a "
        "tunematrix setting; did you mean 'padding_free'?"
    )
    assert unknown_argument("padding_free", training_fields()) is not None  # hf's own fields
    assert unknown_argument("save_model_dir") is None  # the predecessor's: refused by name


# ---------------------------------------------------------------------------
# The predecessor's names: mapped (with a note) or refused (with what to use)
# ---------------------------------------------------------------------------


def _parse(arguments: dict[str, object], **spec: object):
    return parse_arguments(
        RunSpec(arguments={"model_name_or_path": "m", **arguments}, **spec),  # type: ignore[arg-type]
        known_fields=training_fields(),
    )


@pytest.mark.parametrize(
    ("arguments", "read"),
    [
        ({"text_column_name": "body", "formatting": "text"}, ("text_field", "body")),
        ({"model_max_length": 256}, ("max_seq_len", 256)),
        ({"max_seq_length": 256}, ("max_seq_len", 256)),
        ({"dataset_conversation_field": "turns"}, ("messages_field", "turns")),
        ({"training_data_path": "d.jsonl"}, ("dataset", "d.jsonl")),
    ],
)
def test_the_predecessors_data_names_are_ours(arguments, read) -> None:
    name, value = read
    assert getattr(_parse(arguments).data, name) == value


def test_a_conversation_field_means_the_chat_formatting() -> None:
    assert _parse({"dataset_conversation_field": "turns"}).data.formatting == "chat"
    # a formatting the scenario names wins
    assert (
        _parse(
            {"dataset_conversation_field": "t", "formatting": "template", "chat_template": "x"}
        ).data.formatting
        == "template"
    )


def test_the_predecessors_lora_bias_is_lora_bias() -> None:
    parsed = _parse({"peft_method": "lora", "bias": "lora_only"})
    assert parsed.peft.bias == "lora_only"
    assert "argument 'bias' is the old name of 'lora_bias'" in parsed.notes


def test_the_predecessors_formatter_template_is_a_template_formatting() -> None:
    parsed = _parse({"data_formatter_template": "### Q: {{input}}\n### A: {{output}}"})
    assert parsed.data.formatting == "template"
    assert parsed.data.chat_template == (
        '### Q: {{ messages[0]["input"] }}\n### A: {{ messages[0]["output"] }}'
    )
    with pytest.raises(SpecError, match="data_formatter_template and chat_template are both set"):
        _parse({"data_formatter_template": "{{a}}", "chat_template": "{{ messages }}"})
    with pytest.raises(SpecError, match="is formatting template; remove formatting"):
        _parse({"data_formatter_template": "{{a}}", "formatting": "instruct"})


@pytest.mark.parametrize(
    "template",
    [
        "### Input:\n{{input}}\n\n### Response:\n{{output}}{{eos_token}}",
        "{{ element['instruction'] }} -> {{ element[\"output\"] }}",
        "{{bos_token}}{{ input }} and {{input}}: no field twice is a problem",
        "no field at all",
        "a lone closing }} is text to Jinja",
    ],
)
def test_a_translated_formatter_template_renders_as_the_predecessors(template: str) -> None:
    """The predecessor renders its template with the record's fields as names (and as
    ``element``) and the tokenizer's special tokens; ours renders the translation with
    ``messages=[record]``: the same text for every record."""
    record = {"input": "2 + 2?", "output": "4", "instruction": "add", "x": None}
    tokens = {"eos_token": "</s>", "bos_token": "<s>"}
    theirs = SandboxedEnvironment().from_string(template).render(element=record, **tokens, **record)
    ours = (
        ImmutableSandboxedEnvironment()
        .from_string(formatter_template(template))
        .render(messages=[record], **tokens)
    )
    assert ours == theirs


@pytest.mark.parametrize(
    ("template", "says"),
    [
        ("{% for k in element %}{{k}}{% endfor %}", "has Jinja beyond {{field}}"),
        ("{# note #}{{input}}", "has Jinja beyond {{field}}"),
        ("{{ input | upper }}", "has {{input | upper}}, not a {{field}}"),
        ("{{pad_token}}{{input}}", "uses {{pad_token}}; a template renders with eos_token"),
        ("{{input", "has Jinja beyond {{field}}"),
    ],
)
def test_a_formatter_template_beyond_fields_is_refused(template: str, says: str) -> None:
    with pytest.raises(ValueError) as caught:
        formatter_template(template)
    assert says in str(caught.value)
    message = predecessor_argument("data_formatter_template", template)
    assert message is not None and says in message and "\n" not in message
    assert "write it as chat_template" in message or "write the token" in message


#: a value that turns each of the predecessor's features on
ON: dict[str, object] = {
    "embedding_size_multiple_of": 64,
    "flash_attn_implementation": "sdpa",
    "data_config_path": "data_config.yaml",
    "validation_data_path": "val.jsonl",
    "instruction_template": "### Human:",
    "add_special_tokens": ["<tool>"],
    "do_dataprocessing_only": True,
    "num_train_dataset_shards": 4,
    "num_eval_dataset_shards": 2,
    "cache_dir": "/cache",
    "save_model_dir": "/out",
    "lora_post_process_for_vllm": True,
    "enable_reduce_loss_sum": True,
    "trainer_controller_config_file": "tc.yaml",
    "exp_metadata": '{"gpu": "A100"}',
    "trackers": ["aim"],
    "tracker": "mlflow",
    "init_lora_weights": False,
    "loftq_config": {"loftq_bits": 4},
    "quantization_method": "mxfp4",
    "bnb_qlora": ["nf4"],
    "auto_gptq": ["triton_v2"],
    "fused_lora": ["auto_gptq", True],
    "fast_kernels": [True, True, True],
    "fast_moe": 8,
    "odm": ["entropy"],
    "multipack": [16],
    "num_virtual_tokens": 8,
}
#: a value that leaves each off (the predecessor's default)
OFF: dict[str, object] = {
    "embedding_size_multiple_of": 1,
    "flash_attn_implementation": "flash_attention_2",
    "trackers": ["file_logger"],
    "init_lora_weights": True,
    "do_dataprocessing_only": False,
    "quantization_method": "none",
    "lora_post_process_for_vllm": False,
}


def test_every_name_without_a_counterpart_says_what_to_do() -> None:
    for name, (todo, off) in REPLACED.items():
        assert "\n" not in todo and re.search(r"\b(remove|use|write|set)\b", todo), name
        assert None in off, name


@pytest.mark.parametrize("name", sorted(ON))
def test_the_predecessors_features_are_refused_with_what_to_use(name: str) -> None:
    message = predecessor_argument(name, ON[name])
    assert message is not None and message.startswith(f"'{name}' (fms-hf-tuning's)")
    assert "\n" not in message
    with pytest.raises(SpecError, match=re.escape(f"spec arguments.{name}: '{name}'")):
        _parse({name: ON[name]})


@pytest.mark.parametrize("name", sorted(OFF))
def test_a_feature_left_off_is_dropped_with_a_note(name: str) -> None:
    assert predecessor_argument(name, OFF[name]) is None
    parsed = _parse({name: OFF[name]})
    assert f"argument '{name}' (fms-hf-tuning's) leaves its feature off; ignored" in parsed.notes
    assert name not in parsed.training


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("pt", "prompt tuning (peft_method pt) is not offered; use lora or qlora"),
        ("PT", "prompt tuning (peft_method pt) is not offered"),
        ("alora", "aLoRA (peft_method alora) is not offered; use lora"),
        ("prefix", "peft_method must be lora, qlora or null, got 'prefix'"),
    ],
)
def test_peft_methods_not_offered(value: str, says: str) -> None:
    message = predecessor_argument("peft_method", value)
    assert message is not None and message.startswith(says)
    for fine in ("lora", "qlora", "none", "full", None):
        assert predecessor_argument("peft_method", fine) is None


def test_the_plugins_padding_free_list_is_refused_with_ours() -> None:
    assert predecessor_argument("padding_free", ["huggingface"]) == (
        'padding_free ["huggingface"] is fms-acceleration\'s plugin flag; write '
        "padding_free: true (TRL's padding-free batching, trainer sft)"
    )
    assert predecessor_argument("padding_free", True) is None


def test_use_flash_attn_still_means_flash_attention_2() -> None:
    assert _parse({"use_flash_attn": True}).model.attn_implementation == "flash_attention_2"


# ---------------------------------------------------------------------------
# The planner: task and trainer in every cell, one line for what does not apply
# ---------------------------------------------------------------------------


def _line(text: str, needle: str) -> int:
    """The 1-based line of ``needle`` in the dedented scenarios text."""
    lines = textwrap.dedent(text).lstrip("\n").splitlines()
    return next(i for i, line in enumerate(lines, 1) if needle in line)


def _refusal(plan, text: str, defaults: str | None = None) -> str:
    with pytest.raises(ConfigError) as caught:
        plan(text, defaults, num_gpus=(1,), effective_batch_size=(4,), filters=("*",))
    message = str(caught.value)
    assert "\n" not in message
    return message


IMAGE = """
scenarios:
  - name: vit
    arguments:
      task: image-classification
      model_name_or_path: tiny-vit
      learning_rate: 1e-3
"""


def test_every_cell_names_its_task_and_trainer(plan) -> None:
    text = (
        IMAGE
        + """
  - name: llama
    arguments: {model_name_or_path: tiny-llama}
  - name: llama-hf
    arguments: {model_name_or_path: tiny-llama, trainer: hf}
"""
    )
    p = plan(text, num_gpus=(1,), effective_batch_size=(4,))
    named = {e.scenario: (e.arguments["task"], e.arguments["trainer"]) for e in p.experiments}
    assert named == {
        "vit": ("image-classification", "hf"),
        "llama": ("causal-lm", "sft"),
        "llama-hf": ("causal-lm", "hf"),
    }
    assert {(r["task"], r["trainer"]) for r in plan_rows(p)} == set(named.values())
    header = format_table(p).splitlines()[0].split()
    assert header[header.index("model") + 1 : header.index("model") + 3] == ["task", "trainer"]


def test_an_image_task_crosses_no_sequence_axes(plan) -> None:
    matrix = "matrix:\n  max_seq_len: [512, 1024]\n  packing: [true, false]\n"
    p = plan(matrix + IMAGE, num_gpus=(1,), effective_batch_size=(4,))
    (cell,) = p.experiments
    assert cell.max_seq_len is None and cell.packing is None
    assert "max_seq_len" not in cell.arguments and "packing" not in cell.arguments
    assert cell.spec()["max_seq_len"] is None
    assert (
        "the matrix's max_seq_len and packing are left out of vit: task image-classification "
        "takes none" in p.notes
    )
    # so its id does not depend on them
    other = plan("matrix:\n  max_seq_len: [64]\n" + IMAGE, num_gpus=(1,), effective_batch_size=(4,))
    assert other.experiments[0].experiment_id == cell.experiment_id
    row = next(r for r in format_table(p).splitlines() if r.startswith("1 "))
    assert row.split()[-2:] == ["-", "-"]  # seq_len and packing: none


def test_a_sequence_task_crosses_its_length_only(plan) -> None:
    text = """
    matrix:
      max_seq_len: [128, 256]
      packing: [true, false]
    scenarios:
      - name: bert
        arguments: {task: seq-classification, model_name_or_path: tiny-bert}
    """
    p = plan(text, num_gpus=(1,), effective_batch_size=(4,))
    assert [(e.max_seq_len, e.packing) for e in p.experiments] == [(128, None), (256, None)]


def test_what_the_scenario_writes_for_another_task_is_one_line_at_its_line(plan) -> None:
    text = IMAGE + "      packing: true\n"
    message = _refusal(plan, text)
    assert message.endswith(
        f"scenarios.yaml:{_line(text, 'packing')}: scenarios[0].arguments.packing: "
        "'packing' means nothing for task image-classification (it is for causal-lm); remove it"
    )


def test_lora_settings_without_a_peft_method_are_refused(plan) -> None:
    text = IMAGE + "      r: 16\n"
    assert _refusal(plan, text).endswith(
        f"scenarios.yaml:{_line(text, 'r: 16')}: scenarios[0].arguments.r: "
        "'r' needs peft_method: lora; set peft_method or remove r"
    )
    plan(text + "      peft_method: lora\n", num_gpus=(1,), effective_batch_size=(4,))


def test_a_setting_a_swept_value_turns_off_is_left_out_of_those_cells(plan, sft_fields) -> None:
    text = """
    scenarios:
      - name: s
        arguments:
          model_name_or_path: tiny-llama
          padding_free: true
          r: 16
        sweep:
          trainer: [sft, hf]
          peft_method: [none, lora]
    """
    p = plan(text, num_gpus=(1,), effective_batch_size=(4,))
    cells = {(e.trainer, e.peft_method): e.arguments for e in p.experiments}
    assert len(cells) == len({e.experiment_id for e in p.experiments}) == 4
    assert cells[("sft", "lora")]["padding_free"] is True and cells[("sft", "lora")]["r"] == 16
    assert "padding_free" not in cells[("hf", "lora")] and "r" not in cells[("sft", "none")]
    assert (
        "the scenario's padding_free is left out of s: 'padding_free' is an option of trainer "
        "sft (TRL) (the sweep's trainer: hf)" in p.notes
    )
    assert (
        "the scenario's r is left out of s: 'r' needs peft_method: lora (the sweep's "
        "peft_method: none)" in p.notes
    )


def test_a_setting_no_swept_cell_takes_is_refused(plan) -> None:
    text = """
    scenarios:
      - name: s
        arguments:
          model_name_or_path: m
          packing: true
        sweep:
          task: [seq-classification, image-classification]
    """
    assert _refusal(plan, text).endswith(
        f"scenarios.yaml:{_line(text, 'packing')}: scenarios[0].arguments.packing: "
        "'packing' means nothing for task seq-classification (it is for causal-lm); remove it "
        "(the sweep's task: seq-classification)"
    )


def test_a_swept_setting_is_never_left_out(plan) -> None:
    # leaving r out of the full cells would make the two of them one
    text = """
    scenarios:
      - name: s
        arguments: {model_name_or_path: m}
        sweep:
          peft_method: [none, lora]
          r: [8, 16]
    """
    message = _refusal(plan, text)
    assert f"scenarios.yaml:{_line(text, 'r: [8, 16]')}: scenarios[0].sweep.r: 'r' needs" in message
    assert message.endswith("(the sweep's r: 8, peft_method: none)")


def test_a_swept_task_sets_the_trainer_a_constant_cannot_run(plan) -> None:
    text = """
    scenarios:
      - name: s
        arguments: {model_name_or_path: m, trainer: sft}
        sweep:
          task: [causal-lm, image-classification]
    """
    p = plan(text, num_gpus=(1,), effective_batch_size=(4,))
    # (in run order the image cell, with no sequence length, is the smaller and runs first)
    assert sorted((e.task, e.trainer) for e in p.experiments) == [
        ("causal-lm", "sft"),
        ("image-classification", "hf"),
    ]


def test_sweeping_the_trainer_gives_a_cell_each(plan) -> None:
    text = """
    scenarios:
      - name: s
        arguments: {model_name_or_path: tiny-llama, packing: false}
        sweep:
          trainer: [sft, hf]
    """
    p = plan(text, num_gpus=(1,), effective_batch_size=(4,))
    assert [e.trainer for e in p.experiments] == ["sft", "hf"]
    assert len({e.experiment_id for e in p.experiments}) == 2
    assert p.swept_keys == ("trainer",)


def test_a_trainer_the_task_does_not_run(plan) -> None:
    text = IMAGE + "      trainer: sft\n"
    assert _refusal(plan, text).endswith(
        f"scenarios.yaml:{_line(text, 'trainer: sft')}: scenarios[0].arguments.trainer: "
        "trainer sft does not train task image-classification; it runs with hf "
        "(remove trainer for the default, hf)"
    )


@pytest.mark.parametrize(
    ("line", "says"),
    [
        (
            "task: vision",
            f"task must be one of {', '.join(TASKS)}",
        ),
        ("trainer: trl", "trainer must be one of sft, hf, got 'trl'"),
        ("save_model_dir: /out", "'save_model_dir' (fms-hf-tuning's) has no counterpart here"),
        ("peft_method: pt", "prompt tuning (peft_method pt) is not offered"),
        (
            'data_formatter_template: "{{ x | e }}"',
            "data_formatter_template has {{x | e}}, not a {{field}}",
        ),
    ],
)
def test_names_and_values_nothing_runs_are_refused_while_loading(plan, line, says) -> None:
    text = f"""
    scenarios:
      - name: s
        arguments:
          model_name_or_path: tiny-llama
          {line}
    """
    message = _refusal(plan, text)
    key = line.split(":")[0]
    assert f"scenarios.yaml:{_line(text, line)}: scenarios[0].arguments.{key}: {says}" in message


def test_a_swept_task_value_nothing_runs_is_refused(plan) -> None:
    text = """
    scenarios:
      - name: s
        arguments: {model_name_or_path: m}
        sweep:
          task: [causal-lm, text-generation]
    """
    assert "scenarios[0].sweep.task[1]: task must be one of" in _refusal(plan, text)


def test_a_framework_setting_for_another_task_points_at_the_framework(plan) -> None:
    text = """
    frameworks:
      packed:
        arguments:
          packing: true
    scenarios:
      - name: vit
        framework_config: [packed]
        arguments: {task: image-classification, model_name_or_path: tiny-vit}
    """
    message = _refusal(plan, text)
    assert message.endswith(
        f"scenarios.yaml:{_line(text, 'packing: true')}: frameworks.packed.arguments.packing: "
        "'packing' means nothing for task image-classification (it is for causal-lm); remove it "
        "(framework 'packed', scenario 'vit')"
    )


def test_shared_defaults_that_do_not_apply_are_left_out(plan) -> None:
    defaults = "response_template: '### Response:'\nlora_alpha: 32\ntrainer: sft\nseed: 1\n"
    text = (
        IMAGE
        + """
  - name: llama
    arguments: {model_name_or_path: tiny-llama}
  - name: llama-lora
    arguments: {model_name_or_path: tiny-llama, peft_method: lora}
"""
    )
    p = plan(text, defaults, num_gpus=(1,), effective_batch_size=(4,))
    args = {e.scenario: e.arguments for e in p.experiments}
    assert "response_template" not in args["vit"] and args["vit"]["trainer"] == "hf"
    assert (
        args["llama"]["response_template"] == "### Response:" and args["llama"]["trainer"] == "sft"
    )
    assert "lora_alpha" not in args["llama"] and args["llama-lora"]["lora_alpha"] == 32
    assert all(a["seed"] == 1 for a in args.values())
    assert (
        "defaults.yaml's response_template is left out of vit: 'response_template' means "
        "nothing for task image-classification (it is for causal-lm)" in p.notes
    )
    assert (
        "defaults.yaml's lora_alpha is left out of vit, llama: 'lora_alpha' needs peft_method: lora"
        in p.notes
    )
    assert (
        "defaults.yaml's trainer is left out of vit: trainer sft does not train task "
        "image-classification" in p.notes
    )


def test_the_data_stanza_keeps_what_the_task_takes(plan) -> None:
    text = """
    data_processing:
      dataset_name: d.jsonl
      chat_template: "{{ messages[0]['text'] }}"
    scenarios:
      - name: vit
        arguments: {task: image-classification, model_name_or_path: tiny-vit}
      - name: llama
        arguments: {model_name_or_path: tiny-llama}
    """
    p = plan(text, num_gpus=(1,), effective_batch_size=(4,))
    stanza = {e.scenario: dict(e.data_processing or {}) for e in p.experiments}
    assert stanza["vit"] == {"dataset_name": "d.jsonl"}
    assert stanza["llama"]["chat_template"] == "{{ messages[0]['text'] }}"
    assert (
        "data_processing's chat_template is left out of vit: 'chat_template' means nothing for "
        "task image-classification" in p.notes
    )


# ---------------------------------------------------------------------------
# The shipped scenarios
# ---------------------------------------------------------------------------


def _shipped() -> BenchConfig:
    return load_config(
        REPO / "scenarios.yaml",
        defaults_file=REPO / "defaults.yaml",
        accelerate_fallback=REPO / "accelerate.yaml",
    )


def test_the_default_cpu_matrix_runs_sft_and_hf_side_by_side() -> None:
    p = build_plan(_shipped(), Selection(device="cpu"), gpu_count=0)
    cells = [(e.scenario, e.trainer, e.num_gpus) for e in p.experiments]
    assert ("tiny-sft-vs-hf", "sft", 1) in cells and ("tiny-sft-vs-hf", "hf", 1) in cells
    side = [e for e in p.experiments if e.scenario == "tiny-sft-vs-hf"]
    assert len(side) == 2 and {e.packing for e in side} == {False}
    # the two cells differ in the trainer only
    a, b = ({k: v for k, v in e.arguments.items() if k != "trainer"} for e in side)
    assert a == b
    assert len(p.experiments) == 6 and {e.task for e in p.experiments} == {"causal-lm"}


def test_the_shipped_classification_scenarios_plan_by_name() -> None:
    p = build_plan(
        _shipped(),
        Selection(device="cpu", num_gpus=(1, 2), filters=("tiny-*-classification",)),
        gpu_count=0,
    )
    tasks = {(e.scenario, e.task, e.trainer, e.peft_method) for e in p.experiments}
    assert tasks == {
        (s, t, "hf", m)
        for s, t in (
            ("tiny-bert-classification", "seq-classification"),
            ("tiny-vit-classification", "image-classification"),
        )
        for m in ("none", "lora")
    }
    assert {e.num_gpus for e in p.experiments} == {1, 2}


def test_the_commented_gpu_scenarios_plan_when_uncommented(tmp_path: Path) -> None:
    from orchestrator.config.scenarios import load_config

    text = (REPO / "scenarios.yaml").read_text()
    start = text.index("  # ---- GPU scenarios of the other tasks")
    block = [
        line.replace("  # ", "  ", 1) if line.startswith("  # ") else line
        for line in text[start:].splitlines()[2:]
    ]
    assert any("- name: bert-imdb" in line for line in block)
    uncommented = text[:start] + "\n".join(line.rstrip("#") for line in block) + "\n"
    (tmp_path / "scenarios.yaml").write_text(uncommented)
    for config in REPO.glob("accelerate*.yaml"):
        (tmp_path / config.name).write_text(config.read_text())
    config = load_config(
        tmp_path / "scenarios.yaml",
        defaults_file=REPO / "defaults.yaml",
        accelerate_fallback=tmp_path / "accelerate.yaml",
    )
    p = build_plan(
        config,
        Selection(device="gpu", num_gpus=(1,), filters=("bert-imdb", "vit-cifar10")),
        gpu_count=0,
    )
    args = {(e.scenario, e.peft_method): e.arguments for e in p.experiments}
    bert, vit = args[("bert-imdb", "none")], args[("vit-cifar10", "lora")]
    assert (bert["task"], bert["dataset"], bert["text_field"], bert["label_field"]) == (
        "seq-classification",
        "stanfordnlp/imdb",
        "text",
        "label",
    )
    assert (vit["task"], vit["dataset"], vit["image_field"], vit["label_field"]) == (
        "image-classification",
        "uoft-cs/cifar10",
        "img",
        "label",
    )
    assert "max_seq_len" not in vit and bert["max_seq_len"] == 512
