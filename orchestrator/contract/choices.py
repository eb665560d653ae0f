"""The values flags and the scenarios file's keys may take, and the flags' number type
(here for the command line, which imports no stage below the API)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from orchestrator.contract.spec import MemoryStages

#: ``--launch`` / the file's ``launch:``: a launch per experiment (the default), or the
#: experiments of one family one after another in one launch
LAUNCH_MODES = ("cell", "family")

#: ``MEMORY_LOGGING`` / ``--memory-logging``: value -> (run the NVML/psutil sidecar,
#: what fills the GPU memory stage columns: see ``orchestrator.contract.spec.MEMORY_STAGE_SOURCES``).
#: ``all`` and ``huggingface`` keep the predecessor's stage figures but read them from
#: torch.cuda counters at stage boundaries; only ``hf-tracker`` runs HF's
#: TrainerMemoryTracker, whose thread polls memory during all of training.
MEMORY_LOGGING: dict[str, tuple[bool, MemoryStages | None]] = {
    "all": (True, "torch"),
    "nvidia": (True, None),
    "huggingface": (False, "torch"),
    # the predecessor's ``all``: the sidecar and HF's own tracker
    "hf-tracker": (True, "hf-tracker"),
}

#: the values a search (``search:``, ``tunematrix fit --max``) may raise
SEARCH_KEYS = ("per_device_train_batch_size", "max_seq_len")
#: a probe whose peak memory is above (1 - margin) of the device's does not fit
DEFAULT_MARGIN = 0.1


def positive_int(text: str) -> int:
    """An argparse type: a positive integer."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value} is not a positive integer")
    return value
