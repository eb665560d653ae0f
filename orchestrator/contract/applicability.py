"""Which argument names the training child accepts. Pure: no training stack imported.

The orchestrator checks scenario arguments against these names while
planning, so a typo is an error before any job starts; the child checks them
again against the transformers it actually runs with. ``FIELDS_FILE``
lists ``transformers.TrainingArguments``' fields, saved from the version the
project is tested with (``python -m trainer_entry.backends`` rewrites it, as
only the child may import transformers; a test fails when it falls out of date).

Which argument belongs to which task, trainer and PEFT method
(``inapplicable_argument``) is decided here too, for the planner (one line at
the line that wrote it) and the child alike. So are the predecessor's names
(fms-hf-tuning's ``sft_trainer.py``, fms-acceleration's plugin flags): each one
that differs from ours is mapped (``RENAMED``, ``DATA_ALIASES``,
``formatter_template``) or refused with what to use instead (``REPLACED``,
``predecessor_argument``), never silently dropped.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

# the tasks and trainer backends are declared in ``trainers``; named here too, as the
# applicability rules speak of them
from orchestrator.contract.trainers import BACKEND_KEY as BACKEND_KEY
from orchestrator.contract.trainers import DEFAULT_TASK as DEFAULT_TASK
from orchestrator.contract.trainers import TASK_KEY as TASK_KEY
from orchestrator.contract.trainers import (
    TASK_LINES,
    TRAINERS,
    own_fields,
    task_backends,
    trainer_names,
)
from orchestrator.contract.trainers import TASKS as TASKS
from orchestrator.contract.trainers import default_backend as default_backend

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
        "model_kwargs",
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
#: eval after training: ``eval: true`` evaluates on a held-out split of the prepared
#: data (``holdout``: how many examples, a count or a fraction); see ``trainer_entry.results.evaluate``
EVAL_KEY = "eval"
HOLDOUT_KEY = "holdout"
EVAL_KEYS = frozenset({EVAL_KEY, HOLDOUT_KEY})


#: the packages the training child cannot run without: it imports peft whatever it trains
#: (``trainer_entry/results/finished.py``) and the default backend, ``sft``, is TRL's; the
#: orchestrator checks them before anything launches (``orchestrator.running.needs``)
#: and in each ``environments:`` entry's interpreter (``orchestrator.config.environments``)
TRAIN_STACK = ("torch", "transformers", "peft", "accelerate", "trl")


#: tunematrix's data setting <- the spellings accepted for it (in arguments and in
#: the scenarios file's data_processing stanza)
DATA_ALIASES: dict[str, tuple[str, ...]] = {
    "dataset": ("dataset", "dataset_name", "training_data_path", "data_path"),
    "split": ("dataset_split",),
    "formatting": ("formatting",),
    "instruction_field": ("instruction_field",),
    "input_field": ("input_field",),
    "response_field": ("response_field",),
    # text_column_name: the predecessor's later spelling of dataset_text_field
    "text_field": ("dataset_text_field", "text_field", "text_column_name"),
    "label_field": ("label_field", "dataset_label_field"),
    "image_field": ("image_field", "dataset_image_field"),
    "source_field": ("source_field",),
    "target_field": ("target_field",),
    "mlm_probability": ("mlm_probability",),
    "audio_field": ("audio_field", "dataset_audio_field"),
    # dataset_conversation_field: the predecessor's; it also means formatting chat
    "messages_field": ("messages_field", "dataset_conversation_field"),
    "chat_template": ("chat_template",),
    "response_template": ("response_template",),
    "completion_only_loss": ("completion_only_loss",),
    "max_seq_len": ("max_seq_len", "max_seq_length", "max_length", "model_max_length"),
    "packing": ("packing",),
    "dataset_kwargs": ("dataset_kwargs", "additional_dataset_kwargs"),
}
#: the predecessor's ``{{field}}`` template over a record: becomes a ``template``
#: formatting's chat_template (``formatter_template``)
FORMATTER_TEMPLATE_KEY = "data_formatter_template"
DATA_OTHER = frozenset({"pad_to_multiple_of", "tokenize", FORMATTER_TEMPLATE_KEY})
DATA_KEYS = frozenset({a for aliases in DATA_ALIASES.values() for a in aliases} | DATA_OTHER)

#: settings the libraries renamed between the releases tunematrix supports: the name
#: tunematrix uses (the newest release's: scenarios, specs and rows spell it so) -> the
#: names older releases take it under. The child passes each under the name the
#: installed class or function accepts, read from its fields (``trainer_entry.settings.installed``)
SPELLINGS: dict[str, tuple[str, ...]] = {
    # TrainingArguments (transformers ≥ 5.23 renamed them; 5.17–5.22 know only the old names)
    "activation_checkpointing": ("gradient_checkpointing",),
    "activation_checkpointing_kwargs": ("gradient_checkpointing_kwargs",),
    "eval_strategy": ("evaluation_strategy",),
    "use_cpu": ("no_cuda",),
    # TRL's SFTConfig: the length sequences are cut to (our max_seq_len)
    "max_length": ("max_seq_length",),
    # Trainer(...): what tokenizes the data
    "processing_class": ("tokenizer",),
    # from_pretrained / from_config: the weights' dtype (our torch_dtype)
    "dtype": ("torch_dtype",),
    # a model's own word on whether it recomputes its blocks' activations
    "is_activation_checkpointing": ("is_gradient_checkpointing",),
}
#: old names a scenario may write, taken as tunematrix's (rows and ids show one spelling)
RENAMED = {
    **{
        old: new
        for new in (
            "activation_checkpointing",
            "activation_checkpointing_kwargs",
            "eval_strategy",
            "use_cpu",
        )
        for old in SPELLINGS[new]
    },
    # the predecessor's LoRA bias (peft's LoraConfig.bias)
    "bias": "lora_bias",
}


def canonical_name(key: str) -> str:
    """The name tunematrix uses for argument ``key`` (``gradient_checkpointing`` ->
    ``activation_checkpointing``); other names are their own."""
    return RENAMED.get(key, key)


#: old names that no longer mean anything here, dropped with a note
DROPPED = {
    "include_tokens_per_second": "tokens per second are always measured (real tokens, global and per device)",
    "include_num_input_tokens_seen": "tokens are always counted",
}
#: set by the child from the spec; a scenario's value is ignored with a note
CONTROLLED = frozenset({"output_dir", "skip_memory_metrics", "use_cpu"})

OWN_KEYS = MODEL_KEYS | PEFT_KEYS | MEASURE_KEYS | EVAL_KEYS | DATA_KEYS | {BACKEND_KEY, TASK_KEY}

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


def training_fields_version() -> str:
    """The transformers whose ``TrainingArguments`` fields ``FIELDS_FILE`` saved."""
    return str(json.loads(FIELDS_FILE.read_text()).get("transformers", "?"))


def unknown_argument(
    key: str, fields: frozenset[str] | None = None, *, backend: str | None = None
) -> str | None:
    """Why ``key`` is not an argument anything accepts (with the closest name), or None.

    ``fields``: the trainer's argument names; by default ``TrainingArguments``', with
    the backend's own (``trainers.own_fields``: ``SFTConfig``'s for ``sft``), or every
    backend's while ``backend`` is not known yet (None: the planner checks a scenario's
    names before its cells, whose ``trainer`` a sweep may choose;
    ``inapplicable_argument`` then refuses one backend's field in a cell of another).
    The predecessor's names (``REPLACED``) are known: ``predecessor_argument`` says
    what to use instead.
    """
    classes: list[str] = []
    if fields is None:
        fields = training_fields()
        for t in TRAINERS:
            own = own_fields(t.name) if backend is None or t.name == backend else frozenset()
            if own:
                fields |= own
                classes.append(t.config_class)
    known = OWN_KEYS | REPLACED.keys() | RENAMED.keys() | DROPPED.keys() | CONTROLLED
    if key in known or key in fields:
        return None
    owners = backends_taking(key)
    if backend is not None and owners and backend not in owners:
        return backend_only_problem(key, backend, owners)
    close = difflib.get_close_matches(key, sorted(OWN_KEYS | fields), n=1)
    hint = f"; did you mean '{close[0]}'?" if close else ""
    what = " or ".join(["a TrainingArguments", *dict.fromkeys(classes)]) + " field"
    return f"unknown argument '{key}': not {what} nor a tunematrix setting{hint}"


def backends_taking(key: str) -> tuple[str, ...]:
    """The backends whose own configuration has field ``key`` (``trainers.own_fields``)."""
    return tuple(name for name in trainer_names() if key in own_fields(name))


# ---------------------------------------------------------------------------
# Which arguments belong to which task and trainer
# ---------------------------------------------------------------------------

#: the tasks that read text (a tokenizer, a length to cut to, padding)
TEXT_TASKS = tuple(t.name for t in TASK_LINES if t.text)
#: the tasks that learn a class per sample
CLASSIFICATION_TASKS = tuple(t.name for t in TASK_LINES if t.classifies)
#: settings every text task reads: the field read, the tokenizer, the length cut to, the padding
_TEXT_SETTINGS = ("text_field", "max_seq_len", "pad_to_multiple_of", "tokenizer_name_or_path")


def _task_settings() -> dict[str, tuple[str, ...]]:
    """Each setting that means something for some tasks only -> those tasks, from each
    task's line (``TaskLine.settings``, its text and classes)."""
    owners: dict[str, tuple[str, ...]] = {}
    for line in TASK_LINES:
        own = (
            *line.settings,
            *(k for k in (_TEXT_SETTINGS if line.text else ()) if k not in line.not_read),
            *(("label_field",) if line.classifies else ()),
        )
        for key in own:
            owners[key] = (*owners.get(key, ()), line.name)
    return owners


#: settings that mean something for some tasks only (canonical names: see ``ARGUMENT_TASKS``)
_TASK_SETTINGS: dict[str, tuple[str, ...]] = _task_settings()
assert FORMATTER_TEMPLATE_KEY in _TASK_SETTINGS, "causal-lm's line names the predecessor's template"
#: argument name (every spelling) -> the tasks it means something for; names not
#: listed apply to every task
ARGUMENT_TASKS: dict[str, tuple[str, ...]] = {
    alias: tasks
    for name, tasks in _TASK_SETTINGS.items()
    for alias in DATA_ALIASES.get(name, (name,))
}
#: ``peft_method`` values that train adapters; the LoRA settings need one
LORA_METHODS = ("lora", "qlora")
#: settings of LoRA adapters (``peft_method: lora`` or ``qlora``)
LORA_KEYS = PEFT_KEYS - {"peft_method"}


def peft_method_of(arguments: Mapping[str, object]) -> str | None:
    """The adapter method the arguments train (``lora``, ``qlora``), None for every weight."""
    method = arguments.get("peft_method")
    if not isinstance(method, str) or method.lower() in ("none", "full"):
        return None
    return method.lower()


def backend_only_fields() -> dict[str, tuple[str, ...]]:
    """Each setting that only some backends take -> those backends (``SFTConfig``'s own
    for ``sft``; ours excluded: a backend maps tunematrix's data settings onto its own)."""
    common = OWN_KEYS | training_fields()
    owners: dict[str, tuple[str, ...]] = {}
    for name in trainer_names():
        for key in sorted(own_fields(name) - common):
            owners[key] = (*owners.get(key, ()), name)
    return owners


@dataclass(frozen=True)
class Inapplicable:
    """Why a setting does not apply to a run, and what to do about it: kept apart, so a
    note on a setting left out says the reason alone, and a refusal says both."""

    why: str
    #: what to do (empty where the reason says it)
    advice: str = ""

    @property
    def line(self) -> str:
        """The refusal's one line: the reason, then what to do."""
        return f"{self.why}; {self.advice}" if self.advice else self.why


def _backend_only(key: str, backend: str, owners: tuple[str, ...]) -> Inapplicable:
    libraries = {t.name: t.library for t in TRAINERS}
    whose = " or ".join(f"trainer {o} ({libraries[o]})" for o in owners)
    return Inapplicable(f"'{key}' is an option of {whose}", f"this scenario runs trainer {backend}")


def backend_only_problem(key: str, backend: str, owners: tuple[str, ...]) -> str:
    """The refusal of a setting of backends ``owners`` in a run of trainer ``backend``."""
    return _backend_only(key, backend, owners).line


def inapplicable_argument(
    key: str,
    value: object,
    *,
    task: str,
    backend: str,
    arguments: Mapping[str, object],
    backend_only: Mapping[str, tuple[str, ...]] | None = None,
) -> Inapplicable | None:
    """Why ``key: value`` does not apply to a run of ``task`` with trainer ``backend``
    (its ``line`` says what to do), or None when it does.

    ``arguments``: the run's other arguments (the LoRA settings need ``peft_method``).
    ``backend_only``: ``backend_only_fields()``, when the caller asks for many keys at once.
    The key's old names (``RENAMED``) are judged as the new one.
    """
    if key == TASK_KEY:
        if value not in TASKS:
            return Inapplicable(f"task must be one of {', '.join(TASKS)}, got {value!r}")
        return None
    if key == BACKEND_KEY:
        if value not in trainer_names():
            return Inapplicable(
                f"trainer must be one of {', '.join(trainer_names())}, got {value!r}"
            )
        runs = task_backends(task)
        if value not in runs:
            return Inapplicable(
                f"trainer {value} does not train task {task}",
                f"it runs with {' or '.join(runs)} (remove trainer for the default, {runs[0]})",
            )
        return None
    name = RENAMED.get(key, key)
    tasks = ARGUMENT_TASKS.get(name)
    if tasks is not None and task not in tasks:
        return Inapplicable(
            f"'{key}' means nothing for task {task} (it is for {', '.join(tasks)})", "remove it"
        )
    if name in LORA_KEYS and peft_method_of(arguments) not in LORA_METHODS:
        return Inapplicable(f"'{key}' needs peft_method: lora", f"set peft_method or remove {key}")
    if name == HOLDOUT_KEY and arguments.get(EVAL_KEY) is not True:
        return Inapplicable(
            f"'{key}' is the eval set's size and needs eval: true", f"set eval or remove {key}"
        )
    owners = (backend_only_fields() if backend_only is None else backend_only).get(key)
    if owners and backend not in owners:
        return _backend_only(key, backend, owners)
    return None


# ---------------------------------------------------------------------------
# The predecessor's names (fms-hf-tuning's sft_trainer.py, fms-acceleration's plugins)
# ---------------------------------------------------------------------------

_NOT_SAVED = "a benchmark saves no model; remove it"
_TRACKER = (
    "tunematrix records the loss curve, timings and memory itself; for an experiment "
    "tracker use report_to (a TrainingArguments field), configured by its environment "
    "variables (a framework's env)"
)
_LORA_ONLY = (
    "LoRA here takes r, lora_alpha, lora_dropout, target_modules, lora_bias and "
    "modules_to_save; remove it"
)
_PROMPT_TUNING = "prompt tuning is not offered; use peft_method: lora or qlora"
_PLUGIN = (
    "fms-acceleration's plugins are not loaded by the training child; remove it "
    "(use_liger_kernel, a TrainingArguments field, fuses the loss, norms and RoPE)"
)
_DEFAULT_OFF: tuple[object, ...] = (None, False, "", [], {})

#: the predecessor's arguments with no counterpart here (fms-hf-tuning's model, data and
#: training arguments, its LoRA, prompt-tuning, quantization and tracker configs, its
#: launcher's job config, and fms-acceleration's plugin flags): name -> (why, and what to
#: use instead; the values that leave the feature off). A value that turns the feature on
#: is refused while planning and by the child; one that leaves it off is dropped by the
#: child with a note. Names that differ only in spelling are mapped instead: ``RENAMED``,
#: ``DATA_ALIASES``, ``use_flash_attn``, ``data_formatter_template``.
REPLACED: dict[str, tuple[str, tuple[object, ...]]] = {
    # ModelArguments
    "embedding_size_multiple_of": (
        "the embeddings are never resized here, so the model is measured with its own "
        "vocabulary; remove it",
        (*_DEFAULT_OFF, 1),
    ),
    "flash_attn_implementation": (
        "write attn_implementation: <its value> instead (use_flash_attn: true alone means "
        "flash_attention_2)",
        (*_DEFAULT_OFF, "flash_attention_2"),
    ),
    # DataArguments
    "data_config_path": (
        "data configs are not read; write the data settings as arguments (dataset, split, "
        "formatting and the field names) or in the scenarios file's data_processing stanza",
        _DEFAULT_OFF,
    ),
    "validation_data_path": (
        'a benchmark measures training only (eval_strategy stays "no"); remove it',
        _DEFAULT_OFF,
    ),
    "instruction_template": (
        "for chat data write formatting: chat with completion_only_loss: true (the loss is "
        "then on the assistant turns only)",
        _DEFAULT_OFF,
    ),
    "add_special_tokens": (
        "no tokens are added here (that would resize the embeddings); remove it",
        _DEFAULT_OFF,
    ),
    "do_dataprocessing_only": (
        "every run prepares its data before training (cached in the results folder's data/); "
        "remove it",
        _DEFAULT_OFF,
    ),
    "num_train_dataset_shards": (
        "it goes with do_dataprocessing_only; remove it",
        (*_DEFAULT_OFF, 1),
    ),
    "num_eval_dataset_shards": (
        "it goes with do_dataprocessing_only; remove it",
        (*_DEFAULT_OFF, 1),
    ),
    # TrainingArguments extensions
    "cache_dir": ("set HF_HOME or HF_HUB_CACHE in a framework's env instead", _DEFAULT_OFF),
    "save_model_dir": (_NOT_SAVED, _DEFAULT_OFF),
    "lora_post_process_for_vllm": (_NOT_SAVED, _DEFAULT_OFF),
    "enable_reduce_loss_sum": (
        "the loss is the trainer's mean; a summed loss is not offered; remove it",
        _DEFAULT_OFF,
    ),
    "trainer_controller_config_file": (
        "a benchmark runs a fixed number of steps (max_steps); remove it",
        _DEFAULT_OFF,
    ),
    "exp_metadata": (
        "each run's spec.json and the report record what ran; remove it",
        _DEFAULT_OFF,
    ),
    # trackers (TrackerConfigs)
    "trackers": (_TRACKER, (*_DEFAULT_OFF, ["file_logger"], "file_logger")),
    "tracker": (_TRACKER, (*_DEFAULT_OFF, "file_logger")),
    **{
        name: (_TRACKER, _DEFAULT_OFF)
        for name in (
            "experiment",
            "run_uri_export_path",
            "aim_experiment",
            "aim_repo",
            "aim_remote_server_ip",
            "aim_remote_server_port",
            "aim_url",
            "mlflow_experiment",
            "mlflow_tracking_uri",
            "clearml_project",
            "clearml_task",
            "scanner_output_filename",
            "training_logs_filename",
        )
    },
    # LoraConfig beyond ours, aLoRA, prompt tuning, MXFP4
    "exclude_modules": (_LORA_ONLY, _DEFAULT_OFF),
    "init_lora_weights": (_LORA_ONLY, (None, True)),
    "layers_to_transform": (_LORA_ONLY, _DEFAULT_OFF),
    "layers_pattern": (_LORA_ONLY, _DEFAULT_OFF),
    "trainable_token_indices": (_LORA_ONLY, _DEFAULT_OFF),
    "loftq_config": (_LORA_ONLY, _DEFAULT_OFF),
    "target_parameters": (_LORA_ONLY, _DEFAULT_OFF),
    "alora_invocation_string": ("aLoRA is not offered; use peft_method: lora", _DEFAULT_OFF),
    "prompt_tuning_init": (_PROMPT_TUNING, _DEFAULT_OFF),
    "prompt_tuning_init_text": (_PROMPT_TUNING, _DEFAULT_OFF),
    "num_virtual_tokens": (_PROMPT_TUNING, _DEFAULT_OFF),
    "quantization_method": (
        "MXFP4 models are not offered; for LoRA over a 4-bit base use peft_method: qlora",
        (*_DEFAULT_OFF, "none"),
    ),
    "dequantize": (
        "it goes with quantization_method mxfp4, which is not offered; remove it",
        (None, True, False),
    ),
    # fms-acceleration's plugin flags
    "bnb_qlora": (
        "write peft_method: qlora instead (LoRA over a bitsandbytes 4-bit base)",
        _DEFAULT_OFF,
    ),
    "auto_gptq": (
        "GPTQ-quantized base models are not offered; for LoRA over a 4-bit base use "
        "peft_method: qlora",
        _DEFAULT_OFF,
    ),
    "fused_lora": (_PLUGIN, _DEFAULT_OFF),
    "fast_kernels": (_PLUGIN, _DEFAULT_OFF),
    "fast_moe": (_PLUGIN, _DEFAULT_OFF),
    "odm": ("online data mixing is not offered; remove it", _DEFAULT_OFF),
    "multipack": (
        "multipack sampling is not offered; use packing: true (every row filled) or, with "
        "trainer sft, padding_free: true",
        _DEFAULT_OFF,
    ),
}

#: ``peft_method`` values of the predecessor's that are not offered -> what to use instead
_PEFT_REPLACED = {
    "pt": "prompt tuning (peft_method pt) is not offered; use lora or qlora, or remove "
    "peft_method for full fine-tuning",
    "alora": "aLoRA (peft_method alora) is not offered; use lora",
}


def _same(value: object, other: object) -> bool:
    """Equal and of one type (``True`` is not ``1``)."""
    return type(value) is type(other) and value == other


def is_off(key: str, value: object) -> bool:
    """Whether ``value`` leaves the predecessor's feature ``key`` (``REPLACED``) off."""
    return any(_same(value, off) for off in REPLACED[key][1])


def predecessor_argument(key: str, value: object) -> str | None:
    """Why the predecessor's ``key: value`` is refused (one line, with what to use
    instead), or None when it is accepted (a name of ours, a mapped one, or a
    ``REPLACED`` one at a value that leaves it off, which the child drops with a note).

    Also the values the predecessor spelled differently: ``peft_method: pt``,
    fms-acceleration's ``padding_free: ["huggingface"]``, a ``data_formatter_template``
    that cannot be translated (``formatter_template``).
    """
    if key in REPLACED:
        if is_off(key, value):
            return None
        return f"'{key}' (fms-hf-tuning's) has no counterpart here: {REPLACED[key][0]}"
    if key == "peft_method" and value is not None:
        method = value.lower() if isinstance(value, str) else value
        if method in _PEFT_REPLACED:
            return _PEFT_REPLACED[str(method)]
        if method not in ("none", "full", *LORA_METHODS):
            return f"peft_method must be lora, qlora or null, got {value!r}"
    if key == "padding_free" and isinstance(value, list):
        return (
            f"padding_free {json.dumps(value)} is fms-acceleration's plugin flag; write "
            "padding_free: true (TRL's padding-free batching, trainer sft)"
        )
    if key == FORMATTER_TEMPLATE_KEY and value is not None:
        if not isinstance(value, str):
            return f"{key} must be a string, got {value!r}"
        try:
            formatter_template(value)
        except ValueError as exc:
            return str(exc)
    return None


_EXPRESSION = re.compile(r"\{\{(.*?)\}\}", re.S)
_FIELD = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*")
_ELEMENT = re.compile(r"""\s*element\s*\[\s*(['"])([^'"\\]+)\1\s*\]\s*""")
#: the tokenizer's tokens a template formatting renders with
_TOKENS = ("eos_token", "bos_token")


def formatter_template(template: str) -> str:
    """The predecessor's ``data_formatter_template`` as a ``template`` formatting's
    ``chat_template`` (which renders with ``messages=[record]``).

    The predecessor's template names a record's fields as ``{{field}}`` (or
    ``{{element['field']}}``) and the tokenizer's tokens as ``{{eos_token}}``; each
    field becomes ``{{ messages[0]['field'] }}``. Anything Jinja would read otherwise
    (a ``{% %}`` block, a filter, another special token) raises ``ValueError`` saying
    what to write instead.
    """
    out: list[str] = []
    end = 0
    for match in _EXPRESSION.finditer(template):
        out.append(template[end : match.start()])
        end = match.end()
        inner = match.group(1)
        field = _FIELD.fullmatch(inner)
        element = _ELEMENT.fullmatch(inner)
        if field is not None and field.group(1) in _TOKENS:
            out.append("{{ " + field.group(1) + " }}")
            continue
        if field is not None and field.group(1).endswith("_token"):
            raise ValueError(
                f"{FORMATTER_TEMPLATE_KEY} uses {{{{{field.group(1)}}}}}; a template renders "
                f"with {' and '.join(_TOKENS)} only: write the token's text instead"
            )
        name = field.group(1) if field is not None else element.group(2) if element else None
        if name is None:
            raise ValueError(
                f"{FORMATTER_TEMPLATE_KEY} has {{{{{inner.strip()}}}}}, not a {{{{field}}}}; "
                "write it as chat_template (formatting: template), a Jinja template "
                "rendered with messages=[record]"
            )
        out.append("{{ messages[0][" + json.dumps(name) + "] }}")
    out.append(template[end:])
    for literal in out[::2]:
        if any(mark in literal for mark in ("{{", "{%", "{#")):
            raise ValueError(
                f"{FORMATTER_TEMPLATE_KEY} has Jinja beyond {{{{field}}}}; write it as "
                "chat_template (formatting: template), a Jinja template rendered with "
                "messages=[record]"
            )
    return "".join(out)
