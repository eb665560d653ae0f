"""The embedded image model ``tiny-vit``: built offline, deterministically, once.

A four-layer ViT (hidden size 64, the MLP four times as wide, as in ViT-Base)
for 32×32 colour images in 4×4 patches (64 patches and the class token: 65
positions), its classifier labelled with the classes of the generated
``synthetic-shapes`` set, initialised from a fixed seed. Nothing is
downloaded. It has no tokenizer and needs no image processor: the
``image-classification`` task resizes and normalises images itself
(``trainer_entry.data.images``).

Built, cached and published as every tiny model is
(``trainer_entry.models.tiny.TinyModel``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainer_entry.data.images import SYNTHETIC_CLASSES, SYNTHETIC_VERSION
from trainer_entry.models import tiny

TINY_VIT_NAME = "tiny-vit"

# The recipe. Changing any of it changes the cache key.
_RECIPE: dict[str, Any] = {
    "version": 1,
    "seed": 4321,
    "classes": list(SYNTHETIC_CLASSES),
    "synthetic_version": SYNTHETIC_VERSION,
    "model": {
        "image_size": 32,
        "patch_size": 4,
        "num_channels": 3,
        "hidden_size": 64,
        "intermediate_size": 256,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "hidden_act": "gelu",
        "qkv_bias": True,
        "layer_norm_eps": 1e-12,
    },
}

#: What a build must have written before it is marked finished.
BUILT_FILES = ("config.json", "model.safetensors")


TINY_VIT = tiny.TinyModel(TINY_VIT_NAME, _RECIPE, (), lambda folder: build(folder), BUILT_FILES)
tiny_vit_path, is_complete, ensure_tiny_vit = TINY_VIT.functions()


def build(folder: Path) -> None:
    """Initialise the model from the recipe's seed and save it to ``folder``.

    Writes what ``save_pretrained`` writes (the config and the weights) on
    whichever rank builds it: with a process group up, ``save_pretrained``
    would write them on rank 0 only.
    """
    from safetensors.torch import save_file
    from transformers import ViTConfig, ViTForImageClassification

    classes = _RECIPE["classes"]
    config = ViTConfig(
        **_RECIPE["model"],
        id2label=dict(enumerate(classes)),
        label2id={name: i for i, name in enumerate(classes)},
    )
    model = tiny.seeded(ViTForImageClassification, config, _RECIPE["seed"])
    model.config.dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    model.config.architectures = [type(model).__name__]
    model.config.save_pretrained(folder)
    weights = {name: t.contiguous() for name, t in model.state_dict().items()}
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
