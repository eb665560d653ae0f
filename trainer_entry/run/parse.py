"""Split the merged trainer arguments of a spec into model, data, PEFT and Trainer parts.

A scenario writes all its arguments in one flat mapping, as the predecessor
did. Here each key finds its owner: tunematrix's model, data, PEFT and
measurement settings, or the trainer backend's arguments (``trainer``
names the backend; the default ``hf`` takes ``transformers.TrainingArguments``).
A key that belongs to none is an error naming the closest known key, so a
typo never silently does nothing. A few old spellings are translated.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from orchestrator.contract.applicability import (
    BATCH_SHARING_SIZES,
    CONTROLLED,
    DATA_ALIASES,
    DROPPED,
    EVAL_KEY,
    FORMATTER_TEMPLATE_KEY,
    HOLDOUT_KEY,
    OWN_KEYS,
    REFUSED,
    RENAMED,
    REPLACED,
    batch_sharing_problem,
    formatter_template,
    predecessor_argument,
    refused_argument,
    training_fields,
    unknown_argument,
)
from orchestrator.contract.spec import RunSpec
from trainer_entry.backends import backend_name, get_backend
from trainer_entry.data.formats import FORMATTINGS
from trainer_entry.settings.parsed import (
    DataConfig,
    EvalConfig,
    MeasureConfig,
    ModelConfig,
    ParsedArguments,
    PeftConfig,
)
from trainer_entry.spec_errors import SpecError
from trainer_entry.tasks import task_name

__all__ = [
    "DataConfig",
    "EvalConfig",
    "MeasureConfig",
    "ModelConfig",
    "ParsedArguments",
    "PeftConfig",
    "check_launch_env",
    "parse_arguments",
]


def _eval_config(args: dict[str, Any]) -> EvalConfig:
    enabled = args.get(EVAL_KEY)
    if enabled is None:
        enabled = False
    _check_type(EVAL_KEY, enabled, bool, "true or false")
    holdout = args.get(HOLDOUT_KEY)
    if holdout is not None:
        _check_type(HOLDOUT_KEY, holdout, (int, float), "a count ≥ 1 or a fraction in (0, 1)")
        if isinstance(holdout, float) and not 0 < holdout < 1:
            raise SpecError(f"{HOLDOUT_KEY} as a fraction must be in (0, 1), got {holdout}")
        if isinstance(holdout, int) and holdout < 1:
            raise SpecError(f"{HOLDOUT_KEY} as a count must be ≥ 1, got {holdout}")
    return EvalConfig(enabled=enabled, holdout=holdout)


def _check_type(key: str, value: Any, kind: type | tuple[type, ...], what: str) -> Any:
    if isinstance(value, bool) and kind in (int, float, (int, float)):
        raise SpecError(f"{key} must be {what}, got {value!r}")
    if not isinstance(value, kind):
        raise SpecError(f"{key} must be {what}, got {value!r}")
    return value


def _positive_int(key: str, value: Any) -> int:
    _check_type(key, value, int, "a positive integer")
    if value <= 0:
        raise SpecError(f"{key} must be a positive integer, got {value}")
    return int(value)


def parse_arguments(
    spec: RunSpec, known_fields: frozenset[str] | None = None, *, check_names: bool = True
) -> ParsedArguments:
    """Sort every argument of ``spec`` to its owner; unknown keys are errors.

    ``known_fields`` defaults to the trainer backend's argument fields (which
    imports its training stack); ``check_names=False`` checks values only.
    """
    args = dict(spec.arguments)
    notes: list[str] = []
    for old, new in RENAMED.items():
        if old in args:
            if new in args:
                raise SpecError(f"'{old}' is the old name of '{new}', which is set too; keep one")
            args[new] = args.pop(old)
            notes.append(f"argument '{old}' is the old name of '{new}'")
    for old, why in DROPPED.items():
        if old in args:
            args.pop(old)
            notes.append(f"argument '{old}' is ignored: {why}")
    for key in CONTROLLED & args.keys():
        args.pop(key)
        notes.append(f"argument '{key}' is set by tunematrix and was ignored")
    for key in sorted(REFUSED.keys() & args.keys()):
        refused = refused_argument(key, args[key])
        if refused:
            raise SpecError(f"spec arguments.{key}: {refused}")
    for key in sorted(args):  # the predecessor's names: refused, or left off and dropped
        replaced = predecessor_argument(key, args[key])
        if replaced:
            raise SpecError(f"spec arguments.{key}: {replaced}")
        if key in REPLACED:
            args.pop(key)
            notes.append(f"argument '{key}' (fms-hf-tuning's) leaves its feature off; ignored")

    task = task_name(args)
    backend = backend_name(args, task)
    if known_fields is not None:
        fields = known_fields
    else:
        fields = get_backend(backend).argument_fields() if check_names else training_fields()
    for key in args if check_names else ():
        problem = unknown_argument(key, fields)
        if problem:
            raise SpecError(problem)

    model = _model_config(spec, args)
    data = _data_config(spec, args)
    peft = _peft_config(args)
    measure = MeasureConfig(
        warmup_steps_excluded=(
            None
            if args.get("warmup_steps_excluded") is None
            else _check_type(
                "warmup_steps_excluded", args["warmup_steps_excluded"], int, "an integer ≥ 0"
            )
        ),
        peak_tflops_per_device=(
            None
            if args.get("peak_tflops_per_device") is None
            else float(
                _check_type(
                    "peak_tflops_per_device",
                    args["peak_tflops_per_device"],
                    (int, float),
                    "a number",
                )
            )
        ),
    )
    if args.get("instrumentation") is not None:
        measure = dataclasses.replace(
            measure,
            instrumentation=_check_type(
                "instrumentation", args["instrumentation"], bool, "true or false"
            ),
        )
    if measure.warmup_steps_excluded is not None and measure.warmup_steps_excluded < 0:
        raise SpecError(f"warmup_steps_excluded must be ≥ 0, got {measure.warmup_steps_excluded}")
    pad_multiple = args.get("pad_to_multiple_of")
    if pad_multiple is not None:
        pad_multiple = _positive_int("pad_to_multiple_of", pad_multiple)
    training = {k: v for k, v in args.items() if k in fields and k not in OWN_KEYS}
    return ParsedArguments(
        model=model,
        data=data,
        peft=peft,
        measure=measure,
        training=training,
        pad_to_multiple_of=pad_multiple,
        notes=notes,
        backend=backend,
        task=task,
        evaluation=_eval_config(args),
    )


def check_launch_env(env: Mapping[str, str]) -> None:
    """Refuse a launch whose ranks share batches (accelerate's parallelism config).

    ``accelerate launch`` passes an accelerate config's ``parallelism_config`` to the
    process as ``PARALLELISM_CONFIG_<X>_SIZE``; the orchestrator refuses such configs
    while planning, this catches them in a spec or command run by hand.
    """
    # accelerate reads the sizes only under this flag (accelerator.py)
    if env.get("ACCELERATE_USE_PARALLELISM_CONFIG", "false").lower() != "true":
        return
    names = (f"PARALLELISM_CONFIG_{n.upper()}_SIZE" for n in BATCH_SHARING_SIZES)
    problem = batch_sharing_problem(
        {name: env.get(name) for name in names}, "accelerate parallelism_config"
    )
    if problem:
        raise SpecError(problem)


def _model_config(spec: RunSpec, args: dict[str, Any]) -> ModelConfig:
    name = args.get("model_name_or_path") or spec.model_name_or_path
    if not name:
        raise SpecError("no model: set arguments.model_name_or_path")
    _check_type("model_name_or_path", name, str, "a string")
    dtype = args.get("torch_dtype", args.get("dtype"))
    if dtype is not None:
        _check_type("torch_dtype", dtype, str, "a dtype name such as bfloat16")
    attn = args.get("attn_implementation")
    if attn is None and args.get("use_flash_attn") is True:
        attn = "flash_attention_2"
    trust = args.get("trust_remote_code", False)
    _check_type("trust_remote_code", trust, bool, "true or false")
    tokenizer = args.get("tokenizer_name_or_path")
    kwargs = args.get("model_kwargs") or {}
    _check_type("model_kwargs", kwargs, dict, "a mapping of keyword arguments")
    return ModelConfig(
        kwargs=dict(kwargs),
        name=name,
        tokenizer=tokenizer,
        dtype=dtype,
        attn_implementation=attn,
        trust_remote_code=trust,
        revision=args.get("model_revision"),
    )


def _data_config(spec: RunSpec, args: dict[str, Any]) -> DataConfig:
    stanza = dict(spec.data_processing or {})
    values: dict[str, Any] = {}
    for name, aliases in DATA_ALIASES.items():
        for source in (stanza, args):  # arguments override the file's stanza
            for alias in aliases:
                if alias in source and source[alias] is not None:
                    values[name] = source[alias]
    given = {**stanza, **args}
    if given.get(FORMATTER_TEMPLATE_KEY) is not None:  # the predecessor's {{field}} template
        if values.get("chat_template"):
            raise SpecError(f"{FORMATTER_TEMPLATE_KEY} and chat_template are both set; keep one")
        try:
            values["chat_template"] = formatter_template(given[FORMATTER_TEMPLATE_KEY])
        except ValueError as exc:
            raise SpecError(str(exc)) from None
        if values.setdefault("formatting", "template") != "template":
            raise SpecError(f"{FORMATTER_TEMPLATE_KEY} is formatting template; remove formatting")
    if "formatting" not in values and given.get("dataset_conversation_field") is not None:
        values["formatting"] = "chat"  # the predecessor's conversations field
    if "formatting" not in values and values.get("chat_template"):
        values["formatting"] = "template"  # the predecessor's chat_template over a record
    for key in (
        "split",
        "formatting",
        "instruction_field",
        "input_field",
        "response_field",
        "text_field",
        "label_field",
        "image_field",
        "source_field",
        "target_field",
        "audio_field",
        "messages_field",
        "chat_template",
        "response_template",
        "dataset",
    ):
        if key in values:
            _check_type(key, values[key], str, "a string")
    if "completion_only_loss" in values:
        _check_type("completion_only_loss", values["completion_only_loss"], bool, "true or false")
    if "packing" in values:
        _check_type("packing", values["packing"], bool, "true or false")
    if "max_seq_len" in values:
        _check_type("max_seq_len", values["max_seq_len"], int, "a positive integer")
        if values["max_seq_len"] <= 0:
            raise SpecError(f"max_seq_len must be a positive integer, got {values['max_seq_len']}")
    if "dataset_kwargs" in values:
        _check_type("dataset_kwargs", values["dataset_kwargs"], dict, "a mapping")
    if "mlm_probability" in values:
        share = values["mlm_probability"]
        if isinstance(share, bool) or not isinstance(share, int | float) or not 0 < share < 1:
            raise SpecError(f"mlm_probability must be a number between 0 and 1, got {share!r}")
        values["mlm_probability"] = float(share)
    cfg = DataConfig(**values)
    if cfg.formatting not in FORMATTINGS:
        raise SpecError(
            f"formatting must be one of {', '.join(FORMATTINGS)}, got {cfg.formatting!r}"
        )
    if cfg.formatting == "template" and not cfg.chat_template:
        raise SpecError("formatting 'template' needs chat_template (a Jinja template)")
    if cfg.formatting == "template" and cfg.completion_only_loss and not cfg.response_template:
        raise SpecError("completion_only_loss with formatting 'template' needs response_template")
    if cfg.formatting == "text" and cfg.completion_only_loss:
        raise SpecError("completion_only_loss needs a prompt; formatting 'text' has none")
    return cfg


def _peft_config(args: dict[str, Any]) -> PeftConfig:
    method = args.get("peft_method")
    if method is not None:
        _check_type("peft_method", method, str, "lora, qlora or null")
        method = method.lower()
        if method in ("none", "full"):
            method = None
        elif method not in ("lora", "qlora"):
            raise SpecError(f"peft_method must be lora, qlora or null, got {args['peft_method']!r}")
    values: dict[str, Any] = {"method": method}
    r = args.get("r", args.get("lora_r"))
    if r is not None:
        values["r"] = _positive_int("r", r)
    if args.get("lora_alpha") is not None:
        values["lora_alpha"] = _check_type(
            "lora_alpha", args["lora_alpha"], (int, float), "a number"
        )
    if args.get("lora_dropout") is not None:
        dropout = _check_type(
            "lora_dropout", args["lora_dropout"], (int, float), "a number in [0, 1)"
        )
        if not 0 <= dropout < 1:
            raise SpecError(f"lora_dropout must be in [0, 1), got {dropout}")
        values["lora_dropout"] = dropout
    target = args.get("target_modules")
    if target is not None:
        if isinstance(target, str):
            values["target_modules"] = target
        elif isinstance(target, list) and target and all(isinstance(t, str) for t in target):
            values["target_modules"] = list(target)
        else:
            raise SpecError(
                f"target_modules must be a list of module names or 'all-linear', got {target!r}"
            )
    if args.get("lora_bias") is not None:
        values["bias"] = _check_type("lora_bias", args["lora_bias"], str, "none, all or lora_only")
    if args.get("modules_to_save") is not None:
        values["modules_to_save"] = list(args["modules_to_save"])
    return PeftConfig(**values)
