"""The ``vision-language`` task: conversations and images read, the counts, FLOPs against
PyTorch's counter.

The tiny model and every shipped LLaVA-style architecture (shrunk, its structure
kept) are checked, full, LoRA and checkpointed, against ``FlopCounterMode``
summed over conversations of one and two images and different texts
(``tests/countedcheck.py``). A Qwen2-VL model's image positions follow each
image's size, which the meta device cannot read: it gets no figure, and says so.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from countedcheck import counted_over_reference, in_mode

from orchestrator.contract.trainers import task_backends
from trainer_entry.data.collate import COUNTS, PADDED_TOKENS, REAL_LENGTHS, REAL_TOKENS, ROW_DIMS
from trainer_entry.data.formats import IGNORE_INDEX
from trainer_entry.measure.flops import FlopsUnavailable
from trainer_entry.models.load import ARCHITECTURES, shipped_architectures
from trainer_entry.models.resolve import architecture_config
from trainer_entry.models.tiny_vlm import ensure_tiny_vlm
from trainer_entry.settings.parsed import DataConfig
from trainer_entry.spec_errors import SpecError
from trainer_entry.tasks.vision_language import (
    ConversationCollator,
    VisionLanguageTask,
    _records,
    conversation,
    fitted_processor,
    tokens_per_image,
)

#: the model types whose shipped architectures this file checks
VISION_LANGUAGE_TYPES = ("llava", "qwen2_vl")
ROWS = [{"images": 1, "text": 12}, {"images": 2, "text": 5}, {"images": 1, "text": 30}]


def _model_type(name: str) -> str:
    return str(json.loads((ARCHITECTURES / f"{name}.json").read_text())["model_type"])


SHIPPED = [n for n in shipped_architectures() if _model_type(n) in VISION_LANGUAGE_TYPES]
LLAVA = [n for n in SHIPPED if _model_type(n) == "llava"]


def _shrunk(name: str):
    """A shipped LLaVA-style architecture at a tiny size, its structure kept (the tower's
    feature layer and strategy, the projector, the text model's kind)."""
    from transformers import AutoConfig

    config = {
        k: v
        for k, v in json.loads((ARCHITECTURES / f"{name}.json").read_text()).items()
        if not k.startswith("_")
    }
    config["text_config"].update(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4
    )
    config["text_config"].update(num_key_value_heads=2, vocab_size=512)
    config["vision_config"].update(
        hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4
    )
    config["vision_config"].update(image_size=28, patch_size=7)
    config.update(image_token_index=500, pad_token_id=0)
    return AutoConfig.for_model(**config)


def _model(name: str, mode: str):
    from transformers import AutoModelForImageTextToText

    torch.manual_seed(0)
    if name == "tiny-vlm":
        model = AutoModelForImageTextToText.from_pretrained(
            ensure_tiny_vlm(), attn_implementation="eager"
        )
    else:
        model = AutoModelForImageTextToText.from_config(_shrunk(name), attn_implementation="eager")
    task = VisionLanguageTask()
    return in_mode(model, task, mode, ["q_proj", "v_proj"]), task


def test_the_shipped_vision_language_architectures_are_here() -> None:
    assert {"llava-1.5-7b", "qwen2-vl-7b"} <= set(SHIPPED)


@pytest.mark.parametrize(
    ("name", "mode"),
    [("tiny-vlm", "full"), *((n, m) for n in LLAVA for m in ("full", "lora", "checkpointed"))],
)
def test_counted_flops_match_the_flop_counter(name: str, mode: str) -> None:
    model, task = _model(name, mode)
    config = model.config
    per_image = tokens_per_image(config)
    assert per_image is not None
    ratio = counted_over_reference(
        task,
        model,
        ROWS,
        checkpointing=mode == "checkpointed",
        marks=lambda lengths: {"input_ids": (lengths["images"] * per_image, config.image_token_id)},
    )
    # exact: within the 10% and far closer
    assert ratio == pytest.approx(1.0, rel=1e-6)


def test_a_qwen2_vl_model_gets_no_figure_and_no_prediction_and_says_why() -> None:
    from transformers import AutoConfig

    config = AutoConfig.for_model(**architecture_config("config:qwen2-vl-7b"))
    task = VisionLanguageTask()
    assert tokens_per_image(config) is None
    with pytest.raises(FlopsUnavailable, match="follow each image's size"):
        task.probe_batch(config, {"images": 1, "text": 8})


def _processor():
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(ensure_tiny_vlm())


def _image(seed: int, size: tuple[int, int] = (40, 48)):
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (*size, 3), dtype=np.uint8)
    return Image.fromarray(pixels, mode="RGB")


def test_a_batch_counts_image_and_text_positions_and_learns_from_the_text() -> None:
    processor = _processor()
    token = processor.image_token_id
    short = conversation([{"role": "user", "content": "A?"}], 1, "r1")
    long = conversation(
        [
            {"role": "user", "content": [{"type": "text", "text": "Look: "}, {"type": "image"}]},
            {"role": "assistant", "content": "A long answer about the picture, word by word."},
        ],
        1,
        "r2",
    )
    features = [
        {"images": [_image(0)], "messages": short},
        {"images": [_image(1)], "messages": long},
    ]
    batch = ConversationCollator(processor, token)(features)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    rows = mask.sum(1).tolist()
    assert rows[0] < rows[1] == ids.shape[1]  # right-padded to the longer
    assert (ids == token).sum(1).tolist() == [64, 64]
    assert batch[REAL_TOKENS] == sum(rows) and batch[PADDED_TOKENS] == ids.numel()
    assert batch[REAL_LENGTHS] == rows
    assert batch[COUNTS] == {"image_tokens": 128, "text_tokens": sum(rows) - 128}
    assert batch[ROW_DIMS] == {"images": [1, 1], "text": [rows[0] - 64, rows[1] - 64]}
    # the loss is on the text: image and padding positions are ignored
    learnt = batch["labels"] != IGNORE_INDEX
    assert learnt.sum().item() == sum(rows) - 128
    assert not learnt[ids == token].any() and not learnt[mask == 0].any()
    assert batch["pixel_values"].shape == (2, 3, 32, 32)


def test_a_conversation_gets_its_image_parts_and_a_mismatch_is_refused() -> None:
    turns = conversation([{"role": "user", "content": "What?"}], 2, "r")
    assert turns[0]["content"] == [
        {"type": "image"},
        {"type": "image"},
        {"type": "text", "text": "What?"},
    ]
    with pytest.raises(SpecError, match="r: the conversation shows 1 images but the record has 2"):
        conversation([{"role": "user", "content": [{"type": "image"}]}], 2, "r")
    with pytest.raises(SpecError, match="every turn has a role and a content"):
        conversation([{"content": "x"}], 1, "r")
    with pytest.raises(SpecError, match="a content part is"):
        conversation([{"role": "user", "content": [{"type": "video"}]}], 0, "r")


def test_images_go_where_the_text_says_or_before_the_first_user_turn() -> None:
    # LLaVA's own layout writes the image token in the text
    turns = conversation([{"role": "user", "content": "<image>\nWhat?"}], 1, "r", "<image>")
    assert turns[0]["content"] == [{"type": "image"}, {"type": "text", "text": "\nWhat?"}]
    # TRL's: before the first user turn, not into a system prompt
    turns = conversation(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What?"}],
        1,
        "r",
        "<image>",
    )
    assert turns[0]["content"] == [{"type": "text", "text": "Be brief."}]
    assert turns[1]["content"] == [{"type": "image"}, {"type": "text", "text": "What?"}]


def test_a_record_without_images_is_a_text_only_conversation(tmp_path: Path) -> None:
    path = tmp_path / "mixed.jsonl"
    (tmp_path / "a.png").write_bytes(b"")
    records = [
        {"image": "a.png", "messages": [{"role": "user", "content": "Look."}]},
        {"messages": [{"role": "user", "content": "No picture here."}]},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    read, _ = _records(DataConfig(dataset=str(path)), "<image>")
    assert [len(images) for images, _ in read] == [1, 0]
    assert read[1][1][0]["content"] == [{"type": "text", "text": "No picture here."}]


def test_a_hub_datasets_images_stay_undecoded_until_fed() -> None:
    import datasets
    from PIL import Image

    from trainer_entry.tasks.vision_language import picture, undecoded

    pictures = [_image(i) for i in range(2)]
    ds = datasets.Dataset.from_dict({"image": pictures, "images": [[p] for p in pictures]})
    for column in ("image", "images"):
        row = undecoded(ds, column)[0][column]
        stored = row[0] if column == "images" else row
        assert set(stored) == {"bytes", "path"}  # the file's bytes, not a picture
        assert isinstance(picture(stored), Image.Image) and picture(stored).size == (48, 40)


def test_a_built_qwen2_vl_without_its_processor_is_refused_before_training() -> None:
    from transformers import AutoConfig

    config = AutoConfig.for_model(**architecture_config("config:qwen2-vl-7b"))
    parsed = SimpleNamespace(
        data=DataConfig(),
        evaluation=SimpleNamespace(enabled=False),
        model=SimpleNamespace(name="config:qwen2-vl-7b", tokenizer=None),
        backend="sft",
    )
    with pytest.raises(SpecError, match="set tokenizer_name_or_path to a folder holding"):
        VisionLanguageTask().prepare(
            parsed, _processor(), Path("."), as_given=False, model_config=config
        )


def test_the_generated_set_is_fixed_and_names_what_each_picture_shows() -> None:
    cfg = DataConfig(dataset_kwargs={"num_images": 12, "seed": 3, "size": 16})
    first, identity = _records(cfg)
    again, _ = _records(cfg)
    assert first == again and len(first) == 12
    assert identity["conversations"] == 12 and identity["size"] == 16
    images, turns = first[4]
    assert images == [{"synthetic": (4, 3, 16)}]
    assert "disc" in turns[1]["content"][0]["text"]  # the fifth class
    with pytest.raises(SpecError, match="it takes num_images, seed and size"):
        _records(DataConfig(dataset_kwargs={"num_clips": 3}))


def _write_records(folder: Path) -> Path:
    records = []
    for i in range(6):
        name = f"pic{i}.png"
        _image(i, (20 + 4 * i, 30)).save(folder / name)
        records.append(
            {
                "picture": name if i % 2 else [name],
                "turns": [
                    {"role": "user", "content": "What is shown?"},
                    {"role": "assistant", "content": "Noise, " * (1 + 3 * i)},
                ],
            }
        )
    path = folder / "vl.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _parsed(backend: str = "hf", evaluation: bool = False, **data):
    return SimpleNamespace(
        data=DataConfig(**data),
        evaluation=SimpleNamespace(enabled=evaluation, holdout=2),
        model=SimpleNamespace(name="tiny-vlm", tokenizer=None),
        backend=backend,
    )


def test_a_users_images_and_conversations_are_read_and_the_long_ones_dropped(
    tmp_path: Path,
) -> None:
    from transformers import AutoConfig

    path = _write_records(tmp_path)
    task = VisionLanguageTask()
    parsed = _parsed(
        dataset=str(path), image_field="picture", messages_field="turns", max_seq_len=110
    )
    config = AutoConfig.from_pretrained(ensure_tiny_vlm())
    data = task.prepare(parsed, _processor(), tmp_path, as_given=False, model_config=config)
    meta = data.meta
    # 64 image positions each: the last conversations' answers push them past 110
    assert meta["examples"] == 6 and 0 < meta["examples_dropped"] < 6
    kept = meta["sequences"]
    assert kept == 6 - meta["examples_dropped"]
    assert meta["counts"]["image_tokens"] == 64 * kept
    assert meta["tokens"] == meta["counts"]["image_tokens"] + meta["counts"]["text_tokens"]
    # the loss is on the text under hf; on every real position under sft (TRL's collator)
    assert meta["label_tokens"] == meta["counts"]["text_tokens"]
    fields = {"dataset": str(path), "image_field": "picture", "messages_field": "turns"}
    whole = task.prepare(
        _parsed(**fields), _processor(), tmp_path, as_given=False, model_config=config
    ).meta
    held = task.prepare(
        _parsed(evaluation=True, **fields),
        _processor(),
        tmp_path,
        as_given=False,
        model_config=config,
    )
    trained, kept = held.meta, held.eval_examples.meta
    assert kept["sequences"] == 2 and trained["sequences"] == 6 - 2 == whole["sequences"] - 2
    # each part's labels are its own text positions
    assert trained["label_tokens"] == trained["counts"]["text_tokens"]
    assert trained["label_tokens"] + kept["label_tokens"] == whole["counts"]["text_tokens"]
    sft = task.prepare(
        _parsed(backend="sft", **fields),
        _processor(),
        tmp_path,
        as_given=False,
        model_config=config,
    )
    assert sft.meta["label_tokens"] == sft.meta["tokens"]
    row = task.dataset(data)[0]
    assert row["images"][0].mode == "RGB" and row["messages"][0]["content"][0] == {"type": "image"}
    with pytest.raises(SpecError, match="no record has the field 'image' \\(image_field\\)"):
        bad = _parsed(dataset=str(path), messages_field="turns")
        task.prepare(bad, _processor(), tmp_path, as_given=False, model_config=config)
    with pytest.raises(SpecError, match="every conversation is longer than max_seq_len 40"):
        short = _parsed(
            dataset=str(path), image_field="picture", messages_field="turns", max_seq_len=40
        )
        task.prepare(short, _processor(), tmp_path, as_given=False, model_config=config)


def test_a_built_llava_gets_the_tiny_processor_at_its_size() -> None:
    from transformers import AutoConfig

    config = AutoConfig.for_model(**architecture_config("config:llava-1.5-7b"))
    processor = fitted_processor(_processor(), config)
    batch = processor(images=[_image(0)], text=["<image>\nhi"], return_tensors="pt")
    assert batch["pixel_values"].shape == (1, 3, 336, 336)
    assert (batch["input_ids"] == processor.image_token_id).sum().item() == 576
    assert tokens_per_image(config) == 576


def test_sft_and_hf_train_it() -> None:
    assert task_backends("vision-language") == ("sft", "hf")


def test_its_memory_is_not_predicted_and_the_prediction_says_why(tmp_path: Path) -> None:
    from orchestrator import api
    from orchestrator.contract.spec import RunSpec
    from trainer_entry.run.memoryplan import predict

    (tmp_path / "scenarios.yaml").write_text(
        "scenarios:\n  - name: vl\n    device: cpu\n    arguments: {task: vision-language, "
        "model_name_or_path: tiny-vlm, max_steps: 2, max_seq_len: 160}\n",
        encoding="utf-8",
    )
    (tmp_path / "defaults.yaml").write_text("", encoding="utf-8")
    plan = api.plan(tmp_path / "scenarios.yaml", defaults=tmp_path / "defaults.yaml", device="cpu")
    spec = RunSpec(**plan.experiments[0].spec()).resolve(tmp_path)
    with pytest.raises(SpecError, match="finds its image positions by the values of the token ids"):
        predict(spec)


def test_ddp_looks_for_its_unused_parameters_as_trl_does_unless_told() -> None:
    """The tower's layers past the one the projector reads (and its last norm) take no part
    in the loss: DDP fails at its second step unless it looks for them. hf sets it as TRL's
    SFTTrainer does; not under reentrant checkpointing (the scenario's own value is laid over
    it by ``training_kwargs``)."""
    from trainer_entry.backends.hf import unused_parameters_default

    def parsed(task: str, **training):
        return SimpleNamespace(task=task, training=training)

    assert unused_parameters_default(parsed("vision-language")) == {
        "ddp_find_unused_parameters": True
    }
    assert unused_parameters_default(parsed("causal-lm")) == {}
    reentrant = {"use_reentrant": True}
    assert (
        unused_parameters_default(
            parsed("vision-language", gradient_checkpointing_kwargs=reentrant)
        )
        == {}
    )
