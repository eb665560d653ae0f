"""The ``seq-classification`` task: labels, data, collator, head and FLOPs, on the tiny encoder.

The FLOPs of every shipped encoder architecture (``model_type`` bert or
roberta, the ones ``tests/unit/test_flops_architectures.py`` leaves to this
file) are checked here at a tiny size, full and LoRA, against PyTorch's FLOP
counter on a real classification loss.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from orchestrator.contract.result import DataRecord
from orchestrator.contract.spec import RunSpec
from trainer_entry.data.collate import PADDED_TOKENS, REAL_LENGTHS, REAL_TOKENS, pop_counts
from trainer_entry.measure.flops import estimate_flops
from trainer_entry.measure.recompute import Recomputed
from trainer_entry.measure.steps import SequenceLengths
from trainer_entry.models import tiny_bert
from trainer_entry.models.kinds import TINY_MODELS, model_kind
from trainer_entry.models.load import ARCHITECTURES, apply_peft, shipped_architectures
from trainer_entry.run.parse import ParsedArguments, PeftConfig, parse_arguments
from trainer_entry.spec_errors import SpecError
from trainer_entry.tasks import get_task
from trainer_entry.tasks.seq_classification import (
    ClassificationCollator,
    SeqClassificationTask,
    classes,
)

VOCAB = 512
TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "vocab_size": VOCAB}
#: the model types whose shipped architectures this file checks
ENCODER_TYPES = ("bert", "roberta")


def _model_type(name: str) -> str:
    return json.loads((ARCHITECTURES / f"{name}.json").read_text())["model_type"]


#: every shipped encoder architecture (a new one is checked as soon as its file is there)
SHIPPED_ENCODERS = [n for n in shipped_architectures() if _model_type(n) in ENCODER_TYPES]


@pytest.fixture(scope="module")
def bert_path(_hermetic_cache: Path) -> Path:
    return tiny_bert.ensure_tiny_bert()


@pytest.fixture(scope="module")
def tokenizer(bert_path: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(bert_path)


def _parsed(**data: object) -> ParsedArguments:
    spec = RunSpec.model_validate(
        {"arguments": {"model_name_or_path": "tiny-bert", "task": "seq-classification", **data}}
    )
    return parse_arguments(spec, check_names=False)


# ---------------------------------------------------------------------------
# labels
# ---------------------------------------------------------------------------


def test_class_names_are_sorted_and_numbered() -> None:
    records = [{"label": x} for x in ("positive", "negative", "mixed", "positive")]
    assert classes(records, "label") == ([2, 1, 0, 2], ["mixed", "negative", "positive"])


def test_integer_labels_are_class_ids() -> None:
    # a class no record uses still counts: ids are ids, up to the largest
    assert classes([{"y": 3}, {"y": 0}, {"y": 1}], "y") == ([3, 0, 1], ["0", "1", "2", "3"])
    # digits as a CSV file gives them are ids too, not names sorted as text ("10" < "2")
    assert classes([{"y": "2"}, {"y": "10"}], "y")[0] == [2, 10]


@pytest.mark.parametrize(
    ("labels", "message"),
    [
        ([1, "good"], "mix class ids and class names"),
        ([True, False], "is a bool"),
        ([0.5, 1.0], "is a float"),
        ([1, -1], "negative"),
        (["spam", "spam"], "1 class"),
        ([0, 0], "1 class"),
    ],
)
def test_bad_labels_are_one_line(labels, message) -> None:
    with pytest.raises(SpecError, match=message):
        classes([{"label": x} for x in labels], "label")


def test_a_missing_label_names_the_field_and_the_record() -> None:
    with pytest.raises(SpecError, match=r"record 1 has no label field 'label'.*fields: text"):
        classes([{"label": "a", "text": "x"}, {"text": "y"}], "label")


def test_model_kwargs_come_from_the_shipped_reviews() -> None:
    kwargs = SeqClassificationTask().model_kwargs(_parsed())
    assert kwargs["num_labels"] == 3
    assert kwargs["id2label"] == {0: "mixed", 1: "negative", 2: "positive"}
    assert kwargs["label2id"] == {"mixed": 0, "negative": 1, "positive": 2}
    assert kwargs["problem_type"] == "single_label_classification"


def test_the_shipped_reviews_are_balanced_and_vary_in_length() -> None:
    records = [json.loads(line) for line in tiny_bert.REVIEWS.read_text().splitlines()]
    assert 300 <= len(records) <= 500
    assert {r["label"] for r in records} == {"negative", "mixed", "positive"}
    counts = {label: sum(r["label"] == label for r in records) for label in ("negative", "mixed")}
    assert counts == {"negative": len(records) // 3, "mixed": len(records) // 3}
    words = [len(r["text"].split()) for r in records]
    assert min(words) < 10 and max(words) > 80


# ---------------------------------------------------------------------------
# the tiny encoder
# ---------------------------------------------------------------------------


def test_tiny_bert_is_registered_and_built_deterministically(tmp_path) -> None:
    assert model_kind("tiny-bert") == "tiny" and "tiny-bert" in TINY_MODELS
    tiny_bert.build(tmp_path / "a")
    tiny_bert.build(tmp_path / "b")
    digest = {
        side: {
            p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in (tmp_path / side).iterdir()
        }
        for side in ("a", "b")
    }
    assert digest["a"] == digest["b"]
    assert set(tiny_bert.BUILT_FILES) <= set(digest["a"])


def test_tiny_bert_tokenizes_like_bert_and_loads_with_a_new_head(bert_path, tokenizer) -> None:
    from transformers import AutoModelForSequenceClassification

    assert tiny_bert.ensure_tiny_bert() == bert_path  # built once, then found
    ids = tokenizer("I loved the twist. Five stars.")["input_ids"]
    assert (ids[0], ids[-1]) == (tokenizer.cls_token_id, tokenizer.sep_token_id)
    assert tokenizer.pad_token_id == 0
    assert (
        tokenizer.decode(ids, skip_special_tokens=True).strip() == "I loved the twist. Five stars."
    )
    model = AutoModelForSequenceClassification.from_pretrained(bert_path, num_labels=3)
    assert type(model).__name__ == "BertForSequenceClassification"
    assert model.classifier.out_features == 3
    assert len(tokenizer) == model.get_input_embeddings().num_embeddings
    assert sum(p.numel() for p in model.parameters()) < 300_000


# ---------------------------------------------------------------------------
# data
# ---------------------------------------------------------------------------


def test_prepare_tokenizes_truncates_and_caches(tmp_path, tokenizer) -> None:
    parsed = _parsed(max_seq_len=32)
    task = SeqClassificationTask()
    first = task.prepare(parsed, tokenizer, tmp_path, as_given=False, model_config=None)
    meta = first.meta
    DataRecord.model_validate(meta)  # every key is one the result declares
    data = first.examples
    records = [json.loads(line) for line in tiny_bert.REVIEWS.read_text().splitlines()]
    full = [len(tokenizer(r["text"])["input_ids"]) for r in records]
    # truncated by the tokenizer: [CLS] … [SEP] kept at max_seq_len
    assert data.lengths() == [min(n, 32) for n in full]
    assert all(
        x[0] == tokenizer.cls_token_id and x[-1] == tokenizer.sep_token_id for x in data.input_ids
    )
    assert meta["examples_truncated"] == sum(n > 32 for n in full) > 0
    assert meta["examples"] == meta["sequences"] == meta["label_tokens"] == len(records)
    assert meta["tokens"] == sum(data.lengths())
    names = ["mixed", "negative", "positive"]
    assert [names[i] for i in data.labels] == [r["label"] for r in records]
    assert meta["cache_hit"] is False and meta["cache_key"].startswith("cls1-")

    again = SeqClassificationTask().prepare(
        parsed, tokenizer, tmp_path, as_given=False, model_config=None
    )
    assert again.meta["cache_hit"] is True and again.meta["cache_path"] == meta["cache_path"]
    assert again.examples.lengths() == data.lengths()
    assert all(
        np.array_equal(a, b) for a, b in zip(again.examples.input_ids, data.input_ids, strict=True)
    )
    assert np.array_equal(again.examples.labels, data.labels)
    # another setting is another entry
    longer = task.prepare(
        _parsed(max_seq_len=48), tokenizer, tmp_path, as_given=False, model_config=None
    )
    assert longer.meta["cache_hit"] is False and longer.meta["cache_key"] != meta["cache_key"]


def test_a_local_file_with_its_own_fields(tmp_path, tokenizer) -> None:
    path = tmp_path / "d.csv"
    path.write_text("body,stars\nawful,1\nfine,3\ngreat,5\n")
    parsed = _parsed(dataset=str(path), dataset_text_field="body", label_field="stars")
    task = SeqClassificationTask()
    assert task.model_kwargs(parsed)["num_labels"] == 6  # ids 1, 3, 5: classes 0 to 5
    data = task.prepare(parsed, tokenizer, tmp_path / "data", as_given=False, model_config=None)
    assert list(data.examples.labels) == [1, 3, 5]
    assert data.meta["source"]["file"] == "d.csv"


def test_records_as_given(tmp_path, tokenizer) -> None:
    path = tmp_path / "d.jsonl"
    rows = [{"input_ids": list(range(2, 12)), "label": "b"}, {"text": "so so", "label": "a"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    parsed = _parsed(dataset=str(path), max_seq_len=8)
    data = SeqClassificationTask().prepare(
        parsed, tokenizer, tmp_path, as_given=True, model_config=None
    )
    DataRecord.model_validate(data.meta)
    assert data.examples.input_ids[0].tolist() == list(range(2, 10))  # cut to max_seq_len
    assert data.examples.input_ids[1].tolist() == tokenizer("so so")["input_ids"]
    assert data.examples.labels.tolist() == [1, 0]
    assert data.meta["processing"] == "none" and data.meta["cache_hit"] is None
    assert data.meta["examples_truncated"] == 1 and data.meta["tokens"] == 8 + len(
        tokenizer("so so")["input_ids"]
    )


def test_what_does_not_fit_is_one_line(tmp_path, tokenizer) -> None:
    task = SeqClassificationTask()
    with pytest.raises(SpecError, match="packing does not apply to seq-classification"):
        task.prepare(_parsed(packing=True), tokenizer, tmp_path, as_given=False, model_config=None)
    with pytest.raises(SpecError, match="leaves no room for text"):
        task.prepare(_parsed(max_seq_len=2), tokenizer, tmp_path, as_given=False, model_config=None)

    class Config:
        max_position_embeddings = 16

    with pytest.raises(SpecError, match="the model has 16 positions"):
        task.prepare(
            _parsed(max_seq_len=64), tokenizer, tmp_path, as_given=False, model_config=Config()
        )


@pytest.mark.parametrize("multiple", [None, 8])
def test_the_collator_pads_right_and_counts(multiple) -> None:
    collate = ClassificationCollator(pad_token_id=0, pad_to_multiple_of=multiple)
    features = [
        {"input_ids": np.array([2, 7, 8, 3]), "labels": 1},
        {"input_ids": np.array([2, 9, 3]), "labels": 0},
        {"input_ids": np.array([2, 5, 6, 7, 8, 9, 3]), "labels": 2},
    ]
    batch = collate(features)
    width = 7 if multiple is None else 8
    assert batch["input_ids"].shape == batch["attention_mask"].shape == (3, width)
    assert batch["input_ids"][1].tolist() == [2, 9, 3] + [0] * (width - 3)
    assert batch["attention_mask"].sum(dim=1).tolist() == [4, 3, 7]
    assert batch["labels"].dtype == torch.long and batch["labels"].tolist() == [1, 0, 2]
    assert (batch[REAL_TOKENS], batch[PADDED_TOKENS], batch[REAL_LENGTHS]) == (
        14,
        3 * width,
        [4, 3, 7],
    )
    counts = pop_counts(batch)
    assert (counts.real, counts.padded, counts.lengths) == (14, 3 * width, [4, 3, 7])
    assert set(batch) == {"input_ids", "attention_mask", "labels"}  # what the model gets


def test_the_task_is_registered() -> None:
    task = get_task("seq-classification")
    assert isinstance(task, SeqClassificationTask)
    assert (task.name, task.sample_unit, task.modality, task.peft_task_type()) == (
        "seq-classification",
        "sequences",
        "text",
        "SEQ_CLS",
    )


# ---------------------------------------------------------------------------
# the head, and FLOPs
# ---------------------------------------------------------------------------


def _config(name: str):
    """A tiny model of ``name``: a shipped architecture shrunk (its structure kept), or a family."""
    from transformers import AutoConfig

    if name.startswith("config:"):
        config = {
            k: v
            for k, v in json.loads((ARCHITECTURES / f"{name[7:]}.json").read_text()).items()
            if not k.startswith("_")
        }
        config.update(TINY, num_attention_heads=4)
        return AutoConfig.for_model(**config, num_labels=3)
    families = {
        "distilbert": {
            "dim": 64,
            "hidden_dim": 128,
            "n_layers": 2,
            "n_heads": 4,
            "vocab_size": VOCAB,
        },
        "llama": {**TINY, "num_attention_heads": 4, "num_key_value_heads": 2, "pad_token_id": 0},
    }
    return AutoConfig.for_model(name, **families[name], num_labels=3)


def _model(name: str, mode: str, bert_path: Path | None = None):
    from transformers import AutoModelForSequenceClassification

    torch.manual_seed(0)
    if name == "tiny-bert":
        model = AutoModelForSequenceClassification.from_pretrained(
            bert_path, num_labels=3, attn_implementation="eager"
        )
    else:
        model = AutoModelForSequenceClassification.from_config(
            _config(name), attn_implementation="eager"
        )
    if mode == "lora":
        task = SeqClassificationTask()
        model = apply_peft(
            model,
            PeftConfig(method="lora", r=8, target_modules="all-linear"),
            quantized=False,
            task=task,
        )
    return model.train()


def _names(model, ids: set[int]) -> set[str]:
    return {name for name, m in model.named_modules() if id(m) in ids}


def test_the_pooled_head_runs_once_per_sample(bert_path) -> None:
    task = SeqClassificationTask()
    bert = _model("tiny-bert", "full", bert_path)
    assert _names(bert, task.per_sample_modules(bert)) == {"bert.pooler", "classifier", "dropout"}
    assert task.head_modules(bert) == ["classifier"]
    roberta = _model("config:roberta-base", "full")
    assert _names(roberta, task.per_sample_modules(roberta)) == {
        "classifier"
    }  # dense + out_proj inside
    distil = _model("distilbert", "full")
    assert _names(distil, task.per_sample_modules(distil)) == {
        "pre_classifier",
        "classifier",
        "dropout",
    }
    assert task.head_modules(distil) == ["pre_classifier", "classifier"]
    # a causal model scores every position, then picks one: nothing runs once per sample
    llama = _model("llama", "full")
    assert task.per_sample_modules(llama) == set()
    assert task.head_modules(llama) == ["score"]
    # under LoRA the same modules are found through PEFT's wrappers, the head trained in full
    lora = _model("tiny-bert", "lora", bert_path)
    names = _names(lora, task.per_sample_modules(lora))
    assert {"base_model.model.bert.pooler", "base_model.model.classifier"} <= names
    assert not any(".encoder." in n for n in names)
    head = lora.get_base_model().classifier
    assert all(p.requires_grad for p in head.modules_to_save.parameters())


def _counted(model, ids: torch.Tensor, labels: torch.Tensor) -> float:
    """FLOPs of forward and backward of the classification loss, per token of ``ids``."""
    with FlopCounterMode(display=False) as counter:
        model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=labels).loss.backward()
    return counter.get_total_flops()


MODELS = ["tiny-bert", *(f"config:{n}" for n in SHIPPED_ENCODERS), "distilbert", "llama"]


@pytest.mark.parametrize("mode", ["full", "lora"])
@pytest.mark.parametrize("name", MODELS)
def test_formula_matches_the_flop_counter(name, mode, bert_path) -> None:
    task = SeqClassificationTask()
    model = _model(name, mode, bert_path)
    per_sample = task.per_sample_modules(model)
    tolerance = 1e-6 if mode == "full" else 0.10

    # one batch of equal lengths: no padding for the counter to see
    ids = torch.randint(5, VOCAB, (3, 40))
    labels = torch.tensor([0, 2, 1])
    estimate = estimate_flops(model, SequenceLengths.of([40, 40, 40]), Recomputed(), per_sample)
    counted = _counted(model, ids, labels) / ids.numel()
    assert estimate.model_flops_per_token == pytest.approx(counted, rel=tolerance)
    if mode == "lora":
        # above, never below: the frozen first layer's input gradient the counter skips
        assert estimate.model_flops_per_token >= counted

    # unequal lengths, each sequence alone (no padding): the head once per sample, Σr²/Σr
    lengths = [7, 30, 61]
    total = sum(
        _counted(model, torch.randint(5, VOCAB, (1, n)), torch.tensor([i % 3]))
        for i, n in enumerate(lengths)
    )
    estimate = estimate_flops(model, SequenceLengths.of(lengths), Recomputed(), per_sample)
    assert estimate.model_flops_per_token == pytest.approx(total / sum(lengths), rel=tolerance)
    if per_sample:
        # counted per token, the pooled head would be overstated
        assert estimate_flops(
            model, SequenceLengths.of(lengths), Recomputed()
        ).model_flops_per_token > (estimate.model_flops_per_token)


def test_every_shipped_encoder_is_checked() -> None:
    assert {"bert-base-uncased", "roberta-base"} <= set(SHIPPED_ENCODERS)


@pytest.mark.parametrize("name", SHIPPED_ENCODERS)
def test_shipped_encoders_load_at_full_size_for_the_task(name) -> None:
    """``config:<encoder>`` through the child's loader, at full size; its FLOPs on a short batch."""
    from trainer_entry.models.load import load_model
    from trainer_entry.run.parse import ModelConfig

    task = SeqClassificationTask()
    loaded = load_model(
        ModelConfig(name=f"config:{name}", attn_implementation="eager"),
        PeftConfig(method="lora", target_modules=["query", "value"]),
        on_gpu=False,
        local_rank=0,
        task=task,
        task_kwargs=task.model_kwargs(_parsed()),
    )
    model = loaded.model.train()
    assert loaded.info["architecture"].endswith("ForSequenceClassification")
    assert model.config.num_labels == 3 and model.config.id2label[2] == "positive"
    assert 100e6 < loaded.info["total_params"] < 130e6
    # LoRA on the encoder's query and value, the new head trained in full
    trained = [n for n, p in model.named_parameters() if p.requires_grad]
    assert {n.split(".")[-4] for n in trained if ".lora_A." in n} == {"query", "value"}
    assert any(".classifier.modules_to_save." in n for n in trained)
    assert all(".lora_" in n or ".classifier.modules_to_save." in n for n in trained)
    ids = torch.randint(5, 1000, (2, 16))
    counted = _counted(model, ids, torch.tensor([0, 2])) / ids.numel()
    estimate = estimate_flops(
        model, SequenceLengths.of([16, 16]), Recomputed(), task.per_sample_modules(model)
    )
    assert estimate.model_flops_per_token == pytest.approx(counted, rel=0.10)
