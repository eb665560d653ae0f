"""The child's rooms: what each may import, and the model kinds told apart without torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainer_entry.models.kinds import model_kind

REPO = Path(__file__).resolve().parents[2]


def imported_after(*modules: str) -> set[str]:
    """The modules a fresh interpreter holds after importing ``modules``."""
    code = (
        "import importlib, json, sys\n"
        f"for m in {list(modules)!r}: importlib.import_module(m)\n"
        "print(json.dumps(sorted(sys.modules)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return set(json.loads(out.stdout))


def test_the_checks_before_training_import_no_training_stack() -> None:
    # a misspelt dataset or backend fails in a fraction of a second, not after torch loads
    loaded = imported_after(
        "trainer_entry.run.preflight",
        "trainer_entry.results.failure",
        "trainer_entry.backends",
    )
    assert not {"torch", "transformers", "numpy"} & loaded


def test_the_plain_trainer_imports_no_trl() -> None:
    # trainer: hf pays for what it uses: TRL is the sft backend's alone
    loaded = imported_after(
        "trainer_entry.run.train",
        "trainer_entry.backends.hf",
        "trainer_entry.tasks.causal_lm",
        "trainer_entry.tasks.seq_classification",
        "trainer_entry.tasks.image_classification",
    )
    assert "transformers.trainer" in loaded  # the stack itself is there
    assert not {m for m in loaded if m.partition(".")[0] == "trl"}


def test_the_text_data_path_imports_no_datasets() -> None:
    # a local file is read by hand; the datasets package is for hub datasets (and is
    # imported by transformers' Trainer itself when it is installed)
    loaded = imported_after(
        "trainer_entry.data.prepare",
        "trainer_entry.data.sources",
        "trainer_entry.data.tokenize",
        "trainer_entry.data.cache",
        "trainer_entry.data.holdout",
        "trainer_entry.tasks.causal_lm",
    )
    assert "torch" in loaded  # the path itself is there
    assert not {m for m in loaded if m.partition(".")[0] == "datasets"}


def test_data_does_not_import_models() -> None:
    # models.tiny trains its tokenizer on data's prompts; the other way round would be a cycle
    loaded = imported_after("trainer_entry.data.prepare", "trainer_entry.data.collate")
    assert not {m for m in loaded if m.startswith("trainer_entry.models")}


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("tiny-llama", "tiny"),
        ("config:llama-3.1-8b", "config"),
        ("config:/models/x/config.json", "config"),
        ("meta-llama/Llama-3.2-1B", "pretrained"),
        ("/models/local-folder", "pretrained"),
        ("tiny-llama-2", "pretrained"),
    ],
)
def test_model_kinds(name: str, kind: str) -> None:
    assert model_kind(name) == kind
