"""The kinds of model name a scenario may give, told apart without the training stack.

``tiny-llama`` (the embedded model), ``config:<architecture or path>`` (an
architecture, randomly initialised; a local folder with a ``config.json`` and no
weights is one too), ``python:<module>:<function>`` (a user
function that builds the model) and anything else (``pretrained``: a hub id
or a local folder with weights). ``trainer_entry.models.load`` loads each kind.
"""

from __future__ import annotations

from pathlib import Path
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
    "tiny-t5": "trainer_entry.models.tiny_t5:ensure_tiny_t5",
    "tiny-bart": "trainer_entry.models.tiny_bart:ensure_tiny_bart",
    "tiny-whisper": "trainer_entry.models.tiny_whisper:ensure_tiny_whisper",
    "tiny-wav2vec2": "trainer_entry.models.tiny_wav2vec2:ensure_tiny_wav2vec2",
    "tiny-vlm": "trainer_entry.models.tiny_vlm:ensure_tiny_vlm",
}

#: ``config:<name>`` builds a shipped architecture, ``config:<path>`` any config.json
CONFIG_PREFIX = "config:"
#: the files that hold a model's weights
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".msgpack", ".h5")


def config_only(name: str) -> bool:
    """Whether ``name`` is a local folder with a ``config.json`` and no weights (nor a PEFT
    adapter): an architecture, built as ``config:<folder>`` is."""
    path = Path(name).expanduser()
    try:
        if not (path / "config.json").is_file() or (path / "adapter_config.json").exists():
            return False
        return not any(f.suffix in WEIGHT_SUFFIXES for f in path.iterdir())
    except OSError:
        return False


def model_kind(name: str) -> ModelKind:
    """Which kind of model ``name`` names (a folder holding only a config is ``config``)."""
    if name in TINY_MODELS:
        return "tiny"
    if name.startswith(CONFIG_PREFIX):
        return "config"
    if is_python_model(name):
        return "python"
    if config_only(name):
        return "config"
    return "pretrained"


# the parent knows the names too (it keeps the hub offline for them)
assert tuple(TINY_MODELS) == TINY_MODEL_NAMES, "orchestrator.contract.modelnames lists them"
