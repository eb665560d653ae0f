"""Which argument names the training child accepts. Pure: no training stack imported.

The orchestrator checks scenario arguments against these names while
planning, so a typo is an error before any job starts; the child checks them
again against the transformers it actually runs with. ``FIELDS_FILE``
lists ``transformers.TrainingArguments``' fields, saved from the version the
project is tested with (``python -m trainer_entry.backends`` rewrites it, as
only the child may import transformers; a test fails when it falls out of date).
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping
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
#: names the child's trainer backend (``hf``, the default: the Hugging Face Trainer)
BACKEND_KEY = "trainer"

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

OWN_KEYS = MODEL_KEYS | PEFT_KEYS | MEASURE_KEYS | DATA_KEYS | {BACKEND_KEY}

#: TrainingArguments that would make a row describe a run other than the one measured:
#: name -> (why, what to do). Refused while planning and again by the child.
REFUSED = {
    "auto_find_batch_size": (
        "on an out-of-memory error it halves the batch and restarts, so the row would report "
        "a batch it did not train with and count the failed attempt's tokens",
        "remove it; a cell that does not fit is reported with status oom",
    ),
    "parallelism_config": (
        "tensor, context or sequence parallelism feeds the same batch to several ranks, so "
        "tokens counted on every rank would be counted more than once",
        "remove it; use data parallelism (a DDP or FSDP accelerate config)",
    ),
}

#: accelerate's parallelism sizes (``parallelism_config_<x>_size`` in an accelerate config,
#: ``PARALLELISM_CONFIG_<X>_SIZE`` in a launched process) whose ranks share batches
BATCH_SHARING_SIZES = ("tp", "cp", "sp")


def refused_argument(key: str, value: object) -> str | None:
    """Why ``key: value`` is refused (with what to do), or None when it is accepted.

    Only a value that turns the feature on is refused: ``auto_find_batch_size: false``
    and ``parallelism_config: null`` (or any empty value) are the defaults and change
    nothing. The reason leaves the key out: callers put its path in front.
    """
    if key not in REFUSED or not value:
        return None
    why, todo = REFUSED[key]
    shown = json.dumps(value) if isinstance(value, (bool, int, float, str)) else "a value"
    return f"{shown} is refused: {why}; {todo}"


def batch_sharing_problem(sizes: Mapping[str, object], where: str = "") -> str | None:
    """Why these parallelism sizes (read from ``where``) are refused, or None.

    ``sizes`` maps the name the user wrote (``parallelism_config_tp_size``, or
    ``PARALLELISM_CONFIG_TP_SIZE``) to its value; unset is None. Data parallelism (DDP,
    FSDP's dp_shard and dp_replicate) gives each rank its own batch; tensor, context and
    sequence parallelism split one batch over several ranks, and the child's token counts
    and effective batch assume the former.
    """
    prefix = f"{where}: " if where else ""
    bad = []
    for name, value in sizes.items():
        try:
            size = int(str(value)) if value is not None else 1
        except ValueError:
            return f"{prefix}{name} must be an integer, got {value!r}"
        if size > 1:
            bad.append(f"{name} {size}")
    if not bad:
        return None
    return (
        f"{prefix}{', '.join(bad)} is refused: tensor, context or sequence parallelism feeds "
        "the same batch to several ranks, so tokens counted on every rank would be counted "
        "more than once; set it to 1 and use data parallelism (DDP or FSDP)"
    )


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
