"""Which argument names the training child accepts. Pure: no training stack imported.

The orchestrator checks scenario arguments against these names while
planning, so a typo is an error before any job starts; the child checks them
again against the transformers it actually runs with. ``TRAINING_FIELDS``
lists ``transformers.TrainingArguments``' fields, saved from the version the
project is tested with (``python -m trainer_entry.argnames`` rewrites it;
a test fails when it falls out of date).
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path

FIELDS_FILE = Path(__file__).resolve().parent / "assets" / "training_arguments.json"

MODEL_KEYS = frozenset(
    {
        "model_name_or_path",
        "tokenizer_name_or_path",
        "torch_dtype",
        "dtype",
        "attn_implementation",
        "use_flash_attn",
        "trust_remote_code",
        "model_revision",
    }
)
PEFT_KEYS = frozenset(
    {
        "peft_method",
        "r",
        "lora_r",
        "lora_alpha",
        "lora_dropout",
        "target_modules",
        "lora_bias",
        "modules_to_save",
    }
)
MEASURE_KEYS = frozenset({"warmup_steps_excluded", "peak_tflops_per_device", "instrumentation"})

#: tunematrix's data setting <- the spellings accepted for it (in arguments and in
#: the scenarios file's data_processing stanza)
DATA_ALIASES: dict[str, tuple[str, ...]] = {
    "dataset": ("dataset", "dataset_name", "training_data_path", "data_path"),
    "split": ("dataset_split",),
    "formatting": ("formatting",),
    "instruction_field": ("instruction_field",),
    "input_field": ("input_field",),
    "response_field": ("response_field",),
    "text_field": ("dataset_text_field", "text_field"),
    "messages_field": ("messages_field",),
    "chat_template": ("chat_template",),
    "response_template": ("response_template",),
    "completion_only_loss": ("completion_only_loss",),
    "max_seq_len": ("max_seq_len", "max_seq_length", "max_length"),
    "packing": ("packing",),
    "dataset_kwargs": ("dataset_kwargs", "additional_dataset_kwargs"),
}
DATA_OTHER = frozenset({"pad_to_multiple_of", "tokenize"})
DATA_KEYS = frozenset({a for aliases in DATA_ALIASES.values() for a in aliases} | DATA_OTHER)

#: old names, translated with a note
RENAMED = {
    "evaluation_strategy": "eval_strategy",
    "gradient_checkpointing": "activation_checkpointing",
}
#: old names that no longer mean anything here, dropped with a note
DROPPED = {
    "include_tokens_per_second": "tokens per second are always measured (real tokens, global and per device)",
    "include_num_input_tokens_seen": "tokens are always counted",
}
#: set by the child from the spec; a scenario's value is ignored with a note
CONTROLLED = frozenset({"output_dir", "skip_memory_metrics", "use_cpu"})

OWN_KEYS = MODEL_KEYS | PEFT_KEYS | MEASURE_KEYS | DATA_KEYS


def training_fields() -> frozenset[str]:
    """``TrainingArguments`` field names, as saved in ``FIELDS_FILE``."""
    return frozenset(json.loads(FIELDS_FILE.read_text())["fields"])


def unknown_argument(key: str, fields: frozenset[str] | None = None) -> str | None:
    """Why ``key`` is not an argument anything accepts (with the closest name), or None."""
    fields = training_fields() if fields is None else fields
    if key in OWN_KEYS or key in fields or key in RENAMED or key in DROPPED or key in CONTROLLED:
        return None
    close = difflib.get_close_matches(key, sorted(OWN_KEYS | fields), n=1)
    hint = f"; did you mean '{close[0]}'?" if close else ""
    return f"unknown argument '{key}': not a TrainingArguments field nor a tunematrix setting{hint}"


def _installed_fields() -> tuple[str, list[str]]:
    import dataclasses

    import transformers
    from transformers import TrainingArguments

    names = sorted(f.name for f in dataclasses.fields(TrainingArguments) if f.init)
    return transformers.__version__, names


if __name__ == "__main__":
    version, names = _installed_fields()
    FIELDS_FILE.write_text(json.dumps({"transformers": version, "fields": names}, indent=1) + "\n")
    print(f"wrote {len(names)} TrainingArguments fields of transformers {version} to {FIELDS_FILE}")
