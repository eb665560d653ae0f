"""What parallelism a run actually trained with, and whether it is the one its config names.

``accelerate launch`` chooses its launcher from its flags before it reads the
config: a config that names DeepSpeed or FSDP, launched with a flag that
overrides it, trains as plain DDP without a word. The child therefore reads the
distributed type its accelerate config names, compares it with the one
accelerate set up, and refuses to measure a run that is not what its row will
say. The result records what ran: accelerate's distributed type, the ZeRO stage
of a DeepSpeed run, whether its parameters were held as shards, and how many
devices one process drove (``DataParallel``: all the GPUs it sees).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer_entry.spec_errors import SpecError

#: Distributed types that name an engine of their own: a run configured for one
#: that trained without it measured something else.
ENGINES = frozenset({"DEEPSPEED", "FSDP"})


def configured_type(accelerate_config: str | None) -> str | None:
    """The ``distributed_type`` the run's accelerate config names; None without a config
    (or where the file is gone: a spec run by hand, without ``accelerate launch``)."""
    if not accelerate_config or not Path(accelerate_config).is_file():
        return None
    import yaml

    path = Path(accelerate_config)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise SpecError(f"cannot read the accelerate config {path}: {exc}") from None
    if not isinstance(data, dict):
        return None
    value = data.get("distributed_type", "NO")
    # YAML 1.1 reads an unquoted NO as false
    return "NO" if value is False else str(value).upper()


def running_type() -> str | None:
    """The distributed type accelerate set up in this process; None before it did."""
    from accelerate.state import AcceleratorState, PartialState

    if AcceleratorState._shared_state:
        return _type_name(AcceleratorState().distributed_type)
    if PartialState._shared_state:
        return _type_name(PartialState().distributed_type)
    return None


def _type_name(value: Any) -> str:
    return str(getattr(value, "value", value)).upper()


def check_engine(configured: str | None, running: str | None, *, on_gpu: bool) -> str | None:
    """Refuse a run whose accelerate config names an engine it is not running under.

    FSDP on the CPU is the exception: accelerate sets up DDP for it there
    whatever the launch, so the run goes on, and the note returned says so (the
    result's ``distributed_type`` shows what ran).
    """
    if configured not in ENGINES or running == configured:
        return None
    if configured == "FSDP" and not on_gpu:
        return (
            f"the accelerate config names FSDP, which accelerate runs on GPUs only: this CPU "
            f"run trained as {running or 'one process'} (distributed_type)"
        )
    raise SpecError(
        f"the accelerate config names distributed_type {configured}, but accelerate set up "
        f"{running or 'nothing'}: the launch overrode the config (a --multi_gpu or --cpu flag?), "
        "so this run would measure another framework than its row says"
    )


@dataclass(frozen=True)
class EngineRecord:
    """What trained, as the result records it."""

    #: accelerate's distributed type (``NO``, ``MULTI_CPU``, ``MULTI_GPU``, ``FSDP``, ``DEEPSPEED``)
    distributed_type: str | None
    #: the ZeRO stage DeepSpeed ran with; None without DeepSpeed
    zero_stage: int | None
    #: DeepSpeed held the parameters as per-rank shards (ZeRO-3); None without DeepSpeed
    params_partitioned: bool | None
    #: devices one process drove: the GPUs ``DataParallel`` spread each batch over, else 1
    devices_per_process: int
    #: what the result's notes should say about it
    notes: tuple[str, ...] = ()


def zero_stage() -> int | None:
    """The ZeRO stage of the DeepSpeed config accelerate handed to the engine."""
    from accelerate.state import AcceleratorState

    if not AcceleratorState._shared_state:
        return None
    plugin = getattr(AcceleratorState(), "deepspeed_plugin", None)
    if plugin is None:
        return None
    config = getattr(plugin, "deepspeed_config", None) or {}
    stage = (config.get("zero_optimization") or {}).get("stage")
    return int(stage) if stage is not None else None


def params_partitioned(model: Any) -> bool:
    """Whether DeepSpeed holds the model's parameters as shards (each rank keeps a part).

    ZeRO-3 keeps each rank's share of a parameter aside (``ds_tensor``) and its
    full size as ``ds_numel``; outside a forward pass the parameter itself is
    empty, except the small ones it keeps whole on every rank
    (``stage3_param_persistence_threshold``). Partitioned: every parameter is
    ZeRO-3's, and this rank's shares add up to less than the model.
    """
    if not zero3_managed(model):
        return False
    params = list(model.parameters())
    return sum(int(p.ds_tensor.numel()) for p in params) < sum(int(p.ds_numel) for p in params)


def zero3_managed(model: Any) -> bool:
    """Whether every parameter of the model is ZeRO-3's (built by ``deepspeed.zero.Init``,
    or taken over by the engine)."""
    params = list(model.parameters())
    return bool(params) and all(hasattr(p, "ds_numel") and hasattr(p, "ds_tensor") for p in params)


def built_by_zero_init(model: Any) -> bool:
    """Whether the model was built already partitioned (``deepspeed.zero.Init``): its
    parameters are ZeRO-3's before any engine started. Adapters PEFT adds afterwards
    are not; the engine takes them over when it starts."""
    return any(hasattr(p, "ds_numel") for p in model.parameters())


def engine_record(
    model: Any, *, devices_per_process: int, notes: tuple[str, ...] = ()
) -> EngineRecord:
    """What trained, read after training (the engine has wrapped the model by then)."""
    distributed = running_type()
    stage = zero_stage() if distributed == "DEEPSPEED" else None
    return EngineRecord(
        distributed_type=distributed,
        zero_stage=stage,
        params_partitioned=params_partitioned(model) if distributed == "DEEPSPEED" else None,
        devices_per_process=max(1, devices_per_process),
        notes=notes,
    )


def devices_per_process(native: Any, *, on_gpu: bool) -> int:
    """GPUs one process drives: the trainer's ``n_gpu`` (several only under
    ``DataParallel``, one process seeing several GPUs), 1 on the CPU or for a
    backend that does not say."""
    if not on_gpu:
        return 1
    n = getattr(native, "n_gpu", None)
    return int(n) if isinstance(n, int) and n > 1 else 1


def partitioned_flops_problem(model: Any) -> str | None:
    """Why FLOPs cannot be counted from a ZeRO-3 model's weights; None where they can.

    The FLOPs count reads linear layers' ``in_features``/``out_features``, which
    survive partitioning, but a convolution's, a transposed linear's (GPT-2) and
    stacked experts' FLOPs from their weights' shapes, which ZeRO-3 empties on
    every rank.
    """
    from transformers.pytorch_utils import Conv1D

    for name, module in model.named_modules():
        if isinstance(module, (Conv1D, _conv_type())):
            return f"ZeRO-3 holds the weights of '{name}' ({type(module).__name__}) as shards"
        for pname, p in module.named_parameters(recurse=False):
            if len(getattr(p, "ds_shape", ())) == 3:
                return f"ZeRO-3 holds the 3-D weight '{name}.{pname}' as shards"
    return None


def _conv_type() -> type:
    import torch

    conv: type = torch.nn.modules.conv._ConvNd
    return conv


def zero3_build_note(zero_init: bool) -> str:
    """Whether ZeRO-3 built the model in shards (``zero3_init_flag``) or whole."""
    if zero_init:
        return "ZeRO-3: the model was built already partitioned (deepspeed.zero.Init)"
    return (
        "ZeRO-3: the model was built whole on every rank and partitioned when the "
        "DeepSpeed engine started (zero3_init_flag off, or the model was not built "
        "by transformers)"
    )


def check_devices(planned: int | None, processes: int, per_process: int, *, on_gpu: bool) -> None:
    """Refuse a GPU run that trains on another number of GPUs than its cell says.

    Under ``DataParallel`` one process drives the GPUs it sees; if the job was
    given fewer (or the trainer saw fewer), the row would count GPUs that did
    not train.
    """
    if not on_gpu or planned is None:
        return
    if processes * per_process != planned:
        raise SpecError(
            f"the cell is for {planned} GPU(s), but {processes} process(es) × {per_process} "
            f"GPU(s) each trained (CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')!r})"
        )


def seed_before_load(native: Any) -> None:
    """Seed every generator with the trainer's ``seed`` (where its arguments have one).

    The trainer seeds at its own start, after the model exists; seeding again
    before the model is built makes the initial weights (a LoRA adapter's, a
    ``config:`` model's) the same under every framework.
    """
    seed = getattr(native, "seed", None)
    if isinstance(seed, int):
        from transformers import set_seed

        set_seed(seed)
