"""The image-classification task: generated images, pixels, the tiny ViT, counts and FLOPs.

FLOPs are checked against PyTorch's FLOP counter on real training steps
(forward and backward of the cross-entropy loss) for the tiny ViT and for
every shipped ViT architecture (``model_type: vit``, e.g.
``vit-base-patch16-224``) shrunk to two layers at a small image size, its
layers, patch size and head otherwise as shipped.
"""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.flop_counter import FlopCounterMode

from orchestrator.contract.result import DataRecord
from orchestrator.contract.spec import RunSpec
from trainer_entry.data.collate import PADDED_TOKENS, REAL_LENGTHS, REAL_TOKENS, pop_counts
from trainer_entry.data.images import (
    MEAN,
    STD,
    SYNTHETIC_CLASSES,
    ImageCollator,
    open_images,
    synthetic_image,
    to_pixels,
)
from trainer_entry.measure.flops import estimate_flops
from trainer_entry.measure.recompute import Recomputed
from trainer_entry.measure.steps import SequenceLengths
from trainer_entry.models import tiny_vit
from trainer_entry.models.kinds import model_kind
from trainer_entry.models.load import ARCHITECTURES, load_model, shipped_architectures
from trainer_entry.run.parse import DataConfig, ModelConfig, PeftConfig, parse_arguments
from trainer_entry.spec_errors import SpecError
from trainer_entry.tasks import get_task
from trainer_entry.tasks.image_classification import (
    ImageClassificationTask,
    encoder_positions,
)

TASK = "image-classification"
VIT_ARCHITECTURES = [
    name
    for name in shipped_architectures()
    if json.loads((ARCHITECTURES / f"{name}.json").read_text())["model_type"] == "vit"
]


def _parsed(**arguments):
    spec = RunSpec.model_validate(
        {"arguments": {"model_name_or_path": "tiny-vit", "task": TASK, **arguments}}
    )
    return parse_arguments(spec, check_names=False)


def _load(parsed, peft: PeftConfig | None = None, attn: str | None = None):
    task = get_task(TASK)
    model = (
        parsed.model
        if attn is None
        else ModelConfig(name=parsed.model.name, attn_implementation=attn)
    )
    loaded = load_model(
        model,
        peft or PeftConfig(),
        on_gpu=False,
        local_rank=0,
        task=task,
        task_kwargs=task.model_kwargs(parsed),
    )
    return task, loaded


def _batch(task, parsed, loaded, n: int, tmp_path: Path):
    data = task.prepare(
        parsed, loaded.tokenizer, tmp_path, as_given=False, model_config=loaded.model.config
    )
    dataset = task.dataset(data)
    return data, task.collator(loaded.tokenizer, parsed)([dataset[i] for i in range(n)])


# ---------------------------------------------------------------------------
# The generated images
# ---------------------------------------------------------------------------


def test_generated_images_are_deterministic_at_any_size() -> None:
    for size in [(32, 32), (8, 8), (224, 224), (24, 40)]:
        a, label = synthetic_image(13, size, 3)
        b, again = synthetic_image(13, size, 3)
        assert a.shape == (*size, 3) and a.dtype == np.uint8
        assert np.array_equal(a, b) and label == again == 13 % len(SYNTHETIC_CLASSES)
    grey, _ = synthetic_image(13, (16, 16), 1)
    assert grey.shape == (16, 16, 1)
    # another index, another seed: other pixels
    assert not np.array_equal(
        synthetic_image(13, (32, 32), 3)[0], synthetic_image(23, (32, 32), 3)[0]
    )
    assert not np.array_equal(
        synthetic_image(13, (32, 32), 3, seed=1)[0], synthetic_image(13, (32, 32), 3, seed=2)[0]
    )


def test_the_classes_take_turns_and_differ_in_shape() -> None:
    images = [synthetic_image(i, (32, 32), 3) for i in range(40)]
    assert [label for _, label in images] == [i % 10 for i in range(40)]
    # the two colours of an image are far apart: its pattern stands out of the noise
    for pixels, label in images:
        if SYNTHETIC_CLASSES[label] != "gradient":
            spread = pixels.reshape(-1, 3).astype(float).std(axis=0).max()
            assert spread > 20, SYNTHETIC_CLASSES[label]
    # horizontal stripes vary down the image, vertical ones across it
    rows, _ = synthetic_image(0, (64, 64), 1)
    cols, _ = synthetic_image(1, (64, 64), 1)
    assert rows[:, :, 0].astype(float).mean(1).std() > 4 * rows[:, :, 0].astype(float).mean(0).std()
    assert cols[:, :, 0].astype(float).mean(0).std() > 4 * cols[:, :, 0].astype(float).mean(1).std()


def test_the_synthetic_set_takes_its_size_and_seed_and_refuses_other_options() -> None:
    images = open_images(
        DataConfig(dataset="synthetic-shapes", dataset_kwargs={"num_images": 7, "seed": 3})
    )
    assert len(images) == 7 and images.classes == list(SYNTHETIC_CLASSES)
    assert images.identity == {"name": "synthetic-shapes", "version": 1, "images": 7, "seed": 3}
    assert len(open_images(DataConfig())) == 1024  # no dataset: the synthetic set
    with pytest.raises(SpecError, match="data_files mean nothing to synthetic-shapes"):
        open_images(DataConfig(dataset_kwargs={"data_files": "x"}))
    with pytest.raises(SpecError, match="num_images must be an integer"):
        open_images(DataConfig(dataset_kwargs={"num_images": "many"}))


# ---------------------------------------------------------------------------
# Pixels
# ---------------------------------------------------------------------------


def test_every_stored_form_becomes_the_same_pixels() -> None:
    rgb, _ = synthetic_image(4, (12, 10), 3)
    expected = torch.from_numpy(rgb).permute(2, 0, 1).float() / 255
    pil = Image.fromarray(rgb)
    buffer = io.BytesIO()
    pil.save(buffer, format="PNG")
    forms = {
        "pil": pil,
        "hwc": rgb,
        "chw": rgb.transpose(2, 0, 1),
        "lists": rgb.tolist(),
        "float": rgb.astype(np.float32) / 255,
        "tensor": torch.from_numpy(rgb),
        "datasets record": {"bytes": buffer.getvalue(), "path": None},
        "rgba": Image.fromarray(np.concatenate([rgb, np.full((12, 10, 1), 7, np.uint8)], -1)),
    }
    for name, form in forms.items():
        pixels = to_pixels(form, None, 3, normalise=False)
        assert pixels.dtype == torch.float32 and torch.allclose(pixels, expected, atol=1e-6), name


def test_pixels_are_resized_normalised_and_given_the_models_channels() -> None:
    grey = np.linspace(0, 255, 8 * 8).reshape(8, 8).astype(np.uint8)
    pixels = to_pixels(grey, (32, 32), 3, normalise=True)
    assert pixels.shape == (3, 32, 32)
    assert torch.equal(pixels[0], pixels[2])  # grey repeated to colour
    assert pixels.min() >= (0 - MEAN) / STD and pixels.max() <= (1 - MEAN) / STD
    assert pixels.mean().item() == pytest.approx((grey.mean() / 255 - MEAN) / STD, abs=0.02)
    colour, _ = synthetic_image(5, (16, 16), 3)
    assert to_pixels(colour, (16, 16), 1, normalise=False).shape == (1, 16, 16)
    with pytest.raises(SpecError, match="no channel axis"):
        to_pixels(np.zeros((5, 6, 7)), None, 3, normalise=False)
    with pytest.raises(SpecError, match="could not be read"):
        to_pixels("/nonexistent/picture.png", None, 3, normalise=False)


# ---------------------------------------------------------------------------
# Files and datasets
# ---------------------------------------------------------------------------


def _write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_a_local_file_with_image_paths_and_class_names(tmp_path) -> None:
    (tmp_path / "pics").mkdir()
    records = []
    for i, name in enumerate(["owl", "cat", "owl", "bee"]):
        Image.fromarray(synthetic_image(i, (20, 20), 3)[0]).save(tmp_path / "pics" / f"{i}.png")
        records.append({"picture": f"pics/{i}.png", "kind": name})
    path = _write_jsonl(tmp_path / "images.jsonl", records)
    images = open_images(DataConfig(dataset=str(path), image_field="picture", label_field="kind"))
    assert images.classes == ["bee", "cat", "owl"]  # names numbered in sorted order
    assert [images.item(i, (32, 32), 3)[1] for i in range(4)] == [2, 1, 2, 0]
    assert images.identity["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    image, _ = images.item(3, (32, 32), 3)
    assert torch.equal(
        to_pixels(image, None, 3, normalise=False),
        to_pixels(synthetic_image(3, (20, 20), 3)[0], None, 3, normalise=False),
    )


def test_a_csv_file_with_integer_classes_and_pixel_lists(tmp_path) -> None:
    path = tmp_path / "images.csv"
    path.write_text("image,label\nimg0.png,2\nimg1.png,0\n")
    for i in range(2):
        Image.fromarray(synthetic_image(i, (8, 8), 3)[0]).save(tmp_path / f"img{i}.png")
    images = open_images(DataConfig(dataset=str(path)))
    assert images.classes == ["0", "1", "2"]
    assert [images.item(i, (8, 8), 3)[1] for i in range(2)] == [2, 0]


@pytest.mark.parametrize(
    ("records", "message"),
    [
        (
            [{"image": [[0]], "labels": 1}],
            "record 1 has no field 'label' \\(label_field\\); its fields: image, labels",
        ),
        ([{"img": [[0]], "label": 1}], "record 1 has no field 'image' \\(image_field\\)"),
        (
            [{"image": [[0]], "label": 1}, {"image": [[0]], "label": "cat"}],
            "mixes integers and names",
        ),
        ([{"image": [[0]], "label": 1.5}], "holds 1.5"),
        ([{"image": [[0]], "label": -1}], "negative class -1"),
    ],
)
def test_bad_records_are_one_line(tmp_path, records, message) -> None:
    path = _write_jsonl(tmp_path / "bad.jsonl", records)
    with pytest.raises(SpecError, match=message) as info:
        open_images(DataConfig(dataset=str(path)))
    assert "\n" not in str(info.value)


def test_a_datasets_dataset_like_cifar10(tmp_path) -> None:
    """``img`` images and a ``ClassLabel`` column, read through ``datasets.load_dataset``."""
    import datasets

    names = ["airplane", "automobile", "bird"]
    pictures = [Image.fromarray(synthetic_image(i, (32, 32), 3)[0]) for i in range(6)]
    features = datasets.Features(
        {"img": datasets.Image(), "label": datasets.ClassLabel(names=names)}
    )
    datasets.Dataset.from_dict(
        {"img": pictures, "label": [2, 0, 1, 2, 1, 0]}, features=features
    ).to_parquet(str(tmp_path / "train.parquet"))
    cfg = DataConfig(
        dataset="parquet",
        image_field="img",
        label_field="label",
        dataset_kwargs={
            "data_files": str(tmp_path / "train.parquet"),
            "cache_dir": str(tmp_path / "hf"),
        },
    )
    images = open_images(cfg)
    assert images.classes == names and len(images) == 6
    image, label = images.item(3, (224, 224), 3)
    assert label == 2
    assert torch.equal(
        to_pixels(image, None, 3, normalise=False),
        to_pixels(synthetic_image(3, (32, 32), 3)[0], None, 3, normalise=False),
    )
    with pytest.raises(
        SpecError, match="has no column 'image' \\(image_field\\); its columns: img, label"
    ):
        open_images(DataConfig(dataset="parquet", dataset_kwargs=cfg.dataset_kwargs))


# ---------------------------------------------------------------------------
# The tiny ViT
# ---------------------------------------------------------------------------


def test_tiny_vit_build_is_deterministic_and_registered(tmp_path) -> None:
    tiny_vit.build(tmp_path / "a")
    tiny_vit.build(tmp_path / "b")
    digest = {
        side: {
            p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in (tmp_path / side).iterdir()
        }
        for side in "ab"
    }
    assert digest["a"] == digest["b"] and set(digest["a"]) == {"config.json", "model.safetensors"}
    assert model_kind("tiny-vit") == "tiny"
    path = tiny_vit.ensure_tiny_vit()
    assert tiny_vit.is_complete(path) and path.name.startswith("tiny-vit-")
    assert tiny_vit.ensure_tiny_vit() == path  # built once


def test_tiny_vit_loads_without_a_tokenizer_and_learns_a_step(tmp_path) -> None:
    parsed = _parsed(dataset_kwargs={"num_images": 8})
    task, loaded = _load(parsed)
    model = loaded.model
    assert loaded.tokenizer is None
    assert type(model).__name__ == "ViTForImageClassification"
    assert model.config.id2label == dict(enumerate(SYNTHETIC_CLASSES))
    assert loaded.info["total_params"] < 400_000
    _, batch = _batch(task, parsed, loaded, 8, tmp_path)
    pop_counts(batch)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model.train()
    losses = []
    for _ in range(3):
        loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0]


def test_the_head_follows_the_datas_classes(tmp_path) -> None:
    path = _write_jsonl(
        tmp_path / "three.jsonl",
        [
            {"image": synthetic_image(i, (32, 32), 3)[0].tolist(), "label": n}
            for i, n in enumerate("abcab")
        ],
    )
    parsed = _parsed(dataset=str(path))
    task, loaded = _load(parsed)
    assert loaded.model.classifier.out_features == 3
    assert loaded.model.config.label2id == {"a": 0, "b": 1, "c": 2}
    # a config: model takes the labels into its config; no from_pretrained option is set on it
    config_kwargs = get_task(TASK).model_kwargs(
        _parsed(dataset=str(path), model_name_or_path="config:x")
    )
    assert "ignore_mismatched_sizes" not in config_kwargs and config_kwargs["num_labels"] == 3
    _, batch = _batch(task, parsed, loaded, 5, tmp_path)
    assert batch["labels"].tolist() == [0, 1, 2, 0, 1]


# ---------------------------------------------------------------------------
# Positions, counts, the data record
# ---------------------------------------------------------------------------


def _shrunk_config(name: str, tmp_path: Path, image: int = 64, layers: int = 2) -> str:
    """``config:<path>`` of a shipped architecture at two layers and a small image size."""
    config = json.loads((ARCHITECTURES / f"{name}.json").read_text())
    config.update(num_hidden_layers=layers, image_size=image)
    path = tmp_path / f"{name}-shrunk.json"
    path.write_text(json.dumps(config))
    return f"config:{path}"


def _sequence_length(model, config) -> int:
    pixels = torch.zeros(1, config.num_channels, config.image_size, config.image_size)
    with torch.no_grad():
        return model(pixel_values=pixels, output_hidden_states=True).hidden_states[-1].shape[1]


@pytest.mark.parametrize("name", ["tiny-vit", *VIT_ARCHITECTURES, "deit"])
def test_positions_are_the_encoders_sequence_length(name, tmp_path) -> None:
    from transformers import AutoModelForImageClassification, DeiTConfig

    if name == "deit":  # patches, the class token and the distillation token
        config = DeiTConfig(
            image_size=32,
            patch_size=8,
            hidden_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=64,
            architectures=["DeiTForImageClassification"],
        )
        model = AutoModelForImageClassification.from_config(config)
        assert encoder_positions(config) == 16 + 2
    else:
        model_name = name if name == "tiny-vit" else _shrunk_config(name, tmp_path)
        _, loaded = _load(_parsed(model_name_or_path=model_name))
        model, config = loaded.model, loaded.model.config
        patches = (config.image_size // config.patch_size) ** 2
        assert encoder_positions(config) == patches + 1
    assert encoder_positions(config) == _sequence_length(model, config)


def test_other_image_models_are_refused_in_one_line() -> None:
    from transformers import ConvNextConfig

    with pytest.raises(SpecError, match="model_type vit, deit\\); this model is 'convnext'"):
        encoder_positions(ConvNextConfig())


def test_the_collator_counts_positions_and_the_record_says_what_was_prepared(tmp_path) -> None:
    parsed = _parsed(dataset_kwargs={"num_images": 10})
    task, loaded = _load(parsed)
    data, batch = _batch(task, parsed, loaded, 3, tmp_path)
    positions = (32 // 4) ** 2 + 1  # tiny-vit: 4×4 patches of a 32×32 image, and the class token
    assert batch[REAL_TOKENS] == batch[PADDED_TOKENS] == 3 * positions
    assert batch[REAL_LENGTHS] == [positions] * 3
    assert (
        batch["pixel_values"].shape == (3, 3, 32, 32)
        and batch["pixel_values"].dtype == torch.float32
    )
    assert batch["labels"].tolist() == [0, 1, 2]
    record = DataRecord.model_validate(data.meta)
    assert (record.examples, record.sequences, record.tokens, record.label_tokens) == (
        10,
        10,
        10 * positions,
        10,
    )
    assert record.source["name"] == "synthetic-shapes" and record.cache_hit is None
    # the counts ride along as plain ints, never reaching the model
    counts = pop_counts(batch)
    assert (counts.real, counts.lengths) == (3 * positions, [positions] * 3)
    assert set(batch) == {"pixel_values", "labels"}


def test_pixels_are_cast_to_the_weights_dtype() -> None:
    features = [{"pixel_values": torch.zeros(3, 4, 4), "labels": 1}]
    assert ImageCollator(5, torch.bfloat16)(features)["pixel_values"].dtype == torch.bfloat16
    task = ImageClassificationTask()
    with pytest.raises(RuntimeError, match="after prepare"):
        task.collator(None, _parsed())


def test_as_given_images_are_neither_resized_nor_normalised(tmp_path) -> None:
    right = _write_jsonl(
        tmp_path / "right.jsonl",
        [{"image": synthetic_image(0, (32, 32), 3)[0].tolist(), "label": 0}],
    )
    wrong = _write_jsonl(
        tmp_path / "wrong.jsonl",
        [{"image": synthetic_image(0, (16, 16), 3)[0].tolist(), "label": 0}],
    )
    parsed = _parsed(dataset=str(right))
    task, loaded = _load(parsed)
    data = task.prepare(parsed, None, tmp_path, as_given=True, model_config=loaded.model.config)
    assert data.meta["processing"] == "none"
    pixels = task.dataset(data)[0]["pixel_values"]
    assert pixels.min() >= 0 and torch.equal(
        pixels, to_pixels(synthetic_image(0, (32, 32), 3)[0], None, 3, normalise=False)
    )
    parsed = _parsed(dataset=str(wrong))
    task, loaded = _load(parsed)
    with pytest.raises(SpecError, match="image 0 is 16x16 pixels; the model takes 32x32"):
        task.prepare(parsed, None, tmp_path, as_given=True, model_config=loaded.model.config)
    # processed, the same image is resized
    assert task.prepare(parsed, None, tmp_path, as_given=False, model_config=loaded.model.config)


# ---------------------------------------------------------------------------
# FLOPs against the counter
# ---------------------------------------------------------------------------

LORA = PeftConfig(method="lora", r=8, target_modules=["q_proj", "v_proj"])


def _known_excess(config, lora: bool) -> float:
    """What the formula counts per token that a training step does not do.

    - The patch embedding (a convolution) is counted once per position; it
      runs once per patch (not for the class token). Its input gradient is
      not counted: the pixels need none.
    - Under LoRA nothing below the first layer trains, so its projections
      (and the adapters on them) need no input gradient, and with no adapter
      on ``k_proj`` its keys need no gradient in attention either.
    """
    h, channels = config.hidden_size, config.num_channels
    patch, image = config.patch_size, config.image_size
    weight = h * channels * patch * patch
    patches = (image // patch) ** 2
    positions = patches + 1
    unused_position = 1 - patches / positions
    if not lora:
        return 4 * weight * unused_position  # forward and weight gradient
    first_layer = 3 * 2 * h * h + 2 * 2 * h * LORA.r + 2 * h * positions
    return 2 * weight * unused_position + first_layer  # frozen: forward only


def _check_flops(model, positions: int) -> tuple[float, float]:
    config = model.config
    pixels = torch.randn(2, config.num_channels, config.image_size, config.image_size)
    labels = torch.tensor([1, 0])
    model.train()
    with FlopCounterMode(display=False) as counter:
        model(pixel_values=pixels, labels=labels).loss.backward()
    measured = counter.get_total_flops() / (2 * positions)
    task = get_task(TASK)
    estimate = estimate_flops(
        model, SequenceLengths.of([positions] * 2), Recomputed(), task.per_sample_modules(model)
    ).model_flops_per_token
    return estimate, measured


@pytest.mark.parametrize("peft", [None, "lora"])
@pytest.mark.parametrize("name", ["tiny-vit", *VIT_ARCHITECTURES])
def test_formula_matches_the_flop_counter(name, peft, tmp_path) -> None:
    model_name = name if name == "tiny-vit" else _shrunk_config(name, tmp_path)
    parsed = _parsed(model_name_or_path=model_name)
    # eager attention: its matmuls are visible to the counter (the CPU's fused kernel is not)
    _, loaded = _load(parsed, LORA if peft else None, attn="eager")
    config = loaded.model.config
    positions = encoder_positions(config)
    estimate, measured = _check_flops(loaded.model, positions)
    assert estimate == pytest.approx(measured, rel=0.10)
    # above the counter only by what is known, to the FLOP: the classifier is counted
    # once per image (per position it would be ~10 labels × hidden more per token)
    assert (
        measured <= estimate <= measured + _known_excess(config, peft is not None) + 1e-6 * measured
    )


def test_the_classifier_runs_once_per_image() -> None:
    parsed = _parsed()
    _, full = _load(parsed)
    _, lora = _load(parsed, LORA)
    task = get_task(TASK)
    assert task.per_sample_modules(full.model) == {id(full.model.classifier)}
    # under LoRA the trained copy and the frozen original sit inside one wrapper
    (wrapper,) = [m for n, m in lora.model.named_modules() if n.endswith(".classifier")]
    assert task.per_sample_modules(lora.model) == {id(wrapper)}
    assert task.head_modules(full.model) == ["classifier"]
    trained = {n for n, p in lora.model.named_parameters() if p.requires_grad}
    assert any("classifier.modules_to_save" in n for n in trained)
    assert any("q_proj.lora_A" in n for n in trained)
    assert not any("k_proj" in n for n in trained)


# ---------------------------------------------------------------------------
# The full-size architecture
# ---------------------------------------------------------------------------


def test_vit_base_builds_and_takes_a_training_step_on_the_cpu(tmp_path) -> None:
    parsed = _parsed(
        model_name_or_path="config:vit-base-patch16-224", dataset_kwargs={"num_images": 1}
    )
    task, loaded = _load(parsed)
    model = loaded.model
    assert loaded.info["kind"] == "config" and loaded.tokenizer is None
    assert 85e6 < loaded.info["total_params"] < 87e6  # ViT-B/16 with a 10-way head
    data, batch = _batch(task, parsed, loaded, 1, tmp_path)
    assert batch[REAL_LENGTHS] == [197]  # 14 × 14 patches and the class token
    assert data.meta["tokens"] == 197
    pop_counts(batch)
    model.train()
    before = model.classifier.weight.detach().clone()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = model(**batch).loss
    loss.backward()
    optimizer.step()
    assert torch.isfinite(loss) and not torch.equal(model.classifier.weight, before)
    flops = estimate_flops(
        model, SequenceLengths.of([197]), Recomputed(), task.per_sample_modules(model)
    )
    h, layers, positions = 768, 12, 197
    matrices = layers * (4 * h * h + 2 * h * 4 * h)  # the layers
    patches = h * 3 * 16 * 16  # the patch embedding: pixels need no input gradient
    per_image = h * 10  # the classifier, on the class token
    attention = layers * 12 * h * positions  # QKᵀ and AV, forward and backward
    expected = 6 * matrices + 4 * patches + 6 * per_image / positions + attention
    assert flops.model_flops_per_token == pytest.approx(expected, rel=1e-9)
