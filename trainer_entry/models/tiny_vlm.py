"""The embedded vision-language model ``tiny-vlm``: built offline, deterministically, once.

A LLaVA-style model: a two-layer CLIP vision tower (width 64) for 32×32
colour images in 4×4 patches (64 patches and the class token), a two-layer
GELU projector, and a two-layer Llama the size of ``tiny-llama``'s
(``trainer_entry.models.tiny``), initialised from a fixed seed. Nothing is
downloaded.

The tokenizer is ``tiny-llama``'s (built first, into the same cache, if it is
not there yet) with one special token added, ``<image>``, whose id is the
model's ``image_token_index``. The tower's last layer feeds the projector
(``vision_feature_layer`` -1) without the class token
(``vision_feature_select_strategy`` "default"): 64 image tokens per image,
which the processor writes in place of each ``<image>`` in a prompt. The
processor is a ``LlavaProcessor`` (``AutoProcessor``): a CLIP image processor
that resizes and centre-crops to 32×32 and normalises with CLIP's mean and
standard deviation, the tokenizer, and a chat template like ``tiny-llama``'s
whose messages may also hold a list of parts, an image part written as
``<image>`` on its own line.

Built, cached and published as every tiny model is
(``trainer_entry.models.tiny.TinyModel``), its key covering ``tiny-llama``'s.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainer_entry.models import tiny

TINY_VLM_NAME = "tiny-vlm"
IMAGE_TOKEN = "<image>"

# The recipe. Changing any of it changes the cache key.
_RECIPE: dict[str, Any] = {
    "version": 1,
    "seed": 8642,
    "image_token": IMAGE_TOKEN,
    "image_processor": {
        "size": {"shortest_edge": 32},
        "crop_size": {"height": 32, "width": 32},
    },
    "vision": {
        "image_size": 32,
        "patch_size": 4,
        "num_channels": 3,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
    },
    # tiny-llama's own text model
    "text": tiny._RECIPE["model"],
    "model": {
        "vision_feature_layer": -1,
        "vision_feature_select_strategy": "default",
        "projector_hidden_act": "gelu",
        # (32 / 4) ** 2 patches, the class token dropped
        "image_seq_length": 64,
    },
}

#: ``tiny-llama``'s template, with messages whose content is a list of text and image parts
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|{{ message['role'] }}|>\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<image>\n"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}{{ eos_token }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

#: What a build must have written before it is marked finished.
BUILT_FILES = (
    *tiny.BUILT_FILES,
    "generation_config.json",
    "processor_config.json",
    "chat_template.jinja",
)


# the tokenizer is tiny-llama's: its key (its recipe and texts) is part of this one
TINY_VLM = tiny.TinyModel(
    TINY_VLM_NAME,
    {**_RECIPE, "chat_template": CHAT_TEMPLATE},
    (),
    lambda folder: build(folder),
    BUILT_FILES,
    more=lambda: {"tokenizer": tiny.TINY.key()},
)
tiny_vlm_path, is_complete, ensure_tiny_vlm = TINY_VLM.functions()


def build(folder: Path) -> None:
    """Take ``tiny-llama``'s tokenizer, add ``<image>``, initialise the model, save it
    and the processor to ``folder``."""
    from tokenizers import Tokenizer
    from transformers import (
        CLIPImageProcessorPil,
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
        PreTrainedTokenizerFast,
    )

    source = tiny.ensure_tiny()
    # tiny-llama's tokenizer as it was trained (BOS before every text), built anew rather
    # than loaded, so that nothing of the loading (its path) is saved with it
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_file(str(source / "tokenizer.json")),
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        extra_special_tokens={"image_token": _RECIPE["image_token"]},
        model_max_length=_RECIPE["text"]["max_position_embeddings"],
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    # CLIP's processor on PIL: written as "CLIPImageProcessor", which loads with either
    # backend (torchvision's where it is installed)
    image_processor = CLIPImageProcessorPil(**_RECIPE["image_processor"])
    processor = LlavaProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=_RECIPE["vision"]["patch_size"],
        vision_feature_select_strategy=_RECIPE["model"]["vision_feature_select_strategy"],
        num_additional_image_tokens=1,  # the class token
        chat_template=CHAT_TEMPLATE,
    )
    processor.save_pretrained(folder)
    config = LlavaConfig(
        vision_config=CLIPVisionConfig(**_RECIPE["vision"]),
        text_config=LlamaConfig(
            **tiny.token_ids(tokenizer, "bos", "eos", "pad"), **_RECIPE["text"]
        ),
        image_token_index=processor.image_token_id,
        **_RECIPE["model"],
    )
    tiny.save_model(tiny.seeded(LlavaForConditionalGeneration, config, _RECIPE["seed"]), folder)
