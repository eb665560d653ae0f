"""Live tensor bytes, op by op, and their peak, by what each tensor holds.

``LiveBytes`` is a ``TorchDispatchMode``: every storage an op creates is counted
from that op until Python frees the storage's last tensor (a weak reference on
the storage), under the label in force when it was made (``phase``). Tensors
made before it started (a model's weights) are added by hand, and a tensor can
change label later (a gradient, made in the backward, becomes ``gradients``
once accumulated). It counts real tensors and, under ``FakeTensorMode``, fake
ones alike: a fake tensor's storage has the size the real one would have. That
is what the memory prediction runs (``trainer_entry.run.memoryplan``).

It counts what tensors hold, as ``torch.cuda.memory_allocated`` does, less the
caching allocator's rounding of each block (to 512 bytes) and the workspaces
that kernels take outside tensors (cuBLAS's, NCCL's).
"""

from __future__ import annotations

import weakref
from collections import defaultdict
from typing import Any

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.weak import WeakIdKeyDictionary


class _Block:
    """One storage: its size and its label."""

    __slots__ = ("label", "nbytes")

    def __init__(self, nbytes: int, label: str) -> None:
        self.nbytes = nbytes
        self.label = label


class LiveBytes(TorchDispatchMode):  # type: ignore[misc]
    """Counts the bytes of live storages and their peak, by label."""

    def __init__(self) -> None:
        super().__init__()
        #: the label of what ops create now
        self.phase = "other"
        self._blocks: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self.current = 0
        self.by_label: dict[str, int] = defaultdict(int)
        self.peak = 0
        #: ``by_label`` at the peak
        self.peak_by_label: dict[str, int] = {}
        #: the phase in force when the peak was reached
        self.peak_phase = "other"
        #: the largest single storage made since the last ``reset_peak``
        self.largest = 0
        #: each phase's own peak since the last ``reset_peak``: (bytes, ``by_label`` then)
        self.phase_peaks: dict[str, tuple[int, dict[str, int]]] = {}

    # -- counting ------------------------------------------------------------------------
    def add(self, tensor: torch.Tensor, label: str | None = None) -> None:
        """Count ``tensor``'s storage (once), under ``label`` (default: the phase)."""
        storage = tensor.untyped_storage()
        if storage in self._blocks:
            return
        block = _Block(int(storage.nbytes()), label or self.phase)
        self._blocks[storage] = block
        weakref.finalize(storage, self._freed, block)
        self.by_label[block.label] += block.nbytes
        self.current += block.nbytes
        self.largest = max(self.largest, block.nbytes)
        if self.current > self.peak:
            self.peak = self.current
            self.peak_by_label = dict(self.by_label)
            self.peak_phase = self.phase
        seen = self.phase_peaks.get(self.phase)
        if seen is None or self.current > seen[0]:
            self.phase_peaks[self.phase] = (self.current, dict(self.by_label))

    def relabel(self, tensor: torch.Tensor, label: str) -> None:
        """Count ``tensor``'s storage under ``label`` from now on."""
        storage = tensor.untyped_storage()
        block = self._blocks.get(storage)
        if block is None:
            self.add(tensor, label)
            return
        self.by_label[block.label] -= block.nbytes
        block.label = label
        self.by_label[label] += block.nbytes

    def _freed(self, block: _Block) -> None:
        self.by_label[block.label] -= block.nbytes
        self.current -= block.nbytes

    def reset_peak(self) -> None:
        """Start a new peak from what is live now."""
        self.peak = self.current
        self.peak_by_label = dict(self.by_label)
        self.peak_phase = self.phase
        self.largest = 0
        self.phase_peaks = {}

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        out = func(*args, **(kwargs or {}))
        for leaf in pytree.tree_leaves(out):
            if isinstance(leaf, torch.Tensor):
                self.add(leaf)
        return out
