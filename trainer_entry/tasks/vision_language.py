"""``vision-language``: images and text in, text out (LLaVA-, Qwen2-VL-style models).

**Model.** ``AutoModelForImageTextToText``; under LoRA a plain ``PeftModel``
(PEFT's adapters on the language model and the tower's linear layers alike,
as ``target_modules`` names them). The model's processor (``AutoProcessor``:
an image processor, a tokenizer, a chat template) makes every batch. A model
built here (``config:llava-1.5-7b``, a folder holding only a config) takes
``tiny-vlm``'s processor unless ``tokenizer_name_or_path`` names one; for a
LLaVA-style model it is made again for the model's image size and patch (336
px in 14-px patches: 576 image tokens), and the model marks images with the
processor's image token. A Qwen2-VL model needs its own processor (its image
tokens follow each image's size): name a folder holding it (without one it is
refused before training).

**Data.** Without ``dataset:``, ``synthetic-shapes``: the image task's
generated pictures (a shape or a pattern over a plain background, with noise;
``dataset_kwargs: {num_images: 256, seed: 0, size: 64}``, ``size`` the side in
pixels), each with a one-turn conversation about it whose answer names what
it shows: images for throughput, not for learning to see. Else a local
JSONL/JSON file or hub dataset whose records hold the images in
``image_field`` (default ``image``: a path relative to the file, a list of
them, a datasets image, ``images`` for TRL's layout) and the conversation in
``messages_field`` (default ``messages``: ``role``/``content`` turns, a
content a string or a list of ``{"type": "image"}`` and ``{"type": "text",
"text": …}`` parts; a text may write the processor's image token where an
image goes, LLaVA's own layout). A conversation without image parts gets one
per image at the start of its first user turn, as TRL puts them; a record
without the image field is text-only. Images are decoded and processed as each
batch is fed (nothing is cached; a hub dataset's image column is read
undecoded), so the step time includes them, as a user's training pays them. A
conversation longer than ``max_seq_len`` is dropped, never cut (a cut through
an image's tokens cannot train); the data record counts them.

**Counts.** A sample is a conversation with its images. A token is a real (not
padding) position of the language model's sequence: tokens/s counts image and
text positions together, and the row also has each apart
(``image_tokens_per_second_global``, ``text_tokens_per_second_global``). Under
``hf`` the loss is on the text (image and padding positions masked); under
``sft`` TRL's vision collator makes the batches and masks padding alone.

**FLOPs.** Counted (``trainer_entry.measure.counted``) along ``images`` (a
conversation's images) and ``text`` (its text tokens), for a model whose
images all have one size (LLaVA's processor resizes them); split by part
(vision tower, projector, language model, head). Qwen2-VL's tower reads each
image's grid, which the meta device cannot: no figure, with a note.

**Memory.** Measured as for every task; not predicted before launch: the model
finds its image positions by the ids' values, which the predicted step (on fake
tensors) does not have.

**Not taken.** Packing (a conversation and its images are one sample),
``completion_only_loss`` and ``pad_to_multiple_of``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from orchestrator.contract.trainers import declared
from trainer_entry.data.collate import (
    COUNTS,
    PADDED_TOKENS,
    REAL_LENGTHS,
    REAL_TOKENS,
    ROW_DIMS,
    input_dtype,
)
from trainer_entry.data.formats import IGNORE_INDEX
from trainer_entry.data.images import (
    SYNTHETIC_CLASSES,
    SYNTHETIC_NAME,
    decoded_image,
    synthetic_image,
)
from trainer_entry.data.sources import LOCAL_SUFFIXES, file_records, load_hub_dataset
from trainer_entry.measure.flops import FlopsUnavailable
from trainer_entry.models.kinds import model_kind
from trainer_entry.settings.parsed import DataConfig, ParsedArguments
from trainer_entry.spec_errors import SpecError
from trainer_entry.tasks.task_protocol import (
    TaskData,
    TaskDefaults,
    refuse_completion_only,
    uncached,
    with_holdout,
)

#: the generated set's version (part of its identity): a change to the texts changes it
SYNTHETIC_VERSION = 1
SYNTHETIC_DEFAULTS = {"num_images": 256, "seed": 0, "size": 64}
#: the generated conversations' questions and answers (``{shape}``: what the image shows)
QUESTIONS = (
    "What is in the picture?",
    "Describe this image.",
    "Which pattern does the image show, and what is behind it?",
    "Look at the image and say what you see.",
)
ANSWERS = (
    "A {shape}.",
    "The picture shows a {shape} over a plain background.",
    "It is a {shape}, drawn in one colour over another, with a little noise on top.",
    "I see a {shape}. The background is a single flat colour, and the noise is faint.",
)


@dataclass
class Conversations:
    """Conversations with their images, each one's image and text positions, and what the
    preparation did."""

    #: per conversation, its images: a path, a datasets image, a PIL image, or a generated
    #: picture's ``{"synthetic": (index, seed, size)}``
    images: list[list[Any]]
    #: per conversation, its turns, each content a list of image and text parts
    messages: list[list[dict[str, Any]]]
    image_tokens: list[int]
    text_tokens: list[int]
    meta: dict[str, Any]
    #: the loss is on the image positions too (TRL's vision collator masks padding alone);
    #: else on the text (this task's collator, under hf)
    images_learnt: bool = False

    def take(self, indices: Sequence[int]) -> Conversations:
        picked = Conversations(
            [self.images[i] for i in indices],
            [self.messages[i] for i in indices],
            [self.image_tokens[i] for i in indices],
            [self.text_tokens[i] for i in indices],
            {},
            self.images_learnt,
        )
        picked.meta = {**self.meta, **picked.counts()}
        return picked

    def counts(self) -> dict[str, Any]:
        images, text = sum(self.image_tokens), sum(self.text_tokens)
        return {
            "sequences": len(self.messages),
            "tokens": images + text,
            "label_tokens": images + text if self.images_learnt else text,
            "counts": {"image_tokens": images, "text_tokens": text},
        }


def _synthetic(cfg: DataConfig) -> tuple[list[tuple[list[Any], list[Any]]], dict[str, Any]]:
    """(images, messages) of the generated set, and its identity."""
    kwargs = {**SYNTHETIC_DEFAULTS, **cfg.dataset_kwargs}
    unknown = sorted(set(kwargs) - set(SYNTHETIC_DEFAULTS))
    if unknown:
        raise SpecError(
            f"dataset_kwargs {', '.join(unknown)} mean nothing to {SYNTHETIC_NAME}; it takes "
            "num_images, seed and size"
        )
    for key, value in kwargs.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise SpecError(f"dataset_kwargs.{key} must be an integer ≥ 0, got {value!r}")
    count, seed, size = kwargs["num_images"], kwargs["seed"], kwargs["size"]
    if count < 2 or size < 8:
        raise SpecError(f"{SYNTHETIC_NAME}: num_images must be at least 2 and size at least 8")
    examples = []
    for i in range(count):
        shape = SYNTHETIC_CLASSES[i % len(SYNTHETIC_CLASSES)].replace("-", " ")
        digest = hashlib.sha256(f"{SYNTHETIC_VERSION}:{seed}:{i}".encode()).digest()
        question, answer = QUESTIONS[digest[0] % len(QUESTIONS)], ANSWERS[digest[1] % len(ANSWERS)]
        messages = [
            {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question}]},
            {
                "role": "assistant",
                "content": [{"type": "text", "text": answer.format(shape=shape)}],
            },
        ]
        examples.append(([{"synthetic": (i, seed, size)}], messages))
    identity = {
        "name": SYNTHETIC_NAME,
        "version": SYNTHETIC_VERSION,
        "conversations": count,
        "seed": seed,
        "size": size,
    }
    return examples, identity


def _text_parts(text: str, image_token: str) -> list[dict[str, Any]]:
    """A text as parts: an image part where it writes the image token (LLaVA's own layout,
    ``"<image>\\nWhat is …"``), the text around it."""
    parts: list[dict[str, Any]] = []
    for i, piece in enumerate(text.split(image_token) if image_token else [text]):
        if i:
            parts.append({"type": "image"})
        if piece:
            parts.append({"type": "text", "text": piece})
    return parts


def _parts(content: Any, where: str, image_token: str) -> list[dict[str, Any]]:
    """A turn's content as a list of image and text parts."""
    if isinstance(content, str):
        return _text_parts(content, image_token)
    if not isinstance(content, list):
        raise SpecError(f"{where}: a turn's content is a string or a list of parts")
    parts: list[dict[str, Any]] = []
    for part in content:
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind == "image":
            parts.append({"type": "image"})
        elif kind == "text" and isinstance(part.get("text"), str):
            parts.extend(_text_parts(part["text"], image_token))
        else:
            raise SpecError(
                f"{where}: a content part is {{'type': 'image'}} or {{'type': 'text', 'text': …}}, "
                f"not {str(part)[:80]}"
            )
    return parts


def conversation(
    messages: Any, images: int, where: str, image_token: str = ""
) -> list[dict[str, Any]]:
    """``messages`` with every content a list of parts, and one image part per image: an
    ``image_token`` written in a text is an image part; a conversation without any gets
    them at the start of its first user turn (as TRL puts them)."""
    if not isinstance(messages, list) or not messages:
        raise SpecError(f"{where}: the conversation is a list of role/content turns")
    turns: list[dict[str, Any]] = []
    for turn in messages:
        if not isinstance(turn, Mapping) or "role" not in turn or "content" not in turn:
            raise SpecError(f"{where}: every turn has a role and a content")
        content = _parts(turn["content"], where, image_token)
        turns.append({"role": str(turn["role"]), "content": content})
    shown = sum(p["type"] == "image" for t in turns for p in t["content"])
    if shown == 0 and images:
        first = next((t for t in turns if t["role"] == "user"), turns[0])
        first["content"] = [{"type": "image"}] * images + first["content"]
    elif shown != images:
        raise SpecError(
            f"{where}: the conversation shows {shown} images but the record has {images}"
        )
    return turns


def _record_images(value: Any) -> list[Any]:
    if value is None:
        return []
    return list(value) if isinstance(value, list | tuple) else [value]


def undecoded(ds: Any, column: str) -> Any:
    """A ``datasets`` dataset whose image column (an image, or a list of them) yields its
    bytes or path rather than a decoded picture: each image is decoded when its batch is
    fed (``picture``), so the set's images are never all in memory at once."""
    import datasets

    features: Any = getattr(ds, "features", None) or {}
    feature = features.get(column)
    if isinstance(feature, datasets.Image):
        return ds.cast_column(column, datasets.Image(decode=False))
    inner = getattr(feature, "feature", None)
    if isinstance(inner, datasets.Image):
        return ds.cast_column(column, type(feature)(datasets.Image(decode=False)))
    return ds


def _records(
    cfg: DataConfig, image_token: str = ""
) -> tuple[list[tuple[list[Any], list[Any]]], dict[str, Any]]:
    """(images, messages) of every record, and the source's identity. ``image_token``: the
    processor's, which a text may write where an image goes."""
    name = cfg.dataset
    if name in (None, SYNTHETIC_NAME):
        return _synthetic(cfg)
    assert name is not None
    path = Path(name).expanduser()
    if path.suffix.lower() in LOCAL_SUFFIXES or path.exists():
        if not path.is_file():
            raise SpecError(f"dataset file not found: {path}")
        records: Sequence[Mapping[str, Any]] = file_records(path)
        identity: dict[str, Any] = {
            "file": path.name,
            "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        }
        folder: Path | None = path.parent
    else:
        hub = load_hub_dataset(name, cfg, besides=f" or {SYNTHETIC_NAME}")
        identity = {
            "name": name,
            "split": cfg.split,
            "fingerprint": getattr(hub, "_fingerprint", None),
        }
        records = undecoded(hub, cfg.image_field)
        folder = None
    if not any(isinstance(r, Mapping) and cfg.image_field in r for r in records):
        raise SpecError(
            f"dataset {name}: no record has the field '{cfg.image_field}' (image_field)"
        )
    out = []
    for n, record in enumerate(records, 1):
        where = f"dataset {name}: record {n}"
        if not isinstance(record, Mapping):
            raise SpecError(f"{where} is not an object with fields")
        if cfg.messages_field not in record:
            raise SpecError(
                f"{where} has no field '{cfg.messages_field}' (messages_field); its fields: "
                f"{', '.join(sorted(map(str, record)))}"
            )
        # a record without images (a text-only turn of a mixed set) has none
        images = _record_images(record.get(cfg.image_field))
        if folder is not None:
            images = [folder / Path(x).expanduser() if isinstance(x, str) else x for x in images]
        turns = conversation(record[cfg.messages_field], len(images), where, image_token)
        out.append((images, turns))
    if not out:
        raise SpecError(f"dataset {name} has no records")
    return out, identity


def picture(value: Any) -> Any:
    """One image as an RGB PIL image: a generated picture's key, a path, a datasets image."""
    from PIL import Image

    if isinstance(value, Mapping) and "synthetic" in value:
        index, seed, size = value["synthetic"]
        pixels, _ = synthetic_image(index, (size, size), 3, seed)
        return Image.fromarray(pixels, mode="RGB")
    image = decoded_image(value)
    if isinstance(image, Image.Image):
        return image.convert("RGB")
    array = np.asarray(image)
    if array.dtype != np.uint8:
        array = np.clip(array * 255.0 if array.max() <= 1.0 else array, 0, 255).astype(np.uint8)
    return Image.fromarray(array).convert("RGB")


def image_token_id(processor: Any) -> int:
    """The id of the token that marks an image's positions in the processor's sequences."""
    found = getattr(processor, "image_token_id", None)
    if not isinstance(found, int):
        raise SpecError(
            "vision-language needs a processor with an image token (image_token_id): set "
            "tokenizer_name_or_path to the model's processor"
        )
    return found


def fitted_processor(processor: Any, config: Any) -> Any:
    """A LLaVA-style processor for ``config``'s image size and patch.

    A model built here takes ``tiny-vlm``'s processor, whose images are 32 px in 4-px
    patches; ``config:llava-1.5-7b`` reads 336 px in 14-px patches. Where they differ,
    the image processor is made again at the model's size (its mean and std kept) and
    the processor counts the model's patches; a checkpoint's own processor already fits.
    """
    vision = getattr(config, "vision_config", None)
    size, patch = getattr(vision, "image_size", None), getattr(vision, "patch_size", None)
    if (
        not isinstance(size, int)
        or not isinstance(patch, int)
        or not hasattr(processor, "patch_size")
    ):
        return processor
    images = processor.image_processor
    crop = getattr(images, "crop_size", None)
    current = (getattr(crop, "height", None), getattr(crop, "width", None))
    if current == (size, size) and processor.patch_size == patch:
        return processor
    processor.image_processor = type(images)(
        size={"shortest_edge": size},
        crop_size={"height": size, "width": size},
        image_mean=images.image_mean,
        image_std=images.image_std,
    )
    processor.patch_size = patch
    strategy = getattr(config, "vision_feature_select_strategy", None)
    if strategy is not None:
        processor.vision_feature_select_strategy = strategy
    return processor


def tokens_per_image(config: Any) -> int | None:
    """A LLaVA-style model's image positions per image (its patches, the class token
    kept under the ``full`` strategy); None for a model whose images vary in size."""
    vision = getattr(config, "vision_config", None)
    size, patch = getattr(vision, "image_size", None), getattr(vision, "patch_size", None)
    if getattr(config, "model_type", None) != "llava" or not isinstance(size, int):
        return None
    if not isinstance(patch, int):
        return None
    full = getattr(config, "vision_feature_select_strategy", "default") == "full"
    return (size // patch) ** 2 + (1 if full else 0)


def count_batch(
    batch: Mapping[str, Any], features: Sequence[Mapping[str, Any]], image_token: int
) -> dict[str, Any]:
    """What a micro-batch of conversations fed (``features``: its examples): real positions,
    image and text apart, the padded rectangle, and each row's images and text positions."""
    ids, mask = batch["input_ids"], batch["attention_mask"].bool()
    images = ((ids == image_token) & mask).sum(dim=1)
    real = mask.sum(dim=1)
    text = real - images
    return {
        REAL_TOKENS: int(real.sum()),
        PADDED_TOKENS: int(ids.numel()),
        REAL_LENGTHS: [int(n) for n in real],
        COUNTS: {"image_tokens": int(images.sum()), "text_tokens": int(text.sum())},
        ROW_DIMS: {"images": [len(f["images"]) for f in features], "text": [int(n) for n in text]},
    }


class ConversationDataset(torch.utils.data.Dataset[dict[str, Any]]):
    """Each conversation with its images decoded (RGB PIL images), as TRL's vision collator
    and ``ConversationCollator`` take them."""

    def __init__(self, data: Conversations) -> None:
        self.data = data

    def __len__(self) -> int:
        return len(self.data.messages)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {
            "images": [picture(x) for x in self.data.images[i]],
            "messages": self.data.messages[i],
        }


def processed(processor: Any, features: Sequence[Mapping[str, Any]]) -> Any:
    """The processor over conversations: their chat template's text and their images,
    right-padded (the template writes the special tokens)."""
    texts = [processor.apply_chat_template(f["messages"], tokenize=False) for f in features]
    images = [image for f in features for image in f["images"]]
    return processor(
        images=images or None,
        text=texts,
        padding=True,
        padding_side="right",
        add_special_tokens=False,
        return_tensors="pt",
    )


@dataclass
class ConversationCollator:
    """The processor over a batch of conversations; labels are the text positions (image
    and padding positions ignored by the loss); and the counts."""

    processor: Any
    image_token: int
    #: the model's weights' dtype, which the pixels are fed in (None: as made)
    dtype: torch.dtype | None = None

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        batch = dict(processed(self.processor, features))
        ids, mask = batch["input_ids"], batch["attention_mask"]
        batch["labels"] = ids.masked_fill((mask == 0) | (ids == self.image_token), IGNORE_INDEX)
        if self.dtype is not None:
            batch = {
                k: v.to(self.dtype) if isinstance(v, torch.Tensor) and v.is_floating_point() else v
                for k, v in batch.items()
            }
        return {**batch, **count_batch(batch, features, self.image_token)}


class VisionLanguageTask(TaskDefaults):
    name = "vision-language"
    sample_unit = "conversations"
    modality = "image-text"
    auto_class = "AutoModelForImageTextToText"
    tokenizer_model: str | None = "tiny-vlm"
    #: the language model's loss (transformers' ForCausalLMLoss) sums over the label tokens
    #: and divides by the item count the trainer passes, as a causal LM's does
    loss_counts_items = True
    flop_dims: tuple[str, ...] = ("images", "text")

    def __init__(self) -> None:
        self._processor: Any = None
        self._image_token: int | None = None
        self._dtype: torch.dtype | None = None

    def prepare(
        self,
        parsed: ParsedArguments,
        processor: Any,
        data_dir: Path,
        *,
        as_given: bool,
        model_config: Any,
    ) -> TaskData:
        cfg = parsed.data
        refuse_completion_only(cfg, self.name, "on the conversation's text")
        if getattr(processor, "image_processor", None) is None or not hasattr(
            processor, "tokenizer"
        ):
            raise SpecError(
                "vision-language needs a processor with an image processor and a tokenizer "
                "(set tokenizer_name_or_path to the model's processor)"
            )
        built = model_kind(parsed.model.name) == "config"
        if built and parsed.model.tokenizer is None and tokens_per_image(model_config) is None:
            raise SpecError(
                f"a {getattr(model_config, 'model_type', '?')} model's image positions follow "
                "each image's size, which tiny-vlm's processor does not know: set "
                "tokenizer_name_or_path to a folder holding the model's own processor"
            )
        processor = fitted_processor(processor, model_config)
        token = image_token_id(processor)
        wanted = getattr(model_config, "image_token_id", None)
        if isinstance(wanted, int) and wanted != token:
            if not built:
                raise SpecError(
                    f"the processor marks images with token {token} but the model with "
                    f"{wanted}: set tokenizer_name_or_path to the model's own processor"
                )
            # built here, its weights drawn at random: which id marks images is the
            # processor's to say (the model reads it from its config as it runs)
            vocab = getattr(getattr(model_config, "text_config", None), "vocab_size", None)
            if isinstance(vocab, int) and token >= vocab:
                raise SpecError(
                    f"the processor's image token {token} is past the model's {vocab} tokens; "
                    "set tokenizer_name_or_path to a processor of its vocabulary"
                )
            model_config.image_token_id = token
        self._processor, self._image_token = processor, token
        self._dtype = input_dtype(model_config)
        examples, identity = _records(cfg, str(getattr(processor, "image_token", "") or ""))
        images: list[list[Any]] = []
        messages: list[list[dict[str, Any]]] = []
        image_tokens: list[int] = []
        text_tokens: list[int] = []
        for pictures, turns in examples:
            # each conversation processed once: its positions (an image's depend on its size)
            one = processed(
                processor, [{"images": [picture(x) for x in pictures], "messages": turns}]
            )
            counted = count_batch(one, [{"images": pictures}], token)
            if counted[REAL_TOKENS] > cfg.max_seq_len:
                continue  # never cut through an image's positions
            images.append(pictures)
            messages.append(turns)
            image_tokens.append(counted[COUNTS]["image_tokens"])
            text_tokens.append(counted[COUNTS]["text_tokens"])
        if not messages:
            raise SpecError(
                f"every conversation is longer than max_seq_len {cfg.max_seq_len} (its image "
                "positions included); raise max_seq_len"
            )
        # TRL's collator (where the backend's library batches the examples) learns every
        # real position
        learnt = declared(parsed.backend).batches_conversations
        data = Conversations(images, messages, image_tokens, text_tokens, {}, learnt)
        data.meta = {
            "source": identity,
            "examples": len(examples),
            "max_seq_len": cfg.max_seq_len,
            "examples_truncated": 0,
            # longer than max_seq_len: dropped whole
            "examples_dropped": len(examples) - len(messages),
            **uncached(as_given),
            **data.counts(),
        }
        # each example is a document: the two parts are disjoint
        return with_holdout(data, len(messages), parsed)

    def dataset(self, data: TaskData) -> torch.utils.data.Dataset[Any]:
        return ConversationDataset(data.examples)

    def collator(self, processor: Any, parsed: ParsedArguments) -> Any:
        if self._processor is None or self._image_token is None:
            raise RuntimeError("the vision-language collator is made after prepare()")
        return ConversationCollator(self._processor, self._image_token, self._dtype)

    def trl_dataset(self, data: TaskData) -> Any:
        """The conversations as the ``datasets.Dataset`` TRL takes: each row's images
        decoded and its turns given as it is read (``ConversationDataset``'s rows)."""
        import datasets

        rows = ConversationDataset(data.examples)

        def decoded(batch: Mapping[str, list[int]]) -> dict[str, list[Any]]:
            read = [rows[i] for i in batch["index"]]
            return {key: [r[key] for r in read] for key in ("images", "messages")}

        return datasets.Dataset.from_dict({"index": list(range(len(rows)))}).with_transform(decoded)

    def count_batch(
        self, batch: Mapping[str, Any], features: Sequence[Mapping[str, Any]]
    ) -> dict[str, Any]:
        """What a batch another collator made (TRL's) fed, as ``collator``'s counts it."""
        if self._image_token is None:
            raise RuntimeError("the vision-language counts are taken after prepare()")
        return count_batch(batch, features, self._image_token)

    def longest(self, parsed: ParsedArguments, model_config: Any) -> dict[str, int] | None:
        # the model finds its image positions by the ids' values (and checks their number
        # against the tower's output), which a step on fake tensors does not have
        raise SpecError(
            "a vision-language model finds its image positions by the values of the token "
            "ids, which the step on fake tensors does not have, so its memory is not predicted"
        )

    def probe_batch(self, model_config: Any, lengths: Mapping[str, int]) -> dict[str, Any]:
        per_image = tokens_per_image(model_config)
        if per_image is None:
            raise FlopsUnavailable(
                f"a {getattr(model_config, 'model_type', '?')} model's image positions follow "
                "each image's size, which the meta device cannot read"
            )
        meta = torch.device("meta")
        images, text = lengths["images"], lengths["text"]
        # the images' positions first, then the text (on meta the values are the shape's)
        ids = torch.ones((1, images * per_image + text), dtype=torch.long, device=meta)
        ids[:, : images * per_image] = int(model_config.image_token_id)
        size = int(model_config.vision_config.image_size)
        channels = int(getattr(model_config.vision_config, "num_channels", 3))
        return {
            "input_ids": ids,
            "pixel_values": torch.ones((images, channels, size, size), device=meta),
            "labels": ids,
        }
