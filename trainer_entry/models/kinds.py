"""The kinds of model name a scenario may give, told apart without the training stack.

``tiny-llama`` (the embedded model), ``config:<architecture or path>`` (an
architecture, randomly initialised) and anything else (``pretrained``: a hub id
or a local folder with weights). ``trainer_entry.models.load`` loads each kind.
"""

from __future__ import annotations

from typing import Literal

from trainer_entry.models.tiny import TINY_NAME

ModelKind = Literal["tiny", "config", "pretrained"]

#: ``config:<name>`` builds a shipped architecture, ``config:<path>`` any config.json
CONFIG_PREFIX = "config:"


def model_kind(name: str) -> ModelKind:
    """Which kind of model ``name`` names."""
    if name == TINY_NAME:
        return "tiny"
    if name.startswith(CONFIG_PREFIX):
        return "config"
    return "pretrained"
