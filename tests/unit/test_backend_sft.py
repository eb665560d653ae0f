"""The ``sft`` backend: our data options as SFTConfig's, and what TRL's batches fed."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

from orchestrator.contract.spec import RunSpec
from orchestrator.contract.trainers import own_fields as saved_own_fields
from orchestrator.contract.trainers import trainer
from trainer_entry.run.parse import parse_arguments
from trainer_entry.spec_errors import SpecError

pytest.importorskip("trl")

from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

from trainer_entry.backends import get_backend
from trainer_entry.backends.sft import CountingCollator, data_config, own_fields
from trainer_entry.data.collate import count_collated, pop_counts


def configure(tmp_path: Path, **arguments: Any) -> Any:
    spec = RunSpec(output_dir=str(tmp_path), arguments={"model_name_or_path": "m", **arguments})
    parsed = parse_arguments(spec)
    return parsed, get_backend("sft").configure(spec, parsed, on_gpu=False)


def test_the_saved_sft_fields_match_the_installed_trl() -> None:
    import trl

    saved_file = trainer("sft").own_fields_file
    saved = json.loads(saved_file.read_text())
    assert saved_own_fields("sft") == own_fields(), (
        f"{saved_file.name} lists trl {saved['trl']}, installed is {trl.__version__}: "
        "run python -m trainer_entry.backends"
    )


def test_our_data_options_become_trls_own(tmp_path: Path) -> None:
    parsed, settings = configure(
        tmp_path,
        max_seq_len=96,
        packing=True,
        completion_only_loss=True,
        pad_to_multiple_of=8,
        packing_strategy="wrapped",
        max_steps=3,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
    )
    args = settings.native
    assert (args.max_length, args.packing, args.packing_strategy) == (96, True, "wrapped")
    assert (args.completion_only_loss, args.pad_to_multiple_of) == (True, 8)
    assert (args.max_steps, settings.per_device_train_batch_size) == (3, 4)
    assert settings.gradient_accumulation_steps == 2
    # what the child controls
    assert args.output_dir == str(tmp_path) and args.use_cpu is True
    assert args.report_to == []  # "none"
    assert args.save_strategy == "no"
    # TrainingArguments' defaults where SFTConfig's differ: a scenario means the same
    # under both backends
    assert (args.learning_rate, args.logging_steps, args.bf16) == (5e-5, 500, False)
    assert settings.activation_checkpointing is False and args.gradient_checkpointing is False
    # ... and what a scenario writes wins
    _, written = configure(tmp_path, learning_rate=1e-3, activation_checkpointing=True)
    assert written.native.learning_rate == 1e-3 and written.activation_checkpointing is True
    # the task hands TRL whole sequences: TRL packs and truncates
    cfg = data_config(parsed)
    assert (cfg.packing, cfg.truncate, cfg.max_seq_len) == (False, False, 96)


def test_padding_free_without_packing_is_cut_here(tmp_path: Path) -> None:
    """TRL cannot enforce max_length on unpacked padding-free batches: we cut, it does not."""
    parsed, settings = configure(tmp_path, padding_free=True, max_seq_len=64)
    assert settings.native.padding_free is True and settings.native.max_length is None
    cfg = data_config(parsed)
    assert (cfg.packing, cfg.truncate, cfg.max_seq_len) == (False, True, 64)
    with pytest.raises(SpecError, match=r"^trainer sft: truncation_mode keep_end needs TRL"):
        configure(tmp_path, padding_free=True, truncation_mode="keep_end")


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (
            {"model_init_kwargs": {"dtype": "bfloat16"}},
            "model_init_kwargs is refused: tunematrix loads the model",
        ),
        ({"chat_template_path": "t.jinja"}, "chat_template_path is refused: .*use chat_template"),
        ({"eos_token": "</s>"}, "eos_token is refused: the records are tokenized"),
        (
            {"assistant_only_loss": True},
            "assistant_only_loss is refused: .*completion_only_loss: true",
        ),
        ({"optim": "nope"}, r"invalid trainer arguments \(trl [0-9.]+.s SFTConfig\): .*nope"),
    ],
)
def test_bad_sft_arguments_are_one_line(tmp_path: Path, arguments: dict, message: str) -> None:
    with pytest.raises(SpecError, match=message) as err:
        configure(tmp_path, **arguments)
    assert "\n" not in str(err.value)


def test_sft_arguments_belong_to_sft_only() -> None:
    fields = get_backend("sft").argument_fields()
    assert {"packing_strategy", "padding_free", "max_steps"} <= fields
    spec = RunSpec(arguments={"model_name_or_path": "m", "trainer": "hf", "padding_free": True})
    with pytest.raises(SpecError, match="unknown argument 'padding_free'"):
        parse_arguments(spec)


def test_without_trl_the_sft_backend_is_refused_before_the_training_stack(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from trainer_entry.run import preflight

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "trl" else real(name, *a)
    )
    spec = RunSpec(arguments={"model_name_or_path": "tiny-llama"})
    with pytest.raises(SpecError) as err:
        preflight.preflight(spec)
    assert str(err.value) == "trainer sft needs trl: pip install trl, or set trainer: hf"
    hf = RunSpec(arguments={"model_name_or_path": "tiny-llama", "trainer": "hf"})
    assert preflight.preflight(hf).backend == "hf"


# ---------------------------------------------------------------------------
# Counting what TRL's own collator made
# ---------------------------------------------------------------------------


def examples(*lengths: int, seq_lengths: list[list[int]] | None = None) -> list[dict]:
    out: list[dict] = []
    start = 1
    for i, n in enumerate(lengths):
        ex: dict = {"input_ids": list(range(start, start + n))}
        if seq_lengths is not None:
            ex["seq_lengths"] = seq_lengths[i]
        out.append(ex)
        start += n
    return out


@pytest.mark.parametrize("multiple", [None, 4])
def test_padded_batches_count_their_attention_mask(multiple: int | None) -> None:
    collate = DataCollatorForLanguageModeling(pad_token_id=0, pad_to_multiple_of=multiple)
    features = examples(3, 5, 2)
    counts = count_collated(collate(features), features)
    width = 8 if multiple else 5
    assert (counts.real, counts.padded, counts.lengths) == (10, 3 * width, [3, 5, 2])


@pytest.mark.parametrize("multiple", [None, 4])
def test_padding_free_batches_count_each_document(multiple: int | None) -> None:
    collate = DataCollatorForLanguageModeling(
        pad_token_id=0, padding_free=True, pad_to_multiple_of=multiple
    )
    features = examples(3, 5, 2)
    batch = collate(features)
    assert "attention_mask" not in batch and batch["input_ids"].shape[0] == 1
    counts = count_collated(batch, features)
    # one flattened row: no padding, unless a multiple asks for a tail
    assert (counts.real, counts.padded, counts.lengths) == (10, 12 if multiple else 10, [3, 5, 2])


def test_packed_rows_count_the_documents_inside() -> None:
    """TRL's bfd packing: rows hold several documents (seq_lengths), fed padding-free."""
    collate = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)
    features = examples(7, 5, seq_lengths=[[4, 3], [5]])
    counts = count_collated(collate(features), features)
    assert (counts.real, counts.padded, counts.lengths) == (12, 12, [4, 3, 5])


def test_a_batch_that_lost_tokens_is_an_error() -> None:
    collate = DataCollatorForLanguageModeling(pad_token_id=0)
    features = examples(3, 5)
    batch = collate(features)
    batch["attention_mask"][1, -1] = 0  # as if the collator had cut a token
    with pytest.raises(ValueError, match="attention mask holds rows of"):
        count_collated(batch, features)
    flat = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)(features)
    with pytest.raises(ValueError, match="covering its 9 tokens"):
        count_collated(flat, [*features, {"input_ids": [1]}])


def test_the_counts_ride_along_and_never_reach_the_model() -> None:
    inner = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)
    features = examples(3, 2)
    batch = CountingCollator(inner)(features)
    counts = pop_counts(batch)
    assert (counts.real, counts.padded, counts.lengths) == (5, 5, [3, 2])
    assert set(batch) == set(inner(features))


# ---------------------------------------------------------------------------
# The data TRL trains on is the data we prepared
# ---------------------------------------------------------------------------


def built(tmp_path: Path, **arguments: Any) -> tuple[Any, Any, Any]:
    """(prepared whole sequences, TRL's dataset, the result's data record) of the shipped set."""
    from trainer_entry.models.load import load_model
    from trainer_entry.tasks import get_task

    spec = RunSpec(
        device="cpu",
        arguments={"model_name_or_path": "tiny-llama", "max_steps": 1, **arguments},
    ).resolve(tmp_path)
    parsed = parse_arguments(spec)
    backend = get_backend(parsed.backend)
    settings = backend.configure(spec, parsed, on_gpu=False)
    task = get_task(parsed.task)
    loaded = load_model(parsed.model, parsed.peft, task=task, on_gpu=False, local_rank=0)
    # as a run prepares it: with the backend's data settings
    data = task.prepare(
        dataclasses.replace(parsed, data=backend.data_settings(parsed)),
        loaded.tokenizer,
        Path(spec.data_dir),
        as_given=False,
        model_config=None,
    )
    whole = [
        (x.tolist(), y.tolist())
        for x, y in zip(data.examples.input_ids, data.examples.labels, strict=True)
    ]
    run = backend.build(
        settings,
        model=loaded.model,
        tokenizer=loaded.tokenizer,
        task=task,
        data=data,
        parsed=parsed,
        hooks=None,
    )
    return whole, run.trainer.train_dataset, data.meta


def test_trl_cuts_and_masks_our_sequences_as_hf_would(tiny_path: Path, tmp_path: Path) -> None:
    n = 40
    whole, dataset, meta = built(tmp_path, max_seq_len=n, completion_only_loss=True)
    assert all(len(ids) == len(labels) for ids, labels in whole)
    assert max(len(ids) for ids, _ in whole) > n  # some sequences are cut
    # what our own preparation makes for hf: cut to n, prompts masked, none left empty
    expected = [
        (ids[:n], labels[:n]) for ids, labels in whole if any(x != -100 for x in labels[:n])
    ]
    assert [(r["input_ids"], r["labels"]) for r in dataset] == expected
    assert any(-100 in labels for _, labels in expected)  # the prompts are masked
    assert meta["sequences"] == len(expected) and meta["packing"] is False
    assert meta["tokens"] == sum(len(ids) for ids, _ in expected)
    assert meta["examples_truncated"] == sum(len(ids) > n for ids, _ in whole)
    assert meta["examples_dropped"] == len(whole) - len(expected)


def test_packing_feeds_trl_the_blocks_hf_trains_on(tiny_path: Path, tmp_path: Path) -> None:
    n = 64
    blocks, dataset, meta = built(tmp_path / "sft", max_seq_len=n, packing=True)
    hf_blocks, hf_dataset, hf_meta = built(
        tmp_path / "hf", max_seq_len=n, packing=True, trainer="hf"
    )
    # the same blocks of exactly n tokens, in the same order, under both trainers
    assert [ids for ids, _ in blocks] == [ids for ids, _ in hf_blocks]
    assert [r["input_ids"] for r in dataset] == [ids for ids, _ in hf_blocks]
    assert {len(r["input_ids"]) for r in dataset} == {n} and "seq_lengths" not in dataset[0]
    assert len(hf_dataset) == len(dataset)
    for key in ("sequences", "tokens", "label_tokens", "tokens_dropped", "packing"):
        assert meta[key] == hf_meta[key], key


def test_a_packing_strategy_hands_packing_to_trl(tiny_path: Path, tmp_path: Path) -> None:
    n = 64
    whole, dataset, meta = built(tmp_path, max_seq_len=n, packing=True, packing_strategy="bfd")
    assert meta["packing"] is True and meta["sequences"] == len(dataset)
    # bfd: every sequence, cut to n, in exactly one row of at most n tokens
    assert all(len(r["input_ids"]) <= n for r in dataset)
    assert sorted(k for r in dataset for k in r["seq_lengths"]) == sorted(
        min(len(ids), n) for ids, _ in whole
    )
    assert meta["tokens"] == sum(min(len(ids), n) for ids, _ in whole)
    assert meta["tokens_dropped"] == sum(max(0, len(ids) - n) for ids, _ in whole)


def test_the_loss_mask_goes_in_as_trls_own_where_it_can() -> None:
    import numpy as np

    from trainer_entry.backends.sft import sft_dataset
    from trainer_entry.data.tokenize import PreparedData

    def prepared(*pairs: tuple[list[int], list[int]]) -> PreparedData:
        return PreparedData(
            [np.asarray(i) for i, _ in pairs], [np.asarray(label) for _, label in pairs], {}
        )

    whole = prepared(([1, 2, 3], [1, 2, 3]), ([4, 5], [4, 5]))
    assert sft_dataset(whole, completion_only_loss=False).column_names == ["input_ids"]
    masked = prepared(([1, 2, 3], [-100, 2, 3]), ([4, 5], [4, 5]))
    ds = sft_dataset(masked, completion_only_loss=True)
    assert ds.column_names == ["input_ids", "completion_mask"]
    assert ds["completion_mask"] == [[0, 1, 1], [1, 1]]
    # a mask without completion_only_loss, or labels that are not the inputs: as given
    assert sft_dataset(masked, completion_only_loss=False)["labels"] == [[-100, 2, 3], [4, 5]]
    other = prepared(([1, 2, 3], [7, 2, 3]))
    assert sft_dataset(other, completion_only_loss=True)["labels"] == [[7, 2, 3]]


def test_whole_sequences_are_cached_apart_from_cut_ones(tmp_path: Path) -> None:
    import dataclasses

    from trainer_entry.data.cache import cache_key

    parsed, _ = configure(tmp_path, max_seq_len=64)
    cut = dataclasses.replace(parsed.data, truncate=True)
    assert cache_key(data_config(parsed), {}, "t") != cache_key(cut, {}, "t")
