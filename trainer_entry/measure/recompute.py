"""What activation checkpointing recomputes, seen on the run's own first training step.

Checkpointing reruns a block's forward inside the backward, and how much of it
depends on the mode and the block: reentrant checkpointing reruns all of it;
non-reentrant checkpointing (transformers' default) stops once the last tensor
the backward saved is regenerated, so a block's trailing matmul (Llama's
``down_proj``) is not rerun — unless something after it saves its output (a
routing weight, a norm, dropout). A formula for this is a second implementation
of ``torch.utils.checkpoint`` and of every model's block, and goes stale with
them. So the run watches instead: over its first optimizer step (a warm-up step,
outside the measured window) every weight-matrix module and every attention
module counts the forwards it completed in the forward pass and the ones it ran
again inside the backward. The FLOPs of what ran again are the recompute
(``trainer_entry.measure.flops``); every mode, ``every_n_layers`` and a
``python:`` model's own checkpointing are seen as they ran.

An attention module's core (the score and mixing products, which no module
holds) ran again when the module completed again, or when its last weight
matrix (the output projection, fed by the core) started again.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch


def _in_backward() -> bool:
    """Inside an autograd backward (where checkpointing recomputes), on any thread."""
    return bool(torch._C._current_graph_task_id() != -1)


@dataclass
class _Counts:
    #: forwards completed outside the backward
    forward: int = 0
    #: forwards completed again inside the backward
    again: int = 0
    #: forwards started again inside the backward (completed or not)
    started_again: int = 0


@dataclass(frozen=True)
class Recomputed:
    """What the watched step ran again, per module (by ``id``)."""

    #: module id -> forwards completed again per forward (0: never; 1: each forward once more)
    shares: dict[int, float] = field(default_factory=dict)
    #: module id -> forwards started again per forward (completed or stopped inside)
    started: dict[int, float] = field(default_factory=dict)
    #: per attention module, in model order: the share of its forwards whose core ran again
    attention: tuple[float, ...] = ()
    #: module id -> reruns per forward that a trainer's own code adds outside module
    #: calls (``TrainerBackend.reruns``: TRL's fused LM head), on top of the watched ones
    added: dict[int, float] = field(default_factory=dict)

    def with_reruns(self, reruns: dict[int, float]) -> Recomputed:
        """These, with the reruns a trainer's own code adds (``TrainerBackend.reruns``)."""
        return dataclasses.replace(self, added={**self.added, **reruns}) if reruns else self

    @property
    def checkpointed(self) -> bool:
        """Whether the watched step ran any weight product again (checkpointing's)."""
        return any(self.shares.values()) or any(self.started.values())

    def share(self, module: torch.nn.Module, *, single: bool = True) -> float:
        """The share of ``module``'s forwards whose products ran again. A module of one
        product (a linear layer) ran it where it completed again: checkpointing stops
        as an op saves its inputs, before the op runs. A module of several (a mixture of
        experts' expert weights) ran them where it started again: the routing weight
        that multiplies each expert's output saves that output, so the recompute stops
        after the last expert's products at the earliest."""
        watched = (self.shares if single else self.started).get(id(module), 0.0)
        return watched + self.added.get(id(module), 0.0)


def attention_modules(model: Any) -> list[torch.nn.Module]:
    """The model's attention modules, outermost only, in model order: modules whose class
    is named ``…Attention`` (``LlamaAttention``, ``GPTBigCodeAttention``; BERT's
    ``BertAttention`` and not the ``BertSelfAttention`` inside it)."""
    found: list[torch.nn.Module] = []
    inside: set[int] = set()
    for module in model.modules():
        if id(module) in inside:
            continue
        if type(module).__name__.endswith("Attention"):
            found.append(module)
            inside.update(id(m) for m in module.modules())
    return found


class RecomputeWatch:
    """Counts forwards and their reruns inside the backward over one optimizer step.

    ``attach`` before the step's first micro-batch, ``detach`` at its end; the
    hooks are gone after, so the measured steps run without them.
    """

    def __init__(self) -> None:
        self._handles: list[Any] = []
        self._counts: dict[int, _Counts] = {}
        self._matmuls: set[int] = set()
        self._attention: list[int] = []
        #: attention module id -> its children holding weight matrices, in the order
        #: they started in the forward (the last: the output projection)
        self._order: dict[int, list[int]] = {}
        self._child_of: dict[int, int] = {}
        self.result: Recomputed | None = None
        #: why the step was not watched (then ``result`` stays None)
        self.unwatched: str | None = None
        # DataParallel's replicas run their forwards, and autograd its device threads,
        # at once
        self._lock = threading.Lock()

    @property
    def attached(self) -> bool:
        return bool(self._handles)

    def attach(self, model: Any, matmul_modules: Iterable[torch.nn.Module]) -> None:
        """Watch ``matmul_modules`` (the modules whose weight products the FLOPs count),
        the attention modules of ``model`` and their children that hold such modules."""
        watched: dict[int, torch.nn.Module] = {id(m): m for m in matmul_modules}
        self._matmuls = set(watched)
        for attention in attention_modules(model):
            self._attention.append(id(attention))
            watched[id(attention)] = attention
            for child in attention.children():
                if any(id(m) in self._matmuls for m in child.modules()):
                    self._child_of[id(child)] = id(attention)
                    watched[id(child)] = child
        for key, module in watched.items():
            self._counts[key] = _Counts()
            self._handles.append(
                module.register_forward_pre_hook(functools.partial(self._started, key))
            )
            self._handles.append(
                module.register_forward_hook(functools.partial(self._completed, key))
            )

    def _started(self, key: int, module: Any, args: Any) -> None:
        backward = _in_backward()
        with self._lock:
            if backward:
                self._counts[key].started_again += 1
                return
            parent = self._child_of.get(key)
            if parent is not None:
                order = self._order.setdefault(parent, [])
                if key in order:
                    order.remove(key)
                order.append(key)

    def _completed(self, key: int, module: Any, args: Any, output: Any) -> None:
        backward = _in_backward()
        with self._lock:
            if backward:
                self._counts[key].again += 1
            else:
                # with or without gradients: reentrant checkpointing runs the first
                # forward of a block under no_grad
                self._counts[key].forward += 1

    def detach(self) -> Recomputed | None:
        """Remove the hooks; what the watched step ran again (None: not watched)."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        if self.unwatched is not None:
            return None
        counts = {k: self._counts[k] for k in self._matmuls if self._counts[k].forward}
        self.result = Recomputed(
            {k: c.again / c.forward for k, c in counts.items()},
            {k: c.started_again / c.forward for k, c in counts.items()},
            tuple(self._attention_share(a) for a in self._attention),
        )
        return self.result

    def _attention_share(self, key: int) -> float:
        counts = self._counts[key]
        if not counts.forward:
            return 0.0
        order = self._order.get(key)
        if not order:
            return counts.again / counts.forward
        # the core ran again where the output projection it feeds started again
        # (the module may have been stopped inside it)
        output = self._counts[order[-1]]
        return min(output.started_again, counts.started_again) / counts.forward


def checkpointing_mode(model: Any) -> str | None:
    """How the model checkpoints its blocks, read from them as they are set up:
    ``non-reentrant``, ``reentrant``, ``mixed``, ``other`` (a function this cannot read),
    or None (no block checkpointed).

    transformers sets each checkpointed block's ``_gradient_checkpointing_func`` to
    ``torch.utils.checkpoint.checkpoint`` with the run's keyword arguments; torch
    takes a missing ``use_reentrant`` as reentrant. A block wrapped by torch's
    ``checkpoint_wrapper`` (accelerate's ``fsdp_activation_checkpointing``) says its
    mode in ``checkpoint_impl``.
    """
    modes: set[str] = set()
    for module in model.modules():
        impl = getattr(module, "checkpoint_impl", None)
        if type(module).__name__ == "CheckpointWrapper" and impl is not None:
            modes.add("reentrant" if getattr(impl, "name", "") == "REENTRANT" else "non-reentrant")
            continue
        if getattr(module, "gradient_checkpointing", False) is not True:
            continue
        func = getattr(module, "_gradient_checkpointing_func", None)
        if func is None:
            continue
        keywords = getattr(func, "keywords", None)
        if keywords is None:
            modes.add("other")
        else:
            modes.add("reentrant" if keywords.get("use_reentrant", True) else "non-reentrant")
    if not modes:
        return None
    return modes.pop() if len(modes) == 1 else "mixed"
