"""Sorting a spec's arguments to model, data, PEFT, measurement and Trainer settings."""

from __future__ import annotations

import json

import pytest

from orchestrator.contract.applicability import FIELDS_FILE, training_fields
from orchestrator.contract.spec import RunSpec
from trainer_entry.run.parse import parse_arguments
from trainer_entry.spec_errors import SpecError


def parse(arguments: dict, **spec: object):
    return parse_arguments(RunSpec(arguments=arguments, **spec))  # type: ignore[arg-type]


def test_every_key_finds_its_owner() -> None:
    p = parse(
        {
            "model_name_or_path": "tiny-llama",
            "torch_dtype": "bfloat16",
            "use_flash_attn": True,
            "learning_rate": 1e-4,
            "max_steps": 5,
            "peft_method": "lora",
            "r": 4,
            "lora_alpha": 8,
            "target_modules": ["q_proj"],
            "max_seq_len": 256,
            "packing": True,
            "dataset_text_field": "body",
            "warmup_steps_excluded": 2,
            "pad_to_multiple_of": 8,
        }
    )
    assert p.model.name == "tiny-llama" and p.model.dtype == "bfloat16"
    assert p.model.attn_implementation == "flash_attention_2"
    assert p.training == {"learning_rate": 1e-4, "max_steps": 5}
    assert (p.peft.method, p.peft.r, p.peft.lora_alpha, p.peft.target_modules) == (
        "lora",
        4,
        8,
        ["q_proj"],
    )
    assert (p.data.max_seq_len, p.data.packing, p.data.text_field) == (256, True, "body")
    assert p.measure.warmup_steps_excluded == 2 and p.pad_to_multiple_of == 8


def test_unknown_argument_suggests_the_closest() -> None:
    with pytest.raises(
        SpecError, match=r"unknown argument 'lerning_rate'.*did you mean 'learning_rate'"
    ):
        parse({"model_name_or_path": "m", "lerning_rate": 1.0})


def test_old_names_are_translated_or_dropped_with_a_note() -> None:
    p = parse(
        {
            "model_name_or_path": "m",
            "gradient_checkpointing": True,
            "evaluation_strategy": "no",
            "include_tokens_per_second": True,
            "output_dir": "/elsewhere",
        }
    )
    assert p.training == {"activation_checkpointing": True, "eval_strategy": "no"}
    assert len(p.notes) == 4
    assert any("'include_tokens_per_second' is ignored" in n for n in p.notes)


def test_data_stanza_with_arguments_overriding() -> None:
    p = parse(
        {"model_name_or_path": "m", "dataset_split": "validation", "max_seq_length": 64},
        data_processing={
            "dataset_name": "d.jsonl",
            "dataset_split": "train",
            "chat_template": "{{ x }}",
            "tokenize": True,
        },
    )
    assert (p.data.dataset, p.data.split, p.data.max_seq_len) == ("d.jsonl", "validation", 64)
    assert p.data.formatting == "template" and p.data.chat_template == "{{ x }}"


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"max_seq_len": 0}, "max_seq_len must be a positive integer, got 0"),
        ({"max_seq_len": "long"}, "max_seq_len must be a positive integer, got 'long'"),
        ({"packing": "yes"}, "packing must be true or false"),
        ({"peft_method": "prefix"}, "peft_method must be lora, qlora or null"),
        ({"r": 0}, "r must be a positive integer, got 0"),
        ({"lora_dropout": 1.5}, r"lora_dropout must be in \[0, 1\)"),
        ({"target_modules": []}, "target_modules must be a list of module names"),
        ({"formatting": "markdown"}, "formatting must be one of instruct, chat, text, template"),
        ({"formatting": "text", "completion_only_loss": True}, "formatting 'text' has none"),
        ({"trust_remote_code": "yes"}, "trust_remote_code must be true or false"),
        ({"warmup_steps_excluded": -1}, "warmup_steps_excluded must be ≥ 0"),
    ],
)
def test_bad_values(arguments, message) -> None:
    with pytest.raises(SpecError, match=message):
        parse({"model_name_or_path": "m", **arguments})


def test_no_model() -> None:
    with pytest.raises(SpecError, match=r"no model: set arguments\.model_name_or_path"):
        parse({})


def test_saved_training_fields_match_the_installed_transformers() -> None:
    import dataclasses

    import transformers
    from transformers import TrainingArguments

    installed = {f.name for f in dataclasses.fields(TrainingArguments) if f.init}
    saved = json.loads(FIELDS_FILE.read_text())
    assert set(training_fields()) == installed, (
        f"{FIELDS_FILE.name} lists transformers {saved['transformers']}, installed is "
        f"{transformers.__version__}: run python -m trainer_entry.backends"
    )


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (
            {"auto_find_batch_size": True},
            r"^spec arguments\.auto_find_batch_size: true is refused: on an out-of-memory error "
            r"it halves the batch .*; remove it",
        ),
        (
            {"parallelism_config": {"tp_size": 2}},
            r"^spec arguments\.parallelism_config: a value is refused: tensor, context or "
            r"sequence parallelism .*; remove it",
        ),
    ],
)
def test_arguments_that_would_falsify_the_row_are_refused(arguments, message) -> None:
    with pytest.raises(SpecError, match=message):
        parse({"model_name_or_path": "m", **arguments})


def test_refused_arguments_at_their_defaults_pass() -> None:
    p = parse(
        {"model_name_or_path": "m", "auto_find_batch_size": False, "parallelism_config": None}
    )
    assert p.training == {"auto_find_batch_size": False, "parallelism_config": None}


def test_a_launch_whose_ranks_share_batches_is_refused() -> None:
    from trainer_entry.run.parse import check_launch_env

    sizes = {"PARALLELISM_CONFIG_TP_SIZE": "2", "PARALLELISM_CONFIG_CP_SIZE": "1"}
    with pytest.raises(
        SpecError, match=r"^accelerate parallelism_config: PARALLELISM_CONFIG_TP_SIZE 2 is refused"
    ):
        check_launch_env({"ACCELERATE_USE_PARALLELISM_CONFIG": "true", **sizes})
    # accelerate ignores the sizes without its flag; data-parallel sizes are fine
    check_launch_env(sizes)
    check_launch_env(
        {"ACCELERATE_USE_PARALLELISM_CONFIG": "true", "PARALLELISM_CONFIG_DP_SHARD_SIZE": "4"}
    )
