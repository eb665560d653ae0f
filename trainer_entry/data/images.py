"""Labelled images to batches of pixels: the data of the ``image-classification`` task.

Where the images come from:

- ``synthetic-shapes`` (also what a scenario without a ``dataset`` trains on):
  generated, nothing shipped or downloaded. Ten classes of coloured patterns
  (stripes in three directions, a checkerboard, a disc, a square, a triangle,
  a ring, a cross, a gradient), each image drawn from its own seeded random
  generator (colours, position, size, period, pixel noise), so image ``i`` is
  the same on every rank and every run, and it is drawn straight at the size
  the model expects. ``dataset_kwargs`` may set ``num_images`` (default
  1024) and ``seed``.
- a local ``.jsonl``, ``.json`` or ``.csv`` file: the image in
  ``image_field`` (a path, relative to the file's folder, or nested lists of
  pixel values), the class in ``label_field``;
- a Hugging Face datasets name (``uoft-cs/cifar10``: ``image_field: img``,
  ``label_field: label``), read one record at a time from the library's
  memory-mapped copy, never all at once.

A class is an integer (0 to n-1) or a name; names are numbered in sorted
order, and a ``ClassLabel`` column keeps the dataset's own names and order.

Every image becomes a float tensor ``[channels, height, width]`` at the
model's ``image_size`` and ``num_channels`` (grey repeated to colour, an alpha
channel dropped, colour to grey by luminance), scaled to [0, 1], resized
(bilinear, antialiased) and normalised with mean 0.5 and std 0.5 per channel
(the default of ViT's image processor). This happens as each image is fed,
like an on-the-fly transform: the step time includes it. Nothing is cached,
as there is no tokenization to save and the synthetic images take well under
a millisecond each.
"""

from __future__ import annotations

import functools
import hashlib
import io
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from trainer_entry.data.collate import PADDED_TOKENS, REAL_LENGTHS, REAL_TOKENS
from trainer_entry.data.sources import LOCAL_SUFFIXES, file_records, load_hub_dataset
from trainer_entry.settings.parsed import DataConfig
from trainer_entry.spec_errors import SpecError

#: the generated dataset's name (``dataset: synthetic-shapes``)
SYNTHETIC_NAME = "synthetic-shapes"
#: its classes, in label order
SYNTHETIC_CLASSES: tuple[str, ...] = (
    "horizontal-stripes",
    "vertical-stripes",
    "diagonal-stripes",
    "checkerboard",
    "disc",
    "square",
    "triangle",
    "ring",
    "cross",
    "gradient",
)
SYNTHETIC_IMAGES = 1024
SYNTHETIC_SEED = 0
#: part of the source's identity: a change to the drawing changes it
SYNTHETIC_VERSION = 1
#: standard deviation of the pixel noise, in 0-255 units
NOISE = 12.0
#: what every channel is normalised with: ``(x - MEAN) / STD`` on [0, 1] pixels
MEAN, STD = 0.5, 0.5

Size = tuple[int, int]


def image_size(value: Any) -> Size:
    """(height, width) of a config's ``image_size`` or ``patch_size`` (an int or a pair)."""
    if isinstance(value, int):
        return value, value
    if isinstance(value, Sequence) and len(value) == 2:
        return int(value[0]), int(value[1])
    raise SpecError(f"an image size must be an integer or a pair of them, got {value!r}")


# ---------------------------------------------------------------------------
# The generated images
# ---------------------------------------------------------------------------

_Shape = Callable[[np.random.Generator, np.ndarray, np.ndarray], np.ndarray]


def _stripes(direction: str) -> _Shape:
    def draw(rng: np.random.Generator, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        period, phase = rng.uniform(0.15, 0.35), rng.uniform(0.0, 1.0)
        coord = {"h": y, "v": x, "d": (x + y) / math.sqrt(2.0)}[direction]
        stripes: np.ndarray = ((coord / period + phase) % 1.0 < 0.5).astype(np.float32)
        return stripes

    return draw


def _checkerboard(rng: np.random.Generator, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    cells = int(rng.integers(2, 6))
    ox, oy = rng.uniform(0.0, 1.0, 2)
    board: np.ndarray = (np.floor(x * cells + ox) + np.floor(y * cells + oy)) % 2
    return board.astype(np.float32)


def _centre(rng: np.random.Generator, low: float, high: float) -> tuple[float, float, float]:
    cx, cy = rng.uniform(0.3, 0.7, 2)
    return float(cx), float(cy), float(rng.uniform(low, high))


def _disc(rng: np.random.Generator, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    cx, cy, r = _centre(rng, 0.15, 0.3)
    return ((x - cx) ** 2 + (y - cy) ** 2 < r * r).astype(np.float32)


def _square(rng: np.random.Generator, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    cx, cy, r = _centre(rng, 0.12, 0.28)
    return ((np.abs(x - cx) < r) & (np.abs(y - cy) < r)).astype(np.float32)


def _triangle(rng: np.random.Generator, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    cx, cy, r = _centre(rng, 0.15, 0.3)
    top = cy - r  # the apex; the base is at cy + r, as wide as it is high
    return ((y >= top) & (y <= cy + r) & (np.abs(x - cx) <= (y - top) / 2)).astype(np.float32)


def _ring(rng: np.random.Generator, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    cx, cy, r = _centre(rng, 0.2, 0.35)
    d2 = (x - cx) ** 2 + (y - cy) ** 2
    return ((d2 < r * r) & (d2 > (0.55 * r) ** 2)).astype(np.float32)


def _cross(rng: np.random.Generator, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    cx, cy, r = _centre(rng, 0.2, 0.35)
    arm = 0.3 * r
    dx, dy = np.abs(x - cx), np.abs(y - cy)
    return (((dx < arm) & (dy < r)) | ((dy < arm) & (dx < r))).astype(np.float32)


def _gradient(rng: np.random.Generator, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    angle = rng.uniform(0.0, 2 * math.pi)
    coord = x * math.cos(angle) + y * math.sin(angle)
    span = float(coord.max() - coord.min())
    return ((coord - coord.min()) / span if span > 0 else np.zeros_like(coord)).astype(np.float32)


_SHAPES: tuple[_Shape, ...] = (
    _stripes("h"),
    _stripes("v"),
    _stripes("d"),
    _checkerboard,
    _disc,
    _square,
    _triangle,
    _ring,
    _cross,
    _gradient,
)
assert len(_SHAPES) == len(SYNTHETIC_CLASSES)


def synthetic_image(
    index: int, size: Size, channels: int, seed: int = SYNTHETIC_SEED
) -> tuple[np.ndarray, int]:
    """Image ``index`` of the generated set, ``uint8 [height, width, channels]``, and its class.

    The classes take turns (``index % 10``); everything else is drawn from a
    generator seeded with ``(seed, index)``.
    """
    label = index % len(SYNTHETIC_CLASSES)
    rng = np.random.default_rng([seed, index])
    background = rng.uniform(0.0, 255.0, channels).astype(np.float32)
    # every channel at least 80 levels away from the background's
    foreground = (background + rng.uniform(80.0, 176.0, channels).astype(np.float32)) % 256.0
    h, w = size
    # pixel centres in [0, 1]: a row and a column, broadcast to the image by the shapes
    x = ((np.arange(w, dtype=np.float32) + 0.5) / w)[None, :]
    y = ((np.arange(h, dtype=np.float32) + 0.5) / h)[:, None]
    mask = np.broadcast_to(_SHAPES[label](rng, x, y), (h, w))[..., None]
    pixels = background + (foreground - background) * mask
    oy, ox = int(rng.integers(0, h)), int(rng.integers(0, w))
    pixels += _noise(size, channels, seed)[oy : oy + h, ox : ox + w]
    return np.clip(pixels, 0.0, 255.0).astype(np.uint8), label


@functools.lru_cache(maxsize=4)
def _noise(size: Size, channels: int, seed: int) -> np.ndarray:
    """Pixel noise twice the image's size; each image adds its own window of it.

    Drawing fresh noise for every image would take most of an image's time
    at 224 × 224; a window at a random offset costs a slice.
    """
    h, w = size
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(1,)))
    noise = rng.standard_normal((2 * h, 2 * w, channels), dtype=np.float32) * NOISE
    noise.flags.writeable = False
    return noise


# ---------------------------------------------------------------------------
# Sources of labelled images
# ---------------------------------------------------------------------------


class ImageSource(Protocol):
    #: what the result's data record names as the source
    identity: dict[str, Any]
    #: the class names; a label is an index into them
    classes: list[str]

    def __len__(self) -> int: ...

    def item(self, index: int, size: Size, channels: int) -> tuple[Any, int]:
        """Image ``index`` as stored (any form ``to_pixels`` reads) and its label.

        ``size`` and ``channels`` are the model's: a generated image is drawn
        at them; a stored one is returned as it is.
        """
        ...


@dataclass
class SyntheticImages:
    count: int = SYNTHETIC_IMAGES
    seed: int = SYNTHETIC_SEED

    def __post_init__(self) -> None:
        self.classes = list(SYNTHETIC_CLASSES)
        self.identity = {
            "name": SYNTHETIC_NAME,
            "version": SYNTHETIC_VERSION,
            "images": self.count,
            "seed": self.seed,
        }

    def __len__(self) -> int:
        return self.count

    def item(self, index: int, size: Size, channels: int) -> tuple[Any, int]:
        return synthetic_image(index, size, channels, self.seed)


def _numbered(values: Sequence[Any], where: str, field: str) -> tuple[list[str], list[int]]:
    """(class names, each value's label) for a column of classes: integers or names."""
    if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        negative = [v for v in values if v < 0]
        if negative:
            raise SpecError(f"{where}: label_field '{field}' has a negative class {negative[0]}")
        return [str(i) for i in range(max(values) + 1)], [int(v) for v in values]
    if all(isinstance(v, str) for v in values):
        names = sorted(set(values))
        number = {name: i for i, name in enumerate(names)}
        return names, [number[v] for v in values]
    odd = [v for v in values if isinstance(v, bool) or not isinstance(v, str | int)]
    what = f"holds {odd[0]!r}" if odd else "mixes integers and names"
    raise SpecError(f"{where}: label_field '{field}' {what}; a class is an integer or a name")


class RecordImages:
    """The records of a local file: an image (or its path) and a class in each."""

    def __init__(self, path: Path, cfg: DataConfig, identity: dict[str, Any]) -> None:
        records = file_records(path)
        if not records:
            raise SpecError(f"dataset {path} has no records")
        where = f"dataset {path}"
        for n, record in enumerate(records, 1):
            if not isinstance(record, dict):
                raise SpecError(f"{where}: record {n} is not an object with fields")
            for field in (cfg.image_field, cfg.label_field):
                if field not in record:
                    what = "image_field" if field == cfg.image_field else "label_field"
                    raise SpecError(
                        f"{where}: record {n} has no field '{field}' ({what}); "
                        f"its fields: {', '.join(sorted(record))}"
                    )
        values = [r[cfg.label_field] for r in records]
        csv = path.suffix.lower() == ".csv"  # every CSV value is text: classes may be numbers
        if csv and all(isinstance(v, str) and v.strip().lstrip("-").isdigit() for v in values):
            values = [int(v) for v in values]
        self.classes, self._labels = _numbered(values, where, cfg.label_field)
        self._images = [r[cfg.image_field] for r in records]
        self._folder = path.parent
        self.identity = identity

    def __len__(self) -> int:
        return len(self._images)

    def item(self, index: int, size: Size, channels: int) -> tuple[Any, int]:
        image = self._images[index]
        if isinstance(image, str):
            image = self._folder / Path(image).expanduser()
        return image, self._labels[index]


class HubImages:
    """A Hugging Face dataset, read (and its images decoded) one record at a time."""

    def __init__(self, name: str, cfg: DataConfig) -> None:
        ds = load_hub_dataset(name, cfg, besides=f" or {SYNTHETIC_NAME}")
        import datasets  # loaded by now

        where = f"dataset '{name}' (split {cfg.split})"
        for field, what in ((cfg.image_field, "image_field"), (cfg.label_field, "label_field")):
            if field not in ds.column_names:
                raise SpecError(
                    f"{where} has no column '{field}' ({what}); its columns: "
                    f"{', '.join(ds.column_names)}"
                )
        if len(ds) == 0:
            raise SpecError(f"{where} has no records")
        feature = ds.features[cfg.label_field]
        if isinstance(feature, datasets.ClassLabel):
            self.classes = list(feature.names)
            self._labels: list[int] | None = None  # the column holds the labels
        else:
            self.classes, self._labels = _numbered(ds[cfg.label_field], where, cfg.label_field)
        self._ds = ds
        self._image_field, self._label_field = cfg.image_field, cfg.label_field
        self.identity = {
            "name": name,
            "split": cfg.split,
            "fingerprint": getattr(ds, "_fingerprint", None),
        }

    def __len__(self) -> int:
        return len(self._ds)

    def item(self, index: int, size: Size, channels: int) -> tuple[Any, int]:
        record = self._ds[index]
        label = record[self._label_field] if self._labels is None else self._labels[index]
        return record[self._image_field], int(label)


def open_images(cfg: DataConfig) -> ImageSource:
    """The labelled images ``cfg`` names (``synthetic-shapes`` when it names none)."""
    name = cfg.dataset
    if name is None or name == SYNTHETIC_NAME:
        extra = dict(cfg.dataset_kwargs)
        count, seed = extra.pop("num_images", SYNTHETIC_IMAGES), extra.pop("seed", SYNTHETIC_SEED)
        if extra:
            raise SpecError(
                f"dataset_kwargs {', '.join(sorted(extra))} mean nothing to {SYNTHETIC_NAME}; "
                "it takes num_images and seed"
            )
        for key, value in (("num_images", count), ("seed", seed)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise SpecError(f"dataset_kwargs.{key} must be an integer ≥ 0, got {value!r}")
        if count == 0:
            raise SpecError(f"dataset_kwargs.num_images must be at least 1 for {SYNTHETIC_NAME}")
        return SyntheticImages(count, seed)
    path = Path(name).expanduser()
    if path.suffix.lower() in LOCAL_SUFFIXES or path.exists():
        if not path.is_file():
            raise SpecError(f"dataset file not found: {path}")
        identity = {"file": path.name, "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
        return RecordImages(path, cfg, identity)
    return HubImages(name, cfg)


# ---------------------------------------------------------------------------
# Pixels
# ---------------------------------------------------------------------------


def decoded_image(image: Any) -> Any:
    """A path, or a datasets image record (``bytes``/``path``), opened as a PIL image."""
    from PIL import Image

    if isinstance(image, dict) and ("bytes" in image or "path" in image):
        image = io.BytesIO(image["bytes"]) if image.get("bytes") else image.get("path")
    if isinstance(image, str | Path | io.BytesIO):
        try:
            with Image.open(image) as opened:
                opened.load()
                return opened.copy()
        except (OSError, ValueError) as exc:
            raise SpecError(f"image {image!s:.200} could not be read: {exc}") from None
    return image


def to_pixels(image: Any, size: Size | None, channels: int, *, normalise: bool) -> torch.Tensor:
    """One image as ``float32 [channels, height, width]``: [0, 1], resized to ``size``
    (None: kept as it is), then normalised when asked.

    Reads a PIL image, a path, a datasets image record, a numpy array, a tensor
    or nested lists: ``[h, w]``, ``[h, w, c]`` or ``[c, h, w]``. Integer pixels
    are 0-255; float pixels are taken to be in [0, 1] already.
    """
    from PIL import Image

    image = decoded_image(image)
    if isinstance(image, Image.Image):
        if image.mode not in ("L", "RGB", "RGBA"):
            image = image.convert("RGBA" if "A" in image.getbands() else "RGB")
        array = np.asarray(image)
    elif isinstance(image, torch.Tensor):
        array = image.detach().cpu().numpy()
    else:
        try:
            array = np.asarray(image)
        except (ValueError, TypeError):
            raise SpecError(
                f"an image could not be read as pixels: {type(image).__name__}"
            ) from None
    if array.dtype == object or array.ndim not in (2, 3) or array.size == 0:
        raise SpecError(
            f"an image must be [h, w], [h, w, c] or [c, h, w] pixels; got {type(image).__name__} "
            f"of shape {getattr(array, 'shape', '?')}"
        )
    if array.dtype == np.bool_ or np.issubdtype(array.dtype, np.integer):
        tensor = torch.from_numpy(array.astype(np.float32) / 255.0)
    elif np.issubdtype(array.dtype, np.floating):
        tensor = torch.from_numpy(array.astype(np.float32))
    else:
        raise SpecError(f"image pixels of type {array.dtype} are not numbers")
    axes = (1, 3, 4)  # grey, colour, colour with alpha
    if tensor.ndim == 2:
        tensor = tensor[None]
    elif tensor.shape[-1] in axes and tensor.shape[0] not in axes:
        tensor = tensor.permute(2, 0, 1)  # [h, w, c] -> [c, h, w]
    elif tensor.shape[0] not in axes:
        raise SpecError(f"an image of shape {tuple(array.shape)} has no channel axis of 1, 3 or 4")
    tensor = _channels(tensor, channels)
    if size is not None and tuple(tensor.shape[1:]) != size:
        tensor = torch.nn.functional.interpolate(
            tensor[None], size=size, mode="bilinear", align_corners=False, antialias=True
        )[0]
    if normalise:
        tensor = (tensor - MEAN) / STD
    return tensor.contiguous()


def _channels(tensor: torch.Tensor, channels: int) -> torch.Tensor:
    have = tensor.shape[0]
    if have == 4 and channels != 4:  # RGBA: the alpha channel is not part of the image
        tensor, have = tensor[:3], 3
    if have == channels:
        return tensor
    if have == 1:
        return tensor.expand(channels, -1, -1)
    if have == 3 and channels == 1:
        weights = torch.tensor([0.299, 0.587, 0.114]).view(3, 1, 1)
        return (tensor * weights).sum(0, keepdim=True)
    raise SpecError(f"an image with {have} channels cannot feed a model of {channels}")


# ---------------------------------------------------------------------------
# What a trainer iterates
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ImageExamples:
    """A task's prepared images: the source and what each image becomes."""

    source: ImageSource
    #: the model's (height, width) and channels
    size: Size
    channels: int
    #: False: as stored (``no_data_processing``): not resized, not normalised
    processed: bool = True
    #: the source's images these examples are (``eval: true`` splits them,
    #: ``trainer_entry.data.holdout``); None: every one
    indices: tuple[int, ...] | None = None


class ImageDataset(torch.utils.data.Dataset[dict[str, Any]]):
    def __init__(self, examples: ImageExamples) -> None:
        self.examples = examples

    def __len__(self) -> int:
        ex = self.examples
        return len(ex.source) if ex.indices is None else len(ex.indices)

    def __getitem__(self, i: int) -> dict[str, Any]:
        ex = self.examples
        if ex.indices is not None:
            i = ex.indices[i]
        image, label = ex.source.item(i, ex.size, ex.channels)
        pixels = to_pixels(
            image, ex.size if ex.processed else None, ex.channels, normalise=ex.processed
        )
        if tuple(pixels.shape[1:]) != ex.size:
            raise SpecError(
                f"image {i} is {pixels.shape[2]}x{pixels.shape[1]} pixels; the model takes "
                f"{ex.size[1]}x{ex.size[0]} (no_data_processing does not resize)"
            )
        return {"pixel_values": pixels, "labels": label}


@dataclass
class ImageCollator:
    """Stacks images into ``pixel_values`` and says how many encoder positions they fed.

    Every image is ``positions`` tokens (its patches and the class token), none
    of them padding: ``num_real_tokens`` = ``num_padded_tokens`` = images ×
    positions, ``real_lengths`` = ``positions`` per image. ``dtype``: what the
    pixels are cast to (the model's weights' dtype, as the patch embedding
    takes its input unconverted).
    """

    positions: int
    dtype: torch.dtype | None = None

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        pixels = torch.stack([f["pixel_values"] for f in features])
        if self.dtype is not None:
            pixels = pixels.to(self.dtype)
        n = len(features)
        return {
            "pixel_values": pixels,
            "labels": torch.tensor([int(f["labels"]) for f in features], dtype=torch.long),
            REAL_TOKENS: n * self.positions,
            PADDED_TOKENS: n * self.positions,
            REAL_LENGTHS: [self.positions] * n,
        }
