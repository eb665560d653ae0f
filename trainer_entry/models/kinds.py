"""The kinds of model name a scenario may give, told apart without the training stack.

``tiny-llama`` (the embedded model), ``config:<architecture or path>`` (an
architecture, randomly initialised), ``python:<module>:<function>`` (a user
function that builds the model) and anything else (``pretrained``: a hub id
or a local folder with weights). ``trainer_entry.models.load`` loads each kind.
"""

from __future__ import annotations

from typing import Literal

from orchestrator.contract.modelnames import TINY_MODEL_NAMES, is_python_model
from trainer_entry.models.tiny import TINY_NAME

ModelKind = Literal["tiny", "config", "python", "pretrained"]

#: the embedded tiny models: name -> "module:function" that builds it (once) and
#: returns its folder; the function's module imports the training stack only when called
TINY_MODELS: dict[str, str] = {
    TINY_NAME: "trainer_entry.models.tiny:ensure_tiny",
    "tiny-bert": "trainer_entry.models.tiny_bert:ensure_tiny_bert",
    "tiny-vit": "trainer_entry.models.tiny_vit:ensure_tiny_vit",
}

#: ``config:<name>`` builds a shipped architecture, ``config:<path>`` any config.json
CONFIG_PREFIX = "config:"


def model_kind(name: str) -> ModelKind:
    """Which kind of model ``name`` names."""
    if name in TINY_MODELS:
        return "tiny"
    if name.startswith(CONFIG_PREFIX):
        return "config"
    if is_python_model(name):
        return "python"
    return "pretrained"


# the parent knows the names too (it keeps the hub offline for them)
assert tuple(TINY_MODELS) == TINY_MODEL_NAMES, "orchestrator.contract.modelnames lists them"
