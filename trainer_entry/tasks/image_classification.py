"""``image-classification``: a ViT-style encoder and a classifier on its class token.

The model is loaded with ``AutoModelForImageClassification``, its head sized
for the data's classes (``num_labels``, with their names); a checkpoint
trained on other classes gets a new head. Under LoRA the model is a plain
``PeftModel`` and the new head (``classifier``) is trained in full.

The data (``trainer_entry.data.images``): the generated ``synthetic-shapes``
set by default, or a local file or hub dataset with an image in
``image_field`` and a class in ``label_field``; every image is resized to the
model's ``image_size`` and normalised as it is fed.

Units:

- a sample is an image: samples/s is images/s;
- a token is one position of the encoder's sequence: the image's patches
  plus the class token (DeiT: plus its distillation token), e.g. 14 × 14 + 1
  = 197 for a 224 × 224 image in 16 × 16 patches. Tokens/s counts these
  positions; every image has the same number, so nothing is padding;
- FLOPs: every encoder layer runs once per position; the classifier (and a
  pooler, where the model has one) runs once per image, on the class token.

In the result's data record, ``examples`` and ``sequences`` are images,
``tokens`` is images × positions, and ``label_tokens`` is one per image (the
class token carries the loss).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from trainer_entry.data.collate import input_dtype
from trainer_entry.data.holdout import holdout_count, holdout_indices
from trainer_entry.data.images import (
    ImageCollator,
    ImageDataset,
    ImageExamples,
    ImageSource,
    image_size,
    open_images,
)
from trainer_entry.models.kinds import model_kind
from trainer_entry.settings.parsed import ParsedArguments
from trainer_entry.spec_errors import SpecError
from trainer_entry.tasks.task_protocol import ReadOnce, TaskData, TaskDefaults, uncached

#: positions a model puts before its patches, by ``model_type``: the class token,
#: and DeiT's distillation token. Another model type is refused rather than
#: counted on a guess.
EXTRA_POSITIONS: dict[str, int] = {"vit": 1, "deit": 2}
#: modules that run on one position per image (the class token), not on every position:
#: names ending so (``classifier``, DeiT's ``cls_classifier``, ``pooler``)
PER_IMAGE_MODULES = ("classifier", "pooler")


def encoder_positions(config: Any) -> int:
    """The length of the encoder's sequence for one image: patches plus the extra tokens."""
    model_type = getattr(config, "model_type", None)
    if model_type not in EXTRA_POSITIONS:
        raise SpecError(
            f"task image-classification counts tokens for ViT-style models "
            f"(model_type {', '.join(EXTRA_POSITIONS)}); this model is {model_type!r}"
        )
    missing = [k for k in ("image_size", "patch_size", "num_channels") if not hasattr(config, k)]
    if missing:
        raise SpecError(f"the model's config has no {', '.join(missing)}")
    (height, width), (ph, pw) = image_size(config.image_size), image_size(config.patch_size)
    return (height // ph) * (width // pw) + EXTRA_POSITIONS[model_type]


class ImageClassificationTask(TaskDefaults):
    name = "image-classification"
    sample_unit = "images"
    modality = "image"
    auto_class = "AutoModelForImageClassification"
    #: the loss sums over the images and divides by the item count it is passed
    tokenizer_model: str | None = None
    loss_counts_items = True

    def __init__(self) -> None:
        #: the labelled images a data config names, opened once per run
        self._images: ReadOnce[ImageSource] = ReadOnce(open_images)
        self._positions: int | None = None
        self._dtype: torch.dtype | None = None

    def model_kwargs(self, parsed: ParsedArguments) -> dict[str, Any]:
        classes = self._images(parsed.data).classes
        kwargs: dict[str, Any] = {
            "num_labels": len(classes),
            "id2label": dict(enumerate(classes)),
            "label2id": {name: i for i, name in enumerate(classes)},
        }
        if model_kind(parsed.model.name) in ("tiny", "pretrained"):
            # a checkpoint's head for other classes is replaced by a new one
            kwargs["ignore_mismatched_sizes"] = True
        return kwargs

    def head_modules(self, model: Any) -> list[str]:
        names = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
        return ["classifier"] if "classifier" in names else []

    def prepare(
        self,
        parsed: ParsedArguments,
        processor: Any,
        data_dir: Path,
        *,
        as_given: bool,
        model_config: Any,
    ) -> TaskData:
        positions = encoder_positions(model_config)
        size = image_size(model_config.image_size)
        channels = int(model_config.num_channels)
        source = self._images(parsed.data)
        examples = ImageExamples(source, size, channels, processed=not as_given)
        # the first image now: a field that is no image fails here, in one line
        first = ImageDataset(examples)[0]["pixel_values"]
        assert first.shape == (channels, *size)
        self._dtype = input_dtype(model_config)
        self._positions = positions
        n = len(source)
        meta: dict[str, Any] = {
            "source": source.identity,
            "examples": n,
            "sequences": n,
            "tokens": n * positions,
            "label_tokens": n,
            **uncached(as_given),
        }
        if not parsed.evaluation.enabled:
            return TaskData(examples=examples, meta=meta)
        # eval: an image is a document; the two parts index the one source
        count = holdout_count(n, parsed.evaluation.holdout)
        train, held = holdout_indices(n, count)
        trained = len(train)
        meta.update(
            sequences=trained,
            tokens=trained * positions,
            label_tokens=trained,
            heldout_sequences=count,
        )
        return TaskData(
            examples=dataclasses.replace(examples, indices=tuple(train)),
            meta=meta,
            eval_examples=dataclasses.replace(examples, indices=tuple(held)),
        )

    def dataset(self, data: TaskData) -> torch.utils.data.Dataset[Any]:
        return ImageDataset(data.examples)

    def collator(self, processor: Any, parsed: ParsedArguments) -> Any:
        if self._positions is None:
            raise RuntimeError("the image-classification collator is made after prepare()")
        return ImageCollator(self._positions, self._dtype)

    def longest(self, parsed: ParsedArguments, model_config: Any) -> dict[str, int] | None:
        return {}  # every image has the model's size

    def probe_batch(self, model_config: Any, lengths: Mapping[str, int]) -> dict[str, Any]:
        height, width = image_size(model_config.image_size)
        pixels = torch.ones((1, int(model_config.num_channels), height, width), device="meta")
        return {
            "pixel_values": pixels,
            "labels": torch.zeros((1,), dtype=torch.long, device="meta"),
        }

    def per_sample_modules(self, model: Any) -> set[int]:
        return {
            id(module)
            for name, module in model.named_modules()
            if name.rsplit(".", 1)[-1].endswith(PER_IMAGE_MODULES)
        }
