"""A cell's GPU memory predicted before launch: its training step run on fake tensors.

The cell's own model (built from its config, with its dtype, attention and
LoRA), its backend's own loss (transformers' ``ForCausalLMLoss`` for ``hf``,
TRL's fused LM head for ``sft``), its trainer's optimizer
(``Trainer.get_optimizer_cls_and_kwargs``) and its activation checkpointing
run a training step under ``FakeTensorMode``, on the CPU: every tensor has
its real shape and dtype and no data, so a 1B model's step takes seconds and
no memory. The optimizer's states are made first, as its first step makes them;
``LiveBytes`` (``trainer_entry.measure.livebytes``) counts the bytes live after
each op of the step that follows, whose peak is the prediction (under gradient
accumulation, a later micro-batch's, every gradient held). What is live at the peak is split by what
holds it: weights, gradients, optimizer states, the forward's activations,
the logits and loss (everything made from the end of the model's body to the
gradient reaching it back), the backward's temporaries and the optimizer
step's.

What the CPU cannot run, formulas stand in for, each named in the answer's
``formulas``:

- a GPU cell's attention: SDPA with a mask or with dropout runs the
  memory-efficient kernel (no L×L scores), as the CUDA dispatcher chooses;
  without either, the CPU's flash kernel saves what CUDA's does (the output and
  the log-sum-exp); flash-attn (``flash_attention_2``) is built as SDPA, which
  keeps the same;
- sharding over the cell's GPUs (``shard``): FSDP and ZeRO-3 divide weights,
  gradients and optimizer states by the GPU count and add the gathered block;
  DeepSpeed keeps fp32 optimizer states and master weights, which ZeRO-1/2
  divide (ZeRO-2 the gradients too); DDP over several GPUs adds its gradient
  buckets;
- TRL's fused LM head: its Triton kernels, which copy no tile;
- what NVML will show is beyond torch's peak: the caching allocator's
  headroom and the CUDA context (``orchestrator.contract.gpumemory``).

The batch is the cell's micro-batch of full ``max_seq_len`` sequences, every
token labelled: the worst case a packed or padded batch reaches.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from orchestrator.contract.gpumemory import TERMS as MEMORY_TERMS
from orchestrator.contract.trainers import declared
from trainer_entry.data.collate import input_dtype
from trainer_entry.measure.livebytes import LiveBytes
from trainer_entry.spec_errors import SpecError

#: what holds the bytes at the peak, in the order the answer lists them
TERMS = MEMORY_TERMS
#: trainer arguments a CPU stand-in cannot take and whose memory is accounted for
#: otherwise: tf32 (a matmul precision), fp16 (its autocast runs here), FSDP and
#: DeepSpeed (sharding's formulas), compilation (not run here)
_GPU_ONLY = (
    "tf32",
    "fp16",
    "fsdp",
    "fsdp_config",
    "deepspeed",
    "torch_compile",
    "torch_compile_backend",
    "torch_compile_mode",
    "ddp_find_unused_parameters",
    "ddp_bucket_cap_mb",
    "use_liger_kernel",
    "liger_kernel_config",
)
#: the per-token outputs TRL 1.16's SFTTrainer asks its fused LM head for
_SFT_FUSED_OUTPUTS = ("log_probs", "entropy", "is_top1")


@dataclass
class Sharding:
    """How the cell's framework spreads a rank's memory (from its accelerate config)."""

    #: NO, MULTI_GPU, FSDP, DEEPSPEED
    kind: str = "NO"
    #: DeepSpeed's stage (0: none)
    zero_stage: int = 0
    gpus: int = 1


@dataclass
class Prediction:
    """One cell's predicted peak of torch's allocation on its busiest rank, in bytes."""

    peak_bytes: int
    #: what is live at the peak, by ``TERMS`` (sharding applied)
    terms: dict[str, int]
    #: the largest single tensor made in the step (the allocator's headroom reads it)
    largest_block: int
    seconds: float
    #: what formulas stood in for (``formulas`` in the module's docstring)
    formulas: list[str] = field(default_factory=list)
    #: NVML's figure is a lower bound (FSDP over several GPUs: its allocator reserves far
    #: above its allocated peak, by an amount no formula here accounts for)
    nvml_lower_bound: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            "peak_bytes": self.peak_bytes,
            "terms": self.terms,
            "largest_block": self.largest_block,
            "seconds": round(self.seconds, 2),
            "formulas": self.formulas,
            "nvml_lower_bound": self.nvml_lower_bound,
        }


# -- the cell -------------------------------------------------------------------------------
def sharding_of(accelerate_config: str | None, gpus: int) -> Sharding:
    """The sharding the cell's accelerate config names, over ``gpus`` GPUs."""
    from trainer_entry.measure.engine import configured_type

    kind = configured_type(accelerate_config) or "NO"
    stage = 0
    if kind == "DEEPSPEED" and accelerate_config:
        import yaml

        with open(accelerate_config, encoding="utf-8") as f:
            data = yaml.safe_load(f) or {}
        stage = int((data.get("deepspeed_config") or {}).get("zero_stage") or 0)
    return Sharding(kind=kind, zero_stage=stage, gpus=max(1, gpus))


def stand_in(training: Mapping[str, Any]) -> tuple[dict[str, Any], torch.dtype | None]:
    """The trainer arguments a CPU process can build for a GPU cell, and the dtype its
    mixed precision casts to (None: none)."""
    kept = {k: v for k, v in training.items() if k not in _GPU_ONLY}
    if training.get("fp16"):
        return kept, torch.float16
    if training.get("bf16"):
        return kept, torch.bfloat16
    return kept, None


@dataclass
class _Cell:
    spec: Any
    parsed: Any
    backend: Any
    task: Any
    settings: Any
    autocast: torch.dtype | None
    on_gpu: bool
    sharding: Sharding

    @functools.cached_property
    def model_key(self) -> str:
        """What its model and optimizer depend on: the cell less its sizes (worked out
        once: a classifier's labels are read from its dataset)."""
        return _model_key(self)


def _cell(spec: Any) -> _Cell:
    from trainer_entry.run.parse import parse_arguments
    from trainer_entry.run.train import load_backend
    from trainer_entry.tasks import get_task

    backend = load_backend(spec)
    parsed = parse_arguments(spec, backend.argument_fields())
    if parsed.peft.method == "qlora":
        raise SpecError("QLoRA's 4-bit weights are not predicted (bitsandbytes needs a GPU)")
    training, autocast = stand_in(parsed.training)
    settings = backend.configure(spec, replace(parsed, training=training), on_gpu=False)
    on_gpu = spec.device == "gpu"
    gpus = int(spec.num_gpus or 1) if on_gpu else int(spec.processes or 1)
    sharding = sharding_of(spec.accelerate_config, gpus)
    if not on_gpu and sharding.kind != "DEEPSPEED":
        # the CPU launch overrides the config: one process (--cpu), or gloo DDP
        # (--multi_gpu, orchestrator.matrix.frameworks.cpu_launch_flag)
        sharding = Sharding(kind="MULTI_GPU" if gpus > 1 else "NO", gpus=gpus)
    return _Cell(
        spec=spec,
        parsed=parsed,
        backend=backend,
        task=get_task(parsed.task),
        settings=settings,
        autocast=autocast,
        on_gpu=on_gpu,
        sharding=sharding,
    )


# -- the model, on fake tensors -------------------------------------------------------------
def model_config(parsed: Any, task: Any, *, local_only: bool = False) -> Any:
    """The model's config, with what its task adds (a classifier's labels). ``local_only``:
    read from a folder or the hub cache only (``OSError`` where it is in neither)."""
    from transformers import AutoConfig

    from trainer_entry.models.kinds import model_kind
    from trainer_entry.models.load import tiny_model_path
    from trainer_entry.models.resolve import architecture_config

    name = parsed.model.name
    kind = model_kind(name)
    if kind == "python":
        raise SpecError("a python: model is built by its own function, which is not run here")
    if kind == "config":
        config = AutoConfig.for_model(**architecture_config(name))
    else:
        path = str(tiny_model_path(name)) if kind == "tiny" else name
        config = AutoConfig.from_pretrained(
            path,
            revision=parsed.model.revision,
            trust_remote_code=parsed.model.trust_remote_code,
            **({"local_files_only": True} if local_only else {}),
        )
    for key, value in task.model_kwargs(parsed).items():
        setattr(config, key, value)
    return config


def _weights_dtype(parsed: Any, config: Any, on_gpu: bool) -> torch.dtype:
    """The dtype the child loads the weights in (``trainer_entry.models.load``)."""
    from trainer_entry.models.kinds import model_kind
    from trainer_entry.models.load import _dtype

    dtype = _dtype(parsed.model, on_gpu, model_kind(parsed.model.name))
    if isinstance(dtype, torch.dtype):
        return dtype
    saved = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if isinstance(saved, str):
        saved = getattr(torch, saved, None)
    return saved if isinstance(saved, torch.dtype) else torch.float32


#: the attention kernels of a GPU that the CPU builds as SDPA for the step: flash-attn
#: saves what SDPA's flash kernel saves (the output and its log-sum-exp), and needs no mask
FLASH_KERNELS = ("flash_attention_2", "flash_attention_3")


def predicted_attention(parsed: Any, on_gpu: bool) -> tuple[str, str | None]:
    """The attention the step is built with, and the formula that stands in (None: it is
    the cell's own): a GPU cell's flash-attn is SDPA's kernel here."""
    attn = parsed.model.attn_implementation or "sdpa"
    if on_gpu and attn in FLASH_KERNELS:
        return "sdpa", (
            f"attention: {attn} stood in by SDPA's flash kernel (it keeps the same: the "
            "output and its log-sum-exp)"
        )
    return attn, None


def meta_model(parsed: Any, task: Any, config: Any, *, attn: str, on_gpu: bool) -> Any:
    """The cell's model of ``config`` on the meta device (nothing drawn), in the dtype
    its device loads the weights in, patched and wrapped there as the child does: TRL's
    fused LM head (``sft``), then its LoRA."""
    from trainer_entry.models.load import apply_peft, dtype_keyword

    dtype = _weights_dtype(parsed, config, on_gpu)
    with torch.device("meta"):
        model = task.model_class().from_config(
            config,
            **{dtype_keyword(): dtype},
            attn_implementation=attn,
            trust_remote_code=parsed.model.trust_remote_code,
        )
        if declared(parsed.backend).fused_lm_head:
            # SFTTrainer patches the model before LoRA wraps it
            from trl.trainer.utils import add_fused_lm_head

            add_fused_lm_head(model, outputs=_SFT_FUSED_OUTPUTS)
        return apply_peft(model, parsed.peft, quantized=False, task=task)


def fake_model(cell: _Cell, config: Any, mode: Any) -> Any:
    """The cell's model (of ``config``, read before ``mode`` is entered: a shipped tiny
    model is built and saved on first use), its LoRA applied, on fake tensors of
    ``mode`` on the CPU: built on the meta device (``meta_model``), then each
    parameter and buffer turned into a fake tensor (one per tensor: tied weights
    stay tied)."""
    attn, _ = predicted_attention(cell.parsed, cell.on_gpu)
    model = meta_model(cell.parsed, cell.task, config, attn=attn, on_gpu=cell.on_gpu)
    _to_fake(model, mode)
    model.train()
    return model


def _to_fake(model: torch.nn.Module, mode: Any) -> None:
    """Every meta parameter and buffer of ``model`` replaced by a fake CPU tensor."""
    cpu = torch.device("cpu")
    made: dict[int, Any] = {}

    def fake(t: torch.Tensor) -> torch.Tensor:
        return mode.fake_tensor_converter.from_meta_and_device(mode, t, cpu)

    for module in model.modules():
        for name, p in list(module._parameters.items()):
            if p is not None:
                if id(p) not in made:
                    made[id(p)] = torch.nn.Parameter(fake(p.data), requires_grad=p.requires_grad)
                module._parameters[name] = made[id(p)]
        for name, b in list(module._buffers.items()):
            if b is not None:
                if id(b) not in made:
                    made[id(b)] = fake(b)
                module._buffers[name] = made[id(b)]


def _enable_checkpointing(model: Any, settings: Any) -> None:
    """Activation checkpointing as the Trainer turns it on at the start of training."""
    from trainer_entry.settings import installed

    if not settings.activation_checkpointing:
        return
    kwargs = dict(installed.read(settings.native, "activation_checkpointing_kwargs") or {})
    every = kwargs.pop("every_n_layers", None)
    offload = kwargs.pop("offload", None)
    extra = {k: v for k, v in (("every_n_layers", every), ("offload", offload)) if v is not None}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(
            activation_checkpointing_kwargs=kwargs or None, **extra
        )
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs or None, **extra)
    if getattr(model, "peft_config", None):
        # frozen embeddings: checkpointed blocks need an input that requires grad
        model.enable_input_require_grads()


def _optimizer(model: Any, settings: Any) -> Any:
    from transformers import Trainer

    cls, kwargs = Trainer.get_optimizer_cls_and_kwargs(settings.native, model)
    return cls([p for p in model.parameters() if p.requires_grad], **kwargs)


def _inputs(cell: _Cell, config: Any) -> dict[str, torch.Tensor]:
    """A micro-batch of the task's shape at its longest (``Task.longest``): full sequences,
    every token labelled; ``SpecError`` where the task's lengths are the data's alone."""
    batch = int(cell.settings.per_device_train_batch_size)
    lengths = cell.task.longest(cell.parsed, config)
    if lengths is None:
        raise SpecError(
            f"{cell.task.name} with this model has no longest micro-batch before its data is "
            "read (its lengths are the clips'), so its memory is not predicted"
        )
    one = cell.task.probe_batch(config, lengths)
    floats = input_dtype(config)  # pixels and audio features are fed in the weights' dtype
    return {
        name: torch.zeros(
            (batch, *value.shape[1:]),
            dtype=floats if floats is not None and value.is_floating_point() else value.dtype,
        )
        for name, value in one.items()
    }


def _loss(cell: _Cell, model: Any, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """The backend's loss of one micro-batch, as its trainer computes it."""
    if declared(cell.parsed.backend).fused_lm_head:
        return model(**inputs, use_cache=False, fused_lm_head=True).loss
    return model(**inputs).loss


def _body(model: Any) -> Any:
    """The module whose output the head and loss take (a causal LM's decoder)."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    body = getattr(inner, "base_model", None)
    return body if isinstance(body, torch.nn.Module) and body is not inner else None


@contextlib.contextmanager
def _replaced(owner: Any, values: Mapping[str, Any]) -> Iterator[None]:
    """``owner``'s attributes set to ``values`` for the block, and restored after it."""
    saved = {name: getattr(owner, name) for name in values}
    for name, value in values.items():
        setattr(owner, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(owner, name, value)


@contextlib.contextmanager
def _layers_kept() -> Iterator[None]:
    """LayerDrop's draw (``torch.rand([]) < layerdrop``, Whisper's encoder in transformers
    5.17) answered as the number 1.0: a fake draw cannot be compared, and 1.0 keeps every
    layer, the step's fullest memory (no layer is dropped at ``layerdrop`` 0 anyway). A
    draw of any other shape is torch's."""
    original = torch.rand

    def rand(*size: Any, **kwargs: Any) -> Any:
        shape = size[0] if len(size) == 1 and isinstance(size[0], list | tuple) else size
        return 1.0 if tuple(shape) == () else original(*size, **kwargs)

    with _replaced(torch, {"rand": rand}):
        yield


@contextlib.contextmanager
def _gpu_attention(on_gpu: bool) -> Iterator[None]:
    """SDPA as a GPU runs it: with a mask or with dropout, the memory-efficient kernel
    (which keeps no scores, and draws its dropout inside: CUDA's flash and efficient
    kernels both do; the CPU's own SDPA falls back to the math path under dropout, whose
    L × L scores and dropout mask a GPU never holds: GPT-BigCode's attention dropout is
    0.1); without either, the CPU's flash kernel already saves what CUDA's does."""
    if not on_gpu:
        yield
        return
    original = torch.nn.functional.scaled_dot_product_attention

    def sdpa(
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        scale: float | None = None,
        enable_gqa: bool = False,
    ) -> torch.Tensor:
        if attn_mask is None and dropout_p == 0:
            return original(
                query, key, value, None, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa
            )
        if enable_gqa and key.shape[-3] != query.shape[-3]:
            groups = query.shape[-3] // key.shape[-3]
            key = key.repeat_interleave(groups, dim=-3)
            value = value.repeat_interleave(groups, dim=-3)
        if attn_mask is not None and attn_mask.dtype == torch.bool:
            bias = torch.zeros(attn_mask.shape, dtype=query.dtype)
            attn_mask = bias.masked_fill(~attn_mask, float("-inf"))
        out: torch.Tensor = torch.ops.aten._scaled_dot_product_efficient_attention(
            query,
            key,
            value,
            attn_mask.expand(*query.shape[:-1], key.shape[-2]) if attn_mask is not None else None,
            True,
            dropout_p,
            is_causal,
            scale=scale,
        )[0]
        return out

    with _replaced(torch.nn.functional, {"scaled_dot_product_attention": sdpa}):
        yield


@contextlib.contextmanager
def _gpu_loss_kernels(on_gpu: bool) -> Iterator[list[str]]:
    """TRL's fused LM head as a GPU runs it: its tiles folded by Triton kernels in
    place, and fp32 products accumulated by cuBLAS (``out_dtype``), neither making a
    tensor; the CPU's torch fallback makes several fp32 copies of every tile. Yields
    the formulas it stood in for (none where TRL is not installed or has no such
    fallback)."""
    stood_in: list[str] = []
    try:
        from trl.kernels import chunked_logprob as kernels
    except ImportError:
        yield stood_in
        return
    names = ("_forward_tile", "_backward_tile", "_addmm_fp32")
    if not on_gpu or not all(hasattr(kernels, n) for n in names):
        yield stood_in
        return

    def in_place(*args: Any, **kwargs: Any) -> None:
        return None

    stood_in.append("TRL's fused LM head: its Triton kernels (no tile copies)")
    with _replaced(kernels, dict.fromkeys(names, in_place)):
        yield stood_in


@contextlib.contextmanager
def _unpacked() -> Iterator[None]:
    """transformers' test for documents packed into a row, answered as the real batch
    answers it: the predicted batch has none (no ``position_ids``). On fake tensors it
    cannot read the positions and takes every row for packed, building a
    batch × 1 × L × L mask, and with it K and V repeated for every query head, that the
    real step never makes."""
    try:
        from transformers import masking_utils
    except ImportError:
        yield
        return
    if not hasattr(masking_utils, "find_packed_sequence_indices"):
        yield
        return

    def none(position_ids: Any) -> None:
        return None

    with _replaced(masking_utils, {"find_packed_sequence_indices": none}):
        yield


# -- the step -------------------------------------------------------------------------------
def _labelled(live: LiveBytes, model: Any, optimizer: Any) -> Callable[[], None]:
    """Hooks that label the step's phases; returns what labels the optimizer's states."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    for p in trainable:
        p.register_post_accumulate_grad_hook(lambda p: live.relabel(p.grad, "gradients"))
    body = _body(model)

    def body_done(_module: Any, _args: Any, output: Any) -> None:
        live.phase = "logits and loss"
        hidden = getattr(output, "last_hidden_state", None)
        if hidden is None and isinstance(output, tuple) and output:
            hidden = output[0]
        if isinstance(hidden, torch.Tensor) and hidden.requires_grad:
            hidden.register_hook(_into_backward)

    def _into_backward(grad: torch.Tensor) -> None:
        live.phase = "backward"

    if body is not None:
        body.register_forward_hook(body_done)

    def states() -> None:
        for state in optimizer.state.values():
            for value in state.values():
                if isinstance(value, torch.Tensor) and value.dim() > 0:
                    live.relabel(value, "optimizer states")

    return states


def _hold_gradients(model: Any, live: LiveBytes) -> None:
    """Every trainable parameter given a gradient, counted as ``gradients``: as after a
    backward, before the optimizer's step clears them."""
    for p in model.parameters():
        if p.requires_grad:
            p.grad = torch.zeros_like(p)
            live.relabel(p.grad, "gradients")


@dataclass
class _Built:
    """A cell's model and optimizer on fake tensors, the optimizer's states made, and
    the counter of their bytes: what the cells of one build group share."""

    mode: Any
    model: Any
    optimizer: Any
    live: LiveBytes
    #: labels the optimizer's states
    states: Callable[[], None]


def _model_key(cell: _Cell) -> str:
    """What the model and optimizer depend on: the cell's spec less its sizes."""
    from trainer_entry.settings import installed

    native = cell.settings.native
    return repr(
        (
            cell.parsed.model,
            cell.parsed.peft,
            cell.parsed.backend,
            cell.parsed.task,
            sorted(cell.task.model_kwargs(cell.parsed).items()),
            cell.on_gpu,
            cell.autocast,
            cell.settings.activation_checkpointing,
            installed.read(native, "activation_checkpointing_kwargs"),
            getattr(native, "optim", None),
            getattr(native, "optim_args", None),
            getattr(native, "optim_target_modules", None),
        )
    )


def _build(cell: _Cell, layers: int | None = None) -> _Built:
    """The cell's model and optimizer on fake tensors (``layers``: with that many of its
    blocks, ``_short_config``), the optimizer's states made."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    config = model_config(cell.parsed, cell.task)
    if layers is not None:
        config = _short_config(config, layers)
    mode = FakeTensorMode(allow_non_fake_inputs=False)
    with mode:
        model = fake_model(cell, config, mode)
        _enable_checkpointing(model, cell.settings)
        optimizer = _optimizer(model, cell.settings)
        live = LiveBytes()
        for p in model.parameters():
            live.add(p, "weights")
        for b in model.buffers():
            live.add(b, "weights")
        states = _labelled(live, model, optimizer)
        with live:
            # the optimizer's states, made as its first step makes them: every later
            # step holds them through its forward and backward
            _hold_gradients(model, live)
            optimizer.step()
            states()
            optimizer.zero_grad(set_to_none=True)
    return _Built(mode, model, optimizer, live, states)


# -- a few blocks for all of them -----------------------------------------------------------
#: a decoder of more alike blocks than the larger of these is stepped with this many
#: blocks each time, and every term of every phase's peak extended to its own count:
#: each term is the same in each block (weights, gradients, optimizer states, a block's
#: saved activations), so it is linear in the count (tests/unit/test_memory_shortcut.py
#: holds it against the whole model's step)
SHORT_LAYERS = (2, 3)


class _NotAlike(Exception):
    """The model's blocks are not all alike: the shortcut does not apply."""


def _blocks(model: Any) -> list[Any]:
    """The model's repeated blocks: its ModuleList with the most parameters."""
    best: list[Any] = []
    best_size = -1
    for module in model.modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) > 0:
            size = sum(p.numel() for p in module.parameters())
            if size > best_size:
                best, best_size = list(module), size
    return best


def _signature(block: Any) -> tuple[Any, ...]:
    return tuple(
        (name, tuple(p.shape), p.dtype, p.requires_grad) for name, p in block.named_parameters()
    ) + tuple(type(m).__name__ for m in block.modules())


def _short_config(config: Any, layers: int) -> Any:
    """``config`` with ``layers`` blocks: its layer count, and every per-layer list of its
    (``layer_types``, ...) cut to that many."""
    import copy

    total = int(config.num_hidden_layers)
    short = copy.deepcopy(config)
    short.num_hidden_layers = layers
    for key, value in list(vars(short).items()):
        if isinstance(value, list) and len(value) == total:
            setattr(short, key, value[:layers])
    return short


@dataclass
class _Shape:
    """What the whole model is, read from it built on the meta device."""

    #: its blocks, where all are alike and the shortcut applies; None: step it whole
    layers: int | None
    trainable: int
    trainable_bytes: int
    largest_block_bytes: int


@dataclass
class _Step:
    """A step's peak of each phase, by term, and the largest tensor made."""

    phases: dict[str, dict[str, int]]
    largest: int
    kernels: list[str]

    def peak(self) -> tuple[dict[str, int], int]:
        """(the terms at the fullest phase's peak, their sum): the step's peak."""
        phase = max(self.phases, key=lambda name: sum(self.phases[name].values()))
        terms = self.phases[phase]
        return dict(terms), sum(terms.values())


def _extended(short: _Step, longer: _Step, counts: tuple[int, int], layers: int) -> _Step:
    """The step of ``layers`` blocks from the steps of ``counts`` blocks: each term of
    each phase's peak extended along the line through the two."""
    low, high = counts
    phases: dict[str, dict[str, int]] = {}
    for phase in short.phases.keys() & longer.phases.keys():
        a, b = short.phases[phase], longer.phases[phase]
        phases[phase] = {
            term: max(0, round(a[term] + (b[term] - a[term]) * (layers - low) / (high - low)))
            for term in TERMS
        }
    if not phases:
        raise _NotAlike("the short steps share no phase")
    return _Step(phases, max(short.largest, longer.largest), longer.kernels)


class Predictor:
    """Predicts cells one after another. The cells of one build group (the same
    model, trainer, LoRA, checkpointing and optimizer; other sizes) share one build, cells
    that differ only in how they shard (GPU count, framework) share one step, and a
    decoder of many alike blocks is stepped with a few (``SHORT_LAYERS``).
    ``shortcut=False``: every step with the whole model."""

    def __init__(self, shortcut: bool = True) -> None:
        self.shortcut = shortcut
        self._built: dict[tuple[str, int | None], _Built] = {}
        self._steps: dict[str, _Step] = {}
        self._shapes: dict[str, _Shape] = {}
        #: a block's signature, by model key, where the shortcut applies
        self._signature: dict[str, tuple[Any, ...]] = {}

    def _shape(self, cell: _Cell) -> _Shape:
        key = cell.model_key
        if key not in self._shapes:
            config = model_config(cell.parsed, cell.task)
            attn, _ = predicted_attention(cell.parsed, cell.on_gpu)
            model = meta_model(cell.parsed, cell.task, config, attn=attn, on_gpu=cell.on_gpu)
            trainable = [p for p in model.parameters() if p.requires_grad]
            blocks = _blocks(model)
            total = getattr(config, "num_hidden_layers", None)
            alike = (
                self.shortcut
                and not getattr(config, "is_encoder_decoder", False)
                and isinstance(total, int)
                and len(blocks) == total > max(SHORT_LAYERS)
                and len({_signature(b) for b in blocks}) == 1
            )
            self._shapes[key] = _Shape(
                layers=len(blocks) if alike else None,
                trainable=sum(p.numel() for p in trainable),
                trainable_bytes=sum(p.numel() * p.element_size() for p in trainable),
                largest_block_bytes=_largest_block_bytes(model),
            )
            if alike:
                self._signature[key] = _signature(blocks[0])
        return self._shapes[key]

    def _step_key(self, cell: _Cell) -> str:
        """What a step holds: the model's key and the micro-batch (not the sharding)."""
        return repr(
            (
                cell.model_key,
                int(cell.settings.per_device_train_batch_size),
                repr(cell.parsed.data),
                int(cell.settings.gradient_accumulation_steps or 1) > 1,
            )
        )

    def step(self, cell: _Cell) -> tuple[dict[str, int], int, int, list[str]]:
        """(what is live at a steady step's peak, by ``TERMS``; the peak; the largest
        tensor made; the GPU kernels stood in for)."""
        key = self._step_key(cell)
        if key not in self._steps:
            shape = self._shape(cell)
            found = None
            if shape.layers is not None:
                try:
                    short = [self._run(cell, count) for count in SHORT_LAYERS]
                    found = _extended(short[0], short[1], SHORT_LAYERS, shape.layers)
                except _NotAlike:
                    found = None
            self._steps[key] = found if found is not None else self._run(cell, None)
        done = self._steps[key]
        terms, peak = done.peak()
        return terms, peak, done.largest, list(done.kernels)

    def _run(self, cell: _Cell, layers: int | None) -> _Step:
        """One training step of the cell's model (``layers``: with that many blocks)."""
        key = (cell.model_key, layers)
        if key not in self._built:
            # one build group at a time: the last one's builds are freed
            self._built = {k: v for k, v in self._built.items() if k[0] == cell.model_key}
            self._built[key] = _build(cell, layers)
            if layers is not None:
                blocks = _blocks(self._built[key].model)
                if len(blocks) != layers or {_signature(b) for b in blocks} != {
                    self._signature.get(cell.model_key)
                }:
                    raise _NotAlike(f"{layers} blocks do not build as the model's")
        built = self._built[key]
        live, model, optimizer = built.live, built.model, built.optimizer
        autocast = (
            torch.autocast("cpu", dtype=cell.autocast)
            if cell.autocast is not None
            else contextlib.nullcontext()
        )
        with (
            built.mode,
            _gpu_attention(cell.on_gpu),
            _gpu_loss_kernels(
                cell.on_gpu and declared(cell.parsed.backend).fused_lm_head
            ) as kernels,
            _unpacked(),
            _layers_kept(),
            live,
        ):
            try:
                if int(cell.settings.gradient_accumulation_steps or 1) > 1:
                    # a micro-batch after the first runs with every gradient held: the
                    # Trainer clears them only after the optimizer's step
                    _hold_gradients(model, live)
                inputs = _inputs(cell, model.config)
                live.reset_peak()
                live.phase = "activations"
                with autocast:
                    loss = _loss(cell, model, inputs)
                if live.phase == "activations":  # no body seen: the loss is the model's
                    live.phase = "backward"
                # the loss's own backward stays "logits and loss" until the gradient
                # reaches the body's output
                loss.backward()
                del loss, inputs
                live.phase = "optimizer step"
                optimizer.step()
                built.states()
            finally:
                # the next cell of the build group starts clean, even after a step that failed
                optimizer.zero_grad(set_to_none=True)
        phases = {}
        for phase, (_, by_label) in live.phase_peaks.items():
            terms = {term: max(0, by_label.get(term, 0)) for term in TERMS}
            terms["activations"] += max(0, by_label.get("other", 0))
            phases[phase] = terms
        return _Step(phases, live.largest, kernels)

    def trainable(self, cell: _Cell) -> tuple[int, int, int]:
        """(the trainable parameters, their bytes, the largest repeated block's weight
        bytes), of the whole model."""
        shape = self._shape(cell)
        return shape.trainable, shape.trainable_bytes, shape.largest_block_bytes


def shard(
    terms: Mapping[str, int],
    sharding: Sharding,
    *,
    trainable: int,
    trainable_bytes: int,
    largest_block_params: int,
    low_precision: bool = False,
) -> tuple[dict[str, int], list[str]]:
    """``terms`` on one rank of ``sharding``, and the formulas that made them so.

    ``trainable``: the trainable parameters, ``trainable_bytes`` their bytes as the
    model keeps them; ``low_precision``: bf16 or fp16 mixed precision is on (DeepSpeed
    then keeps the model's weights in it)."""
    out = dict(terms)
    gpus, formulas = sharding.gpus, []
    gathered = 2 * largest_block_params if gpus > 1 else 0
    reduced = largest_block_params if gpus > 1 else 0
    plus = ", plus the largest block gathered" if gpus > 1 else ""
    if sharding.kind == "FSDP":
        out["weights"] = out["weights"] // gpus + gathered
        out["gradients"] = out["gradients"] // gpus + reduced
        out["optimizer states"] //= gpus
        formulas.append(f"FSDP: weights, gradients and optimizer states ÷ {gpus}{plus}")
    elif sharding.kind == "DEEPSPEED" and sharding.zero_stage >= 1:
        stage = sharding.zero_stage
        # DeepSpeed's optimizer steps fp32 copies: its states are fp32 whatever the
        # model's dtype (the fake step's, scaled to 4 bytes an element), beside fp32
        # master weights; under bf16/fp16 the model's own weights are cast to it
        per_element = trainable_bytes / trainable if trainable else 4.0
        states = int(out["optimizer states"] * 4 / per_element)
        out["optimizer states"] = (states + 4 * trainable) // gpus
        if low_precision and per_element == 4:
            out["weights"] //= 2
        shared = ["fp32 optimizer states and master weights"]
        if stage >= 2:
            out["gradients"] = out["gradients"] // gpus + (reduced if stage >= 3 else 0)
            shared.append("gradients")
        if stage >= 3:
            out["weights"] = out["weights"] // gpus + gathered
            shared.append("weights")
        formulas.append(f"ZeRO-{stage}: {', '.join(shared)} ÷ {gpus}{plus if stage >= 3 else ''}")
    elif sharding.kind == "MULTI_GPU" and gpus > 1:
        # DDP's buckets (gradient_as_bucket_view off, accelerate's default) are made
        # when the model is wrapped, as large as the gradients, and live throughout
        out["gradients"] += trainable_bytes
        formulas.append("DDP: gradient buckets as large as the gradients")
    return out, formulas


def _largest_block_bytes(model: Any) -> int:
    """The bytes of the largest repeated block's weights (a decoder layer)."""
    best = 0
    for module in model.modules():
        if isinstance(module, torch.nn.ModuleList):
            for block in module:
                best = max(best, sum(p.numel() * p.element_size() for p in block.parameters()))
    return best


def predict(spec: Any, predictor: Predictor | None = None) -> Prediction:
    """The cell's predicted peak (``SpecError`` where it cannot be predicted, saying why).
    ``predictor``: the one the cells before it used (a build group's cells share one build)."""
    started = time.monotonic()
    predictor = predictor or Predictor()
    cell = _cell(spec)
    if cell.parsed.training.get("use_liger_kernel"):
        raise SpecError("liger's fused loss is not run here, so its memory is not predicted")
    formulas: list[str] = []
    _, flash = predicted_attention(cell.parsed, cell.on_gpu)
    if flash is not None:
        formulas.append(flash)
    elif cell.on_gpu:
        formulas.append("attention: the GPU's SDPA kernel (no scores kept)")
    try:
        terms, peak, largest, kernels = predictor.step(cell)
        formulas += kernels
    except SpecError:
        raise
    except Exception as exc:  # an op fake tensors cannot run, a model that will not build
        raise SpecError(
            f"the step did not run on fake tensors: {type(exc).__name__}: {exc}"
        ) from exc
    if cell.sharding.kind != "NO" or cell.sharding.gpus > 1:
        count, size, block = predictor.trainable(cell)
        terms, sharded = shard(
            terms,
            cell.sharding,
            trainable=count,
            trainable_bytes=size,
            largest_block_params=block,
            low_precision=cell.autocast is not None,
        )
        formulas += sharded
        peak = sum(terms.values())
    return Prediction(
        peak_bytes=int(peak),
        terms={k: int(v) for k, v in terms.items()},
        largest_block=int(largest),
        seconds=time.monotonic() - started,
        formulas=formulas,
        nvml_lower_bound=cell.sharding.kind == "FSDP" and cell.sharding.gpus > 1,
    )
