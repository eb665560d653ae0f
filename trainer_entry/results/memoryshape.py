"""What shapes a run's memory, read from its objects after training, for its row.

Two cells can train the same model on the same data at the same speed and peak
at 12 GB and 34 GB: what tells them apart is in none of their figures but in
how they were set up. A row says, each decided from the trained objects rather
than the scenario's text:

- ``loss_implementation``: what computes the loss (the backend's
  ``loss_implementation``, ``trainer_entry.backends.losses``): whether the full
  logits are ever held, and in which dtype;
- ``weights_dtype``: the parameters' dtype as they are kept (frozen and trainable
  apart where they differ: a LoRA base in bf16, its adapters in fp32);
- ``gradients_dtype``: the dtype the gradients are kept in. torch keeps a
  parameter's gradient in the parameter's dtype, so it is the dtype of the
  parameters the optimizer steps: the model's trainable weights, or the master
  copy a framework keeps apart (DeepSpeed's fp32 partitions under bf16), which
  the row then names beside the model's;
- ``optimizer_states_dtype``: the dtypes of the optimizer's state tensors (``exp_avg``,
  ``exp_avg_sq``), read from the optimizer as it stepped; empty, with a note, for
  an optimizer that keeps none;
- ``optimizer``: the ``optim`` argument and the class it built (``adamw_torch_fused
  (AdamW, fused)``), or the DeepSpeed config's optimizer where that one ran.

Each is read on rank 0 once training's figures are taken; one that cannot be
read is left empty with a note, never failing the run it describes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from trainer_entry.backends.losses import trainer_of, unwrapped
from trainer_entry.backends.trainer_protocol import TrainerBackend
from trainer_entry.settings.parsed import ParsedArguments

#: the packages whose optimizer wrappers are no optimizer of their own (accelerate's,
#: around the one that steps)
_WRAPPERS = ("accelerate",)


@dataclass(frozen=True)
class MemoryShape:
    """The settings that shape a run's memory, as its row records them (None: unknown)."""

    loss_implementation: str | None = None
    weights_dtype: str | None = None
    gradients_dtype: str | None = None
    optimizer_states_dtype: str | None = None
    optimizer: str | None = None
    #: why a setting is empty
    notes: tuple[str, ...] = field(default_factory=tuple)

    def fields(self) -> dict[str, str | None]:
        """The result's fields (``ChildResult``), by name."""
        return {
            "loss_implementation": self.loss_implementation,
            "weights_dtype": self.weights_dtype,
            "gradients_dtype": self.gradients_dtype,
            "optimizer_states_dtype": self.optimizer_states_dtype,
            "optimizer": self.optimizer,
        }


def dtype_name(dtype: torch.dtype) -> str:
    """``bfloat16`` for ``torch.bfloat16``."""
    return str(dtype).removeprefix("torch.")


def _size(p: torch.Tensor) -> int:
    """A parameter's elements, a ZeRO-3 partitioned one's whole count (``ds_numel``)."""
    return int(getattr(p, "ds_numel", None) or p.numel())


def _by_size(sizes: dict[torch.dtype, int]) -> str:
    """The dtypes, the one with most elements first, joined by ``+``."""
    return "+".join(dtype_name(d) for d, _ in sorted(sizes.items(), key=lambda kv: -kv[1]))


def weights_dtype(model: Any) -> str | None:
    """The dtype the model's parameters are kept in: one name where all share it, else
    the frozen and the trainable ones apart (``bfloat16 frozen, float32 trainable``)."""
    frozen: dict[torch.dtype, int] = {}
    trainable: dict[torch.dtype, int] = {}
    for p in model.parameters():
        side = trainable if p.requires_grad else frozen
        side[p.dtype] = side.get(p.dtype, 0) + _size(p)
    if len(frozen.keys() | trainable.keys()) <= 1:
        return next((dtype_name(d) for d in (*frozen, *trainable)), None)
    parts = [f"{_by_size(frozen)} frozen"] if frozen else []
    parts += [f"{_by_size(trainable)} trainable"] if trainable else []
    return ", ".join(parts)


def optimizer_chain(optimizer: Any) -> list[Any]:
    """The optimizer and what it wraps, outermost first (accelerate's wrapper, DeepSpeed's
    ZeRO optimizer, the torch optimizer that steps)."""
    chain: list[Any] = []
    while optimizer is not None and len(chain) < 8 and all(optimizer is not o for o in chain):
        chain.append(optimizer)
        optimizer = getattr(optimizer, "optimizer", None)
    return chain


def _stepped(trainer: Any) -> Any:
    """The innermost optimizer of the trainer: the one whose state and parameters step."""
    chain = optimizer_chain(getattr(trainer, "optimizer", None))
    return chain[-1] if chain else None


def _params(optimizer: Any) -> Iterable[torch.Tensor]:
    for group in getattr(optimizer, "param_groups", None) or []:
        yield from group.get("params", [])


def gradients_dtype(trainer: Any, model: Any) -> str | None:
    """The dtype the gradients are kept in: the dtype of the parameters the optimizer
    steps (torch keeps a gradient in its parameter's dtype), with the model's trainable
    weights' beside it where those differ (a master copy: ``float32 master (bfloat16 in
    the model)``); the trainable weights' before the optimizer is built."""
    model_sizes: dict[torch.dtype, int] = {}
    for p in model.parameters():
        if p.requires_grad:
            model_sizes[p.dtype] = model_sizes.get(p.dtype, 0) + _size(p)
    stepped: dict[torch.dtype, int] = {}
    for p in _params(_stepped(trainer)):
        grad = p.grad if isinstance(p.grad, torch.Tensor) else p
        stepped[grad.dtype] = stepped.get(grad.dtype, 0) + _size(p)
    if not stepped:
        return _by_size(model_sizes) if model_sizes else None
    if not model_sizes or stepped.keys() == model_sizes.keys():
        return _by_size(stepped)
    return f"{_by_size(stepped)} master ({_by_size(model_sizes)} in the model)"


def optimizer_states_dtype(trainer: Any) -> tuple[str | None, str | None]:
    """(the dtypes of the optimizer's state tensors, each with the states held in it:
    ``float32 (exp_avg, exp_avg_sq)``; a note when there is none to read)."""
    optimizer = _stepped(trainer)
    if optimizer is None:
        return None, "optimizer_states_dtype is empty: no optimizer was built"
    keys: dict[torch.dtype, dict[str, None]] = {}
    sizes: dict[torch.dtype, int] = {}
    for state in getattr(optimizer, "state", {}).values():
        for key, value in state.items():
            # a step counter (a 0-d tensor under torch's Adam) is no state of a weight
            if isinstance(value, torch.Tensor) and value.dim() > 0:
                keys.setdefault(value.dtype, {})[str(key)] = None
                sizes[value.dtype] = sizes.get(value.dtype, 0) + value.numel()
    if not keys:
        name = type(optimizer).__name__
        return None, f"optimizer_states_dtype is empty: the optimizer ({name}) kept no state"
    order = sorted(keys, key=lambda d: -sizes[d])
    return ", ".join(f"{dtype_name(d)} ({', '.join(keys[d])})" for d in order), None


def optimizer_name(trainer: Any) -> str | None:
    """The ``optim`` argument and the class that stepped (``adamw_torch_fused (AdamW,
    fused)``); the DeepSpeed config's optimizer where it named one; what wraps it besides
    accelerate's wrapper (``in DeepSpeedZeroOptimizer``)."""
    args = getattr(trainer, "args", None)
    optim = getattr(args, "optim", None)
    asked = str(getattr(optim, "value", optim)) if optim is not None else None
    if _deepspeed_optimizer(trainer):
        asked = "deepspeed config"
    chain = optimizer_chain(getattr(trainer, "optimizer", None))
    if not chain:
        return asked
    stepped = chain[-1]
    group = (getattr(stepped, "param_groups", None) or [{}])[0]
    how = next((flag for flag in ("fused", "foreach") if group.get(flag)), None)
    inner = [type(stepped).__name__, *([how] if how else [])]
    wrappers = [
        type(o).__name__ for o in chain[:-1] if type(o).__module__.split(".")[0] not in _WRAPPERS
    ]
    text = ", ".join(inner) + (f"; in {', '.join(wrappers)}" if wrappers else "")
    return f"{asked} ({text})" if asked else text


def _deepspeed_optimizer(trainer: Any) -> bool:
    """Whether the DeepSpeed config named the optimizer (then ``optim`` is not used)."""
    state = getattr(getattr(trainer, "accelerator", None), "state", None)
    plugin = getattr(state, "deepspeed_plugin", None)
    config = getattr(plugin, "deepspeed_config", None)
    return isinstance(config, dict) and bool(config.get("optimizer"))


def read_memory_shape(
    trainer_run: Any, backend: TrainerBackend, parsed: ParsedArguments, model: Any
) -> MemoryShape:
    """The settings that shape the run's memory, from its built trainer (``trainer_run``:
    what ``backend.build`` returned), its arguments and its model, after training."""
    trainer = trainer_of(trainer_run)
    notes: list[str] = []

    def read(what: str, reader: Callable[[], Any]) -> Any:
        try:
            return reader()
        except Exception as exc:  # a row without one setting, never a run lost at its end
            notes.append(f"{what} is empty: it could not be read ({type(exc).__name__}: {exc})")
            return None

    states = read("optimizer_states_dtype", lambda: optimizer_states_dtype(trainer))
    state_dtypes, state_note = states if states is not None else (None, None)
    notes += [state_note] if state_note else []
    base = unwrapped(model)
    return MemoryShape(
        loss_implementation=read(
            "loss_implementation", lambda: backend.loss_implementation(trainer_run, parsed)
        ),
        weights_dtype=read("weights_dtype", lambda: weights_dtype(base)),
        gradients_dtype=read("gradients_dtype", lambda: gradients_dtype(trainer, base)),
        optimizer_states_dtype=state_dtypes,
        optimizer=read("optimizer", lambda: optimizer_name(trainer)),
        notes=tuple(notes),
    )
