"""Settings passed under the names the installed libraries take (trainer_entry.settings.installed).

The rules are tested on field sets as two releases of transformers have them (5.17's
``TrainingArguments`` knows only ``gradient_checkpointing``; 5.24's both), and on the
installed classes themselves; the floor env (tests/e2e/test_floor.py) runs the tiny
matrix on the real 5.17.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from orchestrator.contract.applicability import RENAMED, SPELLINGS, canonical_name
from orchestrator.contract.spec import RunSpec
from trainer_entry.run.parse import parse_arguments
from trainer_entry.settings import installed
from trainer_entry.settings.installed import Owner, SettingError, in_installed_names
from trainer_entry.spec_errors import SpecError

OLD = frozenset({"gradient_checkpointing", "gradient_checkpointing_kwargs", "learning_rate"})
NEW = OLD | {"activation_checkpointing", "activation_checkpointing_kwargs"}
OWNER = Owner("transformers", "TrainingArguments")


def test_a_new_name_goes_under_the_old_one_where_only_that_is_taken() -> None:
    notes: list[str] = []
    kwargs = {"activation_checkpointing": True, "learning_rate": 1e-4}
    assert in_installed_names(kwargs, OLD, OWNER, notes) == {
        "gradient_checkpointing": True,
        "learning_rate": 1e-4,
    }
    assert notes == [
        f"activation_checkpointing is passed as gradient_checkpointing, the name {OWNER} takes"
    ]
    # the same again adds no second note
    in_installed_names(kwargs, OLD, OWNER, notes)
    assert len(notes) == 1


def test_a_name_the_library_takes_goes_as_it_is() -> None:
    notes: list[str] = []
    kwargs = {"activation_checkpointing": False, "activation_checkpointing_kwargs": {"x": 1}}
    assert in_installed_names(kwargs, NEW, OWNER, notes) == kwargs
    assert notes == []


def test_a_setting_taken_under_no_name_names_the_key_the_library_and_its_version() -> None:
    version = OWNER.version
    assert re.fullmatch(r"\d+\.\d+.*", version)
    with pytest.raises(SettingError) as err:
        in_installed_names(
            {"learning_rate": 1.0, "torch_empty_cache_steps": 4},
            OLD,
            OWNER,
            why=lambda key: " (transformers 9.9's does)",
        )
    assert err.value.key == "torch_empty_cache_steps" and err.value.owner == OWNER
    assert str(err.value) == (
        f"torch_empty_cache_steps: transformers {version}'s TrainingArguments does not take "
        "it (transformers 9.9's does); upgrade transformers or remove the setting"
    )
    with pytest.raises(SettingError, match=r"nor under its older name gradient_checkpointing\)"):
        in_installed_names({"activation_checkpointing": True}, frozenset(), OWNER)


def test_read_finds_a_setting_under_whichever_name_the_class_has() -> None:
    @dataclasses.dataclass
    class Old:
        gradient_checkpointing: bool = True

    @dataclasses.dataclass
    class New:
        activation_checkpointing: bool = False
        gradient_checkpointing: bool = True  # the deprecated alias: the new name wins

    assert installed.read(Old(), "activation_checkpointing") is True
    assert installed.read(New(), "activation_checkpointing") is False
    assert installed.read(Old(), "eval_strategy") is None
    assert installed.init_fields(Old) == frozenset({"gradient_checkpointing"})


def test_every_old_spelling_a_scenario_may_write_reads_as_tunematrix_s() -> None:
    for old, new in RENAMED.items():
        assert canonical_name(old) == new
        assert new not in RENAMED, "one step from an old name to ours"
    for new, olds in SPELLINGS.items():
        assert new not in olds and len(set(olds)) == len(olds)
    assert canonical_name("learning_rate") == "learning_rate"


def test_the_installed_classes_take_every_setting_tunematrix_passes(tmp_path: Path) -> None:
    """The installed transformers, trl and peft, whatever their release: the names
    the backends pass are found, and built classes give back what was set."""
    from trainer_entry.backends.hf import training_arguments
    from trainer_entry.backends.sft import sft_config
    from trainer_entry.models.load import dtype_keyword, lora_config
    from trainer_entry.tasks import get_task

    spec = RunSpec(
        arguments={
            "model_name_or_path": "tiny-llama",
            "activation_checkpointing": True,
            "activation_checkpointing_kwargs": {"use_reentrant": False},
            "eval_strategy": "no",
            "max_steps": 2,
        },
        output_dir=str(tmp_path),
    )
    parsed = parse_arguments(spec)
    for built in (training_arguments(spec, parsed, False), sft_config(spec, parsed, False)):
        assert installed.read(built, "activation_checkpointing") is True
        assert installed.read(built, "activation_checkpointing_kwargs") == {"use_reentrant": False}
    assert installed.read(sft_config(spec, parsed, False), "max_length") == parsed.data.max_seq_len
    assert dtype_keyword() in ("dtype", "torch_dtype")
    lora = lora_config(dataclasses.replace(parsed.peft, method="lora", r=4), get_task("causal-lm"))
    assert (lora.r, lora.bias) == (4, "none")


def test_a_refused_value_names_the_library_and_its_version(tmp_path: Path) -> None:
    from trainer_entry.backends.hf import training_arguments

    spec = RunSpec(
        arguments={"model_name_or_path": "m", "lr_scheduler_type": "bogus"},
        output_dir=str(tmp_path),
    )
    with pytest.raises(SpecError) as err:
        training_arguments(spec, parse_arguments(spec), False)
    assert isinstance(err.value, installed.Refused)
    assert str(err.value).startswith(f"invalid trainer arguments ({OWNER}): bogus is not")
