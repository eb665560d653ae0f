"""Load the model and tokenizer of a run, and apply LoRA or QLoRA.

``model_name_or_path`` may be:

- ``tiny-llama``: the embedded default, built offline on first use;
- ``config:<name>`` (an architecture shipped in ``assets/architectures``, e.g.
  ``config:llama-3.1-8b``) or ``config:<path>`` (any ``config.json``, or a
  folder holding one): the architecture only, randomly initialised, with no
  weights downloaded. Throughput and memory do not depend on weight values, so
  this benchmarks an 8B model without a 16 GB download;
- ``python:<module>:<function>``: a function of the user's builds the model
  (``trainer_entry.models.custom`` has the contract);
- a Hugging Face hub id or a local folder with weights.

``trust_remote_code`` stays off unless the scenario sets it.

Under FSDP a ``config:`` model is built on the CPU, never whole on a GPU:
FSDP moves it to the GPUs shard by shard, so the GPU memory a run reports is
training's, not a loading spike (see ``config_placement``). Its random weights
are drawn on the GPU one module at a time (``draw_weights``): drawing a 1B
model's on the CPU took about a minute.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from orchestrator.contract.modelnames import hub_offline
from trainer_entry.models.for_task import PROCESSOR_MODALITIES, ModelTask
from trainer_entry.models.kinds import CONFIG_PREFIX, TINY_MODELS, model_kind
from trainer_entry.models.resolve import ARCHITECTURES as ARCHITECTURES
from trainer_entry.models.resolve import architecture_config, shipped_architectures
from trainer_entry.models.tiny import TINY_NAME
from trainer_entry.settings import installed
from trainer_entry.settings.parsed import ModelConfig, PeftConfig
from trainer_entry.spec_errors import SpecError

if TYPE_CHECKING:
    from trainer_entry.models.acceleration import Acceleration as Accelerating

DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
}


@dataclass
class LoadedModel:
    model: Any
    tokenizer: Any
    info: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Placement:
    """Where this rank builds a ``config:`` model, and whether it draws its weights."""

    #: ``cuda`` (this rank's GPU) or ``cpu``
    device: str
    #: False: weights are left uninitialised because rank 0's are broadcast over them
    init_weights: bool = True
    #: True: built uninitialised, then its weights drawn on this rank's GPU one module at
    #: a time, each moved back (``draw_weights``)
    draw_on_gpu: bool = False


def _env_true(env: Mapping[str, str], name: str) -> bool:
    return env.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def fsdp_loading(env: Mapping[str, str], fsdp_argument: object = None) -> tuple[bool, bool]:
    """(FSDP in use, rank 0's weights broadcast to the others) for this process.

    FSDP comes from ``accelerate launch`` with ``distributed_type: FSDP``
    (``ACCELERATE_USE_FSDP``) or from the ``fsdp`` trainer argument; the broadcast is
    ``fsdp_cpu_ram_efficient_loading`` (``FSDP_CPU_RAM_EFFICIENT_LOADING``, which both set
    and accelerate's launcher turns on by default). Read after ``TrainingArguments``
    exists, as that is where the trainer argument sets the variable.
    """
    fsdp = _env_true(env, "ACCELERATE_USE_FSDP") or bool(fsdp_argument)
    return fsdp, fsdp and _env_true(env, "FSDP_CPU_RAM_EFFICIENT_LOADING")


def config_placement(*, on_gpu: bool, fsdp: bool, broadcast: bool, rank: int) -> Placement:
    """Where a ``config:`` model is built on this rank.

    Without FSDP, straight on this rank's GPU: DDP needs the whole model there
    anyway, and drawing 8B random weights on the CPU takes minutes. Under FSDP, on
    the CPU: the GPU then only ever holds shards (FSDP2 with
    ``cpu_ram_efficient_loading`` moves the model to ``meta`` and loads rank 0's
    weights one parameter at a time; otherwise each wrapped block moves to the GPU
    and is sharded in turn). The weights it draws, it draws on the GPU, a module
    at a time. When rank 0's weights are broadcast, the other ranks skip drawing
    their own, which spares their time and memory.
    """
    if not on_gpu:
        return Placement("cpu")
    if not fsdp:
        return Placement("cuda")
    draws = not (broadcast and rank != 0)
    return Placement("cpu", init_weights=draws, draw_on_gpu=draws)


def _dtype(cfg: ModelConfig, on_gpu: bool, kind: str) -> torch.dtype | str:
    if cfg.dtype is None or cfg.dtype == "auto":
        # Pretrained weights keep the dtype they were saved in; a model built
        # here gets bf16 on a GPU and fp32 on the CPU.
        if kind == "pretrained":
            return "auto"
        return torch.bfloat16 if on_gpu else torch.float32
    try:
        return DTYPES[cfg.dtype.lower()]
    except KeyError:
        raise SpecError(
            f"torch_dtype must be one of {', '.join(sorted(set(DTYPES)))} or auto, got {cfg.dtype!r}"
        ) from None


def _model_error(name: str, exc: Exception) -> SpecError:
    where = "not a local folder" + (
        ", not cached, and the hub is offline (HF_HUB_OFFLINE=1)" if hub_offline() else ""
    )
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return SpecError(
        f"model '{name}' could not be loaded ({where}): {type(exc).__name__}: {first}; "
        f"use {TINY_NAME}, config:<architecture> ({', '.join(shipped_architectures())}), "
        "a local folder, or a hub id when online"
    )


def dtype_keyword() -> str:
    """The keyword ``from_pretrained`` and ``from_config`` take the weights' dtype under:
    the one transformers' model configs have as a field (``dtype``; ``torch_dtype``
    before)."""
    from transformers import PretrainedConfig

    config_class: type = PretrainedConfig
    fields = (
        installed.init_fields(config_class)
        if dataclasses.is_dataclass(config_class)
        else installed.parameters(config_class)
    )
    return installed.installed_name("dtype", fields) or installed.spellings("dtype")[-1]


def tiny_model_path(name: str) -> Path:
    """The folder of embedded tiny model ``name``, built on first use."""
    module, _, function = TINY_MODELS[name].partition(":")
    path: Path = getattr(importlib.import_module(module), function)()
    return path


def load_model(
    cfg: ModelConfig,
    peft: PeftConfig,
    *,
    on_gpu: bool,
    local_rank: int,
    task: ModelTask,
    placement: Placement | None = None,
    task_kwargs: Mapping[str, Any] | None = None,
    search_path: Sequence[str] = (),
    acceleration: Accelerating | None = None,
) -> LoadedModel:
    """Model (with PEFT applied) and tokenizer, on the CPU or this rank's GPU.

    ``task`` gives the model class, ``task_kwargs`` what
    that class needs from the data (``num_labels``). An image task has no
    tokenizer (None). ``placement`` says where a ``config:`` model is built
    (default: this rank's GPU when ``on_gpu``, see ``config_placement``); other
    models load on the CPU and the trainer (or FSDP) moves them.
    ``search_path``: the folders a ``python:`` model's module is looked for in first.
    ``acceleration``: fms-acceleration's framework, which may load the model itself and
    augments it before LoRA (``trainer_entry.models.acceleration``).
    """
    auto_model = task.model_class()
    extra = dict(task_kwargs or {})

    name = cfg.name
    kind = model_kind(name)
    dtype = _dtype(cfg, on_gpu, kind)
    attn = cfg.attn_implementation or "sdpa"
    common: dict[str, Any] = {
        "attn_implementation": attn,
        "trust_remote_code": cfg.trust_remote_code,
    }
    quant = None
    if peft.method == "qlora":
        quant = _qlora_quantization(on_gpu, dtype, kind)
        common["quantization_config"] = quant
        common["device_map"] = {"": local_rank}

    tokenizer_name = cfg.tokenizer
    place = placement or Placement("cuda" if on_gpu else "cpu")
    given_tokenizer = None
    try:
        if kind == "python":
            model, given_tokenizer = _python_model(cfg, task, extra, search_path, dtype)
        elif kind == "config":
            model = _config_model(cfg, auto_model, extra, place, dtype, local_rank)
            if not name.startswith(CONFIG_PREFIX) and _has_tokenizer(Path(name).expanduser()):
                # a folder with a config and a tokenizer but no weights: its own tokenizer
                tokenizer_name = tokenizer_name or str(Path(name).expanduser())
        elif acceleration is not None and acceleration.custom_loading:
            if kind == "tiny":
                raise SpecError(
                    f"fms-acceleration's {', '.join(acceleration.plugins)} loads the model "
                    f"from its checkpoint; {name} has none",
                    key="framework_config",
                )
            model = acceleration.load(name, dtype=dtype, attn=attn)
            tokenizer_name = tokenizer_name or name
        else:
            path = str(tiny_model_path(name)) if kind == "tiny" else name
            model = auto_model.from_pretrained(
                path, **{dtype_keyword(): dtype}, revision=cfg.revision, **common, **extra
            )
            tokenizer_name = tokenizer_name or path
    except SpecError:
        raise
    except (OSError, ValueError, KeyError) as exc:
        raise _model_error(name, exc) from None
    tokenizer = (
        _fit_tokenizer(given_tokenizer, model)
        if given_tokenizer is not None
        else _task_tokenizer(cfg, task, model, tokenizer_name)
    )

    info = _loaded_info(model, kind, attn, quantized=quant is not None, place=place)
    if acceleration is not None:
        info["acceleration_plugins"] = ", ".join(acceleration.plugins)
    model = apply_peft(
        model,
        peft,
        quantized=quant is not None,
        task=task,
        augment=acceleration.augment if acceleration is not None else None,
    )
    # ZeRO-3 (deepspeed.zero.Init) builds each parameter as an empty tensor and
    # keeps its full size as ds_numel
    trainable = sum(_numel(p) for p in model.parameters() if p.requires_grad)
    total = sum(_numel(p) for p in model.parameters())
    info.update(trainable_params=trainable, total_params=total, peft_method=peft.method)
    return LoadedModel(model=model, tokenizer=tokenizer, info=info)


def _loaded_info(
    model: Any, kind: str, attn: str, *, quantized: bool, place: Placement
) -> dict[str, Any]:
    """What the result's ``model`` record says of the model as loaded, before PEFT."""
    return {
        "kind": kind,
        "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
        "attn_implementation": getattr(model.config, "_attn_implementation", attn),
        "architecture": type(model).__name__,
        "quantization": "nf4" if quantized else None,
        # where a config: model was built, and whether this rank drew its weights
        "built_on": place.device if kind == "config" else None,
        "weights_drawn": place.init_weights if kind == "config" else None,
    }


def _config_model(
    cfg: ModelConfig,
    auto_model: Any,
    extra: Mapping[str, Any],
    place: Placement,
    dtype: Any,
    local_rank: int,
) -> Any:
    """A ``config:`` model built where ``place`` says, its weights drawn there or later
    on this rank's GPU."""
    from transformers import AutoConfig

    config = AutoConfig.for_model(**architecture_config(cfg.name))
    device = torch.device("cuda", local_rank) if place.device == "cuda" else "cpu"
    for key, value in extra.items():
        setattr(config, key, value)
    drawn_here = place.init_weights and not place.draw_on_gpu
    with torch.device(device), _weights_drawn(drawn_here):
        model = auto_model.from_config(
            config,
            **{dtype_keyword(): dtype},
            attn_implementation=cfg.attn_implementation or "sdpa",
            trust_remote_code=cfg.trust_remote_code,
        )
    if place.draw_on_gpu:
        draw_weights(model, torch.device("cuda", local_rank))
    return model


def _task_tokenizer(
    cfg: ModelConfig, task: ModelTask, model: Any, tokenizer_name: str | None
) -> Any:
    """The tokenizer (or processor) of a text, audio or image-text task; None for an
    image task. A model built here (config:, python:) takes the task's tiny model's
    (an audio or image-text task: its processor, the feature or image processor with
    the tokenizer)."""
    if task.modality not in ("text", *PROCESSOR_MODALITIES):
        return None
    tokenizer_name = tokenizer_name or str(tiny_model_path(task.tokenizer_model or TINY_NAME))
    import transformers

    auto = "AutoProcessor" if task.modality in PROCESSOR_MODALITIES else "AutoTokenizer"
    return _load_tokenizer(tokenizer_name, cfg, model, getattr(transformers, auto))


def _has_tokenizer(folder: Path) -> bool:
    return any((folder / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json"))


def _numel(p: Any) -> int:
    """A parameter's size, a ZeRO-3 shard's full size included."""
    return int(getattr(p, "ds_numel", p.numel()))


def _python_model(
    cfg: ModelConfig,
    task: ModelTask,
    task_kwargs: Mapping[str, Any],
    search_path: Sequence[str],
    dtype: torch.dtype | str,
) -> tuple[Any, Any]:
    """A ``python:`` model built by its function, and the tokenizer it came with (or None)."""
    from trainer_entry.models import custom

    model, tokenizer = custom.build(
        cfg.name, cfg.kwargs, task=task.name, task_kwargs=task_kwargs, folders=search_path
    )
    if tokenizer is not None and task.modality != "text":
        raise SpecError(
            f"model '{cfg.name}' returned a tokenizer, but {task.name} takes none "
            "(its pixels follow the model's config); return the model alone"
        )
    if tokenizer is not None and cfg.tokenizer:
        raise SpecError(
            f"model '{cfg.name}' returned a tokenizer and the scenario sets "
            "tokenizer_name_or_path; keep one"
        )
    labels = task_kwargs.get("num_labels")
    if labels is not None and getattr(model.config, "num_labels", labels) != labels:
        raise SpecError(
            f"model '{cfg.name}' has {model.config.num_labels} labels but the data has {labels}; "
            "give the function a num_labels parameter"
        )
    if getattr(model, "generation_config", None) is None:
        # a model not built on GenerationMixin has none; TRL's SFTTrainer writes the pad
        # and end tokens into it (training does not read it)
        from transformers import GenerationConfig

        model.generation_config = GenerationConfig.from_model_config(model.config)
    # the function chose the dtype and attention; the scenario's own setting overrides them
    if cfg.dtype not in (None, "auto") and isinstance(dtype, torch.dtype):
        model = model.to(dtype)
    if cfg.attn_implementation:
        try:
            model.set_attn_implementation(cfg.attn_implementation)
        except (ValueError, ImportError) as exc:
            raise SpecError(
                f"attn_implementation {cfg.attn_implementation!r} does not fit model "
                f"'{cfg.name}': {exc}"
            ) from None
    return model, tokenizer


def _load_tokenizer(name: str, cfg: ModelConfig, model: Any, auto_tokenizer: Any) -> Any:
    try:
        tokenizer = auto_tokenizer.from_pretrained(name, trust_remote_code=cfg.trust_remote_code)
    except (OSError, ValueError) as exc:
        raise SpecError(
            f"tokenizer '{name}' could not be loaded: {type(exc).__name__}: {exc}"
        ) from None
    return _fit_tokenizer(tokenizer, model)


def _fit_tokenizer(processor: Any, model: Any) -> Any:
    """A pad token where the tokenizer has none; its size checked against the model's. A
    processor (an audio task's) is returned whole, its tokenizer fitted."""
    inner = getattr(processor, "tokenizer", None)
    if inner is not None and inner is not processor:
        _fit_tokenizer(inner, model)
        return processor
    tokenizer = processor
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    try:
        embeddings = model.get_input_embeddings()
    except NotImplementedError:
        embeddings = None  # a CTC model (wav2vec2) has none: its vocabulary is its head's
    vocab = getattr(embeddings, "num_embeddings", None) or int(model.config.vocab_size)
    if len(tokenizer) > vocab:
        raise SpecError(
            f"the tokenizer has {len(tokenizer)} tokens but the model's embedding has {vocab}; "
            "set tokenizer_name_or_path to a matching tokenizer"
        )
    if getattr(model.config, "pad_token_id", None) is None:
        # a classification head finds each row's last token by the pad id
        model.config.pad_token_id = tokenizer.pad_token_id
    return tokenizer


def _init_owners(model: Any) -> list[tuple[Any, Any]]:
    """(module, the innermost transformers model holding it) for every module, children
    before their parents: the order ``initialize_weights`` draws in."""
    from transformers import PreTrainedModel

    out: list[tuple[Any, Any]] = []

    def walk(module: Any, owner: Any) -> None:
        owner = module if isinstance(module, PreTrainedModel) else owner
        for child in module.children():
            walk(child, owner)
        out.append((module, owner))

    walk(model, model)
    return out


def draw_weights(model: Any, device: torch.device | str) -> None:
    """Draw an uninitialised model's weights with its own ``_init_weights``, one module at
    a time on ``device``, each module's tensors moved back where they were.

    A model built on the CPU gets its random weights at ``device``'s speed, and
    ``device`` never holds more than one module's tensors (the largest is the
    embedding); its cache is emptied after, so no loading spike is left behind.
    """
    with torch.no_grad():
        _draw_each_module(model, device)
    if hasattr(model, "tie_weights"):
        model.tie_weights()
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()


def _draw_each_module(model: Any, device: torch.device | str) -> None:
    for module, owner in _init_owners(model):
        params = dict(module.named_parameters(recurse=False))
        buffers = {k: v for k, v in module.named_buffers(recurse=False) if v is not None}
        if not params and not buffers:
            continue
        home = {name: t.device for name, t in (*params.items(), *buffers.items())}
        for p in params.values():
            p.data = p.data.to(device)
        for name, b in buffers.items():
            module._buffers[name] = b.to(device)
        owner._init_weights(module)
        for name, p in params.items():
            p.data = p.data.to(home[name])
        for name in buffers:
            module._buffers[name] = module._buffers[name].to(home[name])


def _weights_drawn(draw: bool) -> contextlib.AbstractContextManager[Any]:
    """Nothing, or transformers' switch that leaves new weights uninitialised."""
    if draw:
        return contextlib.nullcontext()
    from transformers.initialization import no_init_weights

    switch: contextlib.AbstractContextManager[Any] = no_init_weights()
    return switch


def _qlora_quantization(on_gpu: bool, dtype: torch.dtype | str, kind: str) -> Any:
    if not on_gpu:
        raise SpecError(
            "peft_method qlora needs a CUDA GPU (4-bit bitsandbytes); this run is on the CPU"
        )
    if kind in ("config", "python"):
        raise SpecError(
            f"peft_method qlora quantizes pretrained weights as they load; a {kind}: model has none"
        )
    try:
        import bitsandbytes  # noqa: F401
    except ImportError:
        raise SpecError("peft_method qlora needs bitsandbytes: pip install bitsandbytes") from None
    from transformers import BitsAndBytesConfig

    compute = dtype if isinstance(dtype, torch.dtype) else torch.bfloat16
    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=compute,
    )


def linear_module_names(model: Any) -> list[str]:
    """The distinct last names of the model's linear layers (what target_modules matches)."""
    names = {
        full.rsplit(".", 1)[-1]
        for full, module in model.named_modules()
        if isinstance(module, torch.nn.Linear)
    }
    return sorted(names)


#: what takes the LoRA settings
LORA_CONFIG = installed.Owner("peft", "LoraConfig")
#: our LoRA settings -> ``LoraConfig``'s names for them (``lora_bias`` is its ``bias``)
_LORA_NAMES = {"bias": "lora_bias"}


def lora_config(cfg: PeftConfig, task: ModelTask, head: list[str] | None = None) -> Any:
    """The ``LoraConfig`` of ``cfg``, in the names the installed peft takes; ``head``: the
    modules trained in full when the scenario names none (a new classifier)."""
    from peft import LoraConfig

    kwargs = {
        "r": cfg.r,
        "lora_alpha": cfg.lora_alpha,
        "lora_dropout": cfg.lora_dropout,
        "target_modules": cfg.target_modules,
        "bias": cfg.bias,
        "modules_to_save": cfg.modules_to_save if cfg.modules_to_save is not None else head,
        "task_type": task.peft_task_type(),
    }
    fields = installed.init_fields(LoraConfig)
    try:
        kwargs = installed.in_installed_names(kwargs, fields, LORA_CONFIG)
    except installed.SettingError as exc:  # named as the scenario names it
        ours = _LORA_NAMES.get(exc.key, exc.key)
        raise installed.SettingError(ours, LORA_CONFIG, exc.detail) from None
    try:
        return LoraConfig(**kwargs)
    except (ValueError, TypeError) as exc:
        raise installed.Refused(LORA_CONFIG, str(exc), "LoRA settings") from None


def apply_peft(
    model: Any,
    cfg: PeftConfig,
    *,
    quantized: bool,
    task: ModelTask,
    augment: Callable[[Any, Any], tuple[Any, Any]] | None = None,
) -> Any:
    """``model`` with the cell's LoRA. ``augment``: fms-acceleration's augmentation, given
    the model and the LoRA configuration (None without LoRA) before LoRA wraps it; it
    returns the model and the configuration still to apply (None: a plugin applied
    its own adapters, or there is no LoRA)."""
    if cfg.method is None and augment is None:
        return model
    from peft import get_peft_model, prepare_model_for_kbit_training

    available = linear_module_names(model)
    config = None
    if cfg.method is not None:
        target = cfg.target_modules
        if isinstance(target, list):
            module_names = {full.rsplit(".", 1)[-1] for full, _ in model.named_modules()}
            missing = [t for t in target if t not in module_names]
            if len(missing) == len(target):
                raise SpecError(
                    f"target_modules {target} match no module of the model; its linear "
                    f"layers: {', '.join(available)}",
                    key="target_modules",
                )
        if quantized:
            model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
        # a new head (a classifier) is trained in full unless the scenario says otherwise
        config = lora_config(cfg, task, task.head_modules(model) or None)
    if augment is not None:
        model, config = augment(model, config)
    if config is None:
        return model
    try:
        return get_peft_model(model, config)
    except ValueError as exc:
        raise SpecError(
            f"LoRA could not be applied: {exc}; linear layers: {', '.join(available)}",
            key="target_modules",
        ) from None
