"""Data preparation: formatting, loss masks, packing, truncation, the cache, the collator."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from trainer_entry.data.collate import Collator
from trainer_entry.data.formats import IGNORE_INDEX
from trainer_entry.data.prepare import load_unprocessed, prepare
from trainer_entry.run.parse import DataConfig
from trainer_entry.spec_errors import SpecError

RECORDS = [
    {"instruction": "Add 2 and 3.", "input": "", "output": "5"},
    {"instruction": "Sort these.", "input": "3, 1, 2", "output": "1, 2, 3"},
    {"instruction": "Spell backwards.", "input": "river", "output": "revir"},
]


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    return write_jsonl(tmp_path / "tiny.jsonl", RECORDS)


def test_instruct_format_and_completion_mask(tiny_tokenizer, dataset, tmp_path) -> None:
    tok = tiny_tokenizer
    cfg = DataConfig(dataset=str(dataset), max_seq_len=512, completion_only_loss=True)
    data = prepare(cfg, tok, tmp_path / "data")
    assert data.meta["sequences"] == 3 and data.meta["cache_hit"] is False
    ids, labels = data.input_ids[1], data.labels[1]
    text = tok.decode(ids, skip_special_tokens=False)
    assert "### Instruction:\nSort these.\n\n### Input:\n3, 1, 2\n\n### Response:\n1, 2, 3" in text
    assert ids[0] == tok.bos_token_id and ids[-1] == tok.eos_token_id
    # exactly the response and EOS carry a loss
    response = [*list(tok("1, 2, 3", add_special_tokens=False)["input_ids"]), tok.eos_token_id]
    assert [int(x) for x in labels if x != IGNORE_INDEX] == response
    assert labels[0] == IGNORE_INDEX
    no_input = tok.decode(data.input_ids[0])
    assert "### Input:" not in no_input


def test_full_loss_by_default(tiny_tokenizer, dataset, tmp_path) -> None:
    data = prepare(DataConfig(dataset=str(dataset)), tiny_tokenizer, tmp_path / "data")
    for ids, labels in zip(data.input_ids, data.labels, strict=True):
        assert np.array_equal(ids, labels)


def test_packing_makes_full_blocks(tiny_tokenizer, tmp_path) -> None:
    cfg = DataConfig(max_seq_len=64, packing=True)  # the shipped dataset
    data = prepare(cfg, tiny_tokenizer, tmp_path / "data")
    assert data.meta["sequences"] > 100
    assert {len(x) for x in data.input_ids} == {64}
    unpacked = prepare(DataConfig(max_seq_len=100_000), tiny_tokenizer, tmp_path / "data")
    total = sum(len(x) for x in unpacked.input_ids)
    assert data.meta["tokens"] + data.meta["tokens_dropped"] == total
    assert data.meta["tokens_dropped"] < 64


def test_truncation_and_fully_masked_examples(tiny_tokenizer, dataset, tmp_path) -> None:
    data = prepare(
        DataConfig(dataset=str(dataset), max_seq_len=20), tiny_tokenizer, tmp_path / "d1"
    )
    assert all(len(x) <= 20 for x in data.input_ids)
    assert data.meta["examples_truncated"] == 3
    # with the prompt masked, a prompt longer than max_seq_len leaves nothing to learn
    masked = DataConfig(dataset=str(dataset), max_seq_len=20, completion_only_loss=True)
    with pytest.raises(SpecError, match="no example is left after truncating to max_seq_len 20"):
        prepare(masked, tiny_tokenizer, tmp_path / "d2")


def test_cache_is_reused_and_keyed_by_content(tiny_tokenizer, dataset, tmp_path) -> None:
    cfg = DataConfig(dataset=str(dataset), max_seq_len=128)
    first = prepare(cfg, tiny_tokenizer, tmp_path / "data")
    second = prepare(cfg, tiny_tokenizer, tmp_path / "data")
    assert second.meta["cache_hit"] is True
    assert second.meta["cache_key"] == first.meta["cache_key"]
    assert [x.tolist() for x in second.input_ids] == [x.tolist() for x in first.input_ids]
    # the same content under another name: the same key
    (tmp_path / "copy").mkdir()
    copy = write_jsonl(tmp_path / "copy" / "other-name.jsonl", RECORDS)
    assert prepare(
        DataConfig(dataset=str(copy), max_seq_len=128), tiny_tokenizer, tmp_path / "data"
    ).meta["cache_hit"]
    # changed content, sequence length or masking: a new key
    write_jsonl(dataset, [*RECORDS, {"instruction": "x", "input": "", "output": "y"}])
    assert not prepare(cfg, tiny_tokenizer, tmp_path / "data").meta["cache_hit"]
    assert not prepare(
        DataConfig(dataset=str(dataset), max_seq_len=64), tiny_tokenizer, tmp_path / "data"
    ).meta["cache_hit"]
    assert len(list((tmp_path / "data").iterdir())) == 3 + 3  # folders and their lock files


def test_chat_formatting_masks_assistant_turns(tiny_tokenizer, tmp_path) -> None:
    records = [
        {
            "messages": [
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello there"},
                {"role": "user", "content": "Bye"},
                {"role": "assistant", "content": "Goodbye"},
            ]
        }
    ]
    path = write_jsonl(tmp_path / "chat.jsonl", records)
    cfg = DataConfig(dataset=str(path), formatting="chat", completion_only_loss=True)
    data = prepare(cfg, tiny_tokenizer, tmp_path / "data")
    kept = tiny_tokenizer.decode([int(t) for t in data.labels[0] if t != IGNORE_INDEX])
    assert "Hello there" in kept and "Goodbye" in kept
    assert "Hi" not in kept and "Bye" not in kept


def test_chat_formatting_from_instruction_records(tiny_tokenizer, dataset, tmp_path) -> None:
    data = prepare(
        DataConfig(dataset=str(dataset), formatting="chat"), tiny_tokenizer, tmp_path / "data"
    )
    text = tiny_tokenizer.decode(data.input_ids[1])
    assert "<|user|>\nSort these.\n\n3, 1, 2" in text and "<|assistant|>\n1, 2, 3" in text


def test_template_formatting_like_the_predecessor(tiny_tokenizer, dataset, tmp_path) -> None:
    template = "{% for m in messages %}Q: {{ m['instruction'] }}\nA: {{ m['output'] }}{{ eos_token }}{% endfor %}"
    cfg = DataConfig(
        dataset=str(dataset),
        formatting="template",
        chat_template=template,
        response_template="\nA:",
        completion_only_loss=True,
    )
    data = prepare(cfg, tiny_tokenizer, tmp_path / "data")
    assert tiny_tokenizer.decode(data.input_ids[0]).startswith("<s>Q: Add 2 and 3.\nA: 5</s>")
    kept = tiny_tokenizer.decode([int(t) for t in data.labels[0] if t != IGNORE_INDEX])
    assert kept.strip() == "5</s>"


def test_text_formatting(tiny_tokenizer, tmp_path) -> None:
    path = write_jsonl(tmp_path / "t.jsonl", [{"body": "plain text here"}])
    data = prepare(
        DataConfig(dataset=str(path), formatting="text", text_field="body"),
        tiny_tokenizer,
        tmp_path / "d",
    )
    assert tiny_tokenizer.decode(data.input_ids[0]) == "<s>plain text here</s>"


def test_csv_and_json_files(tiny_tokenizer, tmp_path) -> None:
    csv_path = tmp_path / "d.csv"
    csv_path.write_text("instruction,input,output\nSay hi,,hi\n")
    json_path = tmp_path / "d.json"
    json_path.write_text(json.dumps(RECORDS))
    assert (
        prepare(DataConfig(dataset=str(csv_path)), tiny_tokenizer, tmp_path / "d").meta["sequences"]
        == 1
    )
    assert (
        prepare(DataConfig(dataset=str(json_path)), tiny_tokenizer, tmp_path / "d").meta[
            "sequences"
        ]
        == 3
    )


@pytest.mark.parametrize(
    ("records", "cfg", "message"),
    [
        (
            [{"prompt": "a", "reply": "b"}],
            {},
            "dataset field 'instruction' not found in record 0; its fields: prompt, reply",
        ),
        ([{"instruction": "a", "input": ""}], {}, "dataset field 'output' not found in record 0"),
        (
            [{"text": "a"}],
            {
                "formatting": "template",
                "chat_template": "{{ messages[0].text }}",
                "response_template": "###",
                "completion_only_loss": True,
            },
            "does not occur in the formatted text",
        ),
    ],
)
def test_bad_data(tiny_tokenizer, tmp_path, records, cfg, message) -> None:
    path = write_jsonl(tmp_path / "bad.jsonl", records)
    with pytest.raises(SpecError, match=message):
        prepare(DataConfig(dataset=str(path), **cfg), tiny_tokenizer, tmp_path / "data")


def test_missing_and_broken_files(tiny_tokenizer, tmp_path) -> None:
    with pytest.raises(SpecError, match="dataset file not found"):
        prepare(DataConfig(dataset=str(tmp_path / "none.jsonl")), tiny_tokenizer, tmp_path / "d")
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"instruction": "a"}\n{not json\n')
    with pytest.raises(SpecError, match=r"broken\.jsonl:2: not valid JSON"):
        prepare(DataConfig(dataset=str(broken)), tiny_tokenizer, tmp_path / "d")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(SpecError, match="has no records"):
        prepare(DataConfig(dataset=str(empty)), tiny_tokenizer, tmp_path / "d")


def test_no_data_processing_uses_the_file_as_it_is(tiny_tokenizer, tmp_path) -> None:
    path = write_jsonl(
        tmp_path / "tok.jsonl",
        [{"input_ids": [1, 5, 6, 7]}, {"input_ids": [1, 8], "labels": [-100, 8]}],
    )
    data = load_unprocessed(DataConfig(dataset=str(path), max_seq_len=3), tiny_tokenizer)
    assert [x.tolist() for x in data.input_ids] == [[1, 5, 6], [1, 8]]
    assert [x.tolist() for x in data.labels] == [[1, 5, 6], [-100, 8]]
    assert data.meta["processing"] == "none" and data.meta["cache_path"] is None
    assert not (tmp_path / "data").exists()


def test_collator_pads_and_counts_real_tokens() -> None:
    collate = Collator(pad_token_id=0)
    batch = collate(
        [
            {"input_ids": np.array([5, 6, 7]), "labels": np.array([5, 6, 7])},
            {"input_ids": np.array([8]), "labels": np.array([-100])},
        ]
    )
    assert batch["input_ids"].tolist() == [[5, 6, 7], [8, 0, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch["labels"].tolist() == [[5, 6, 7], [-100, -100, -100]]
    assert batch["num_real_tokens"] == 4 == int(batch["attention_mask"].sum())
    assert batch["num_padded_tokens"] == 6
    assert batch["real_lengths"] == [3, 1]  # each row's real length, for attention FLOPs
    assert next(iter(batch)) == "input_ids"  # accelerate reads the batch size from the first key
    wide = Collator(pad_token_id=0, pad_to_multiple_of=8)(
        [{"input_ids": np.array([1, 2, 3]), "labels": np.array([1, 2, 3])}]
    )
    assert wide["input_ids"].shape == (1, 8) and wide["num_padded_tokens"] == 8


def test_collator_reports_a_packed_row_as_one_full_length_sequence(
    tiny_tokenizer, tmp_path
) -> None:
    # packing keeps no document boundaries (no per-document position ids), so every
    # token of a packed row attends across the whole row: its length is the row's
    data = prepare(DataConfig(max_seq_len=64, packing=True), tiny_tokenizer, tmp_path / "data")
    rows = [{"input_ids": data.input_ids[i], "labels": data.labels[i]} for i in range(3)]
    batch = Collator(pad_token_id=0)(rows)
    assert set(batch) == {
        "input_ids",
        "attention_mask",
        "labels",
        "num_real_tokens",
        "num_padded_tokens",
        "real_lengths",
    }
    assert batch["real_lengths"] == [64, 64, 64] and batch["num_real_tokens"] == 192
    assert int(batch["attention_mask"].sum()) == 192


# ---------------------------------------------------------------------------
# The cache shared by the ranks of a job and the jobs of a results folder
# ---------------------------------------------------------------------------


def _entries(data_dir: Path) -> tuple[list[str], list[str]]:
    """(published entries, private build folders) under ``data_dir``."""
    folders = [p.name for p in data_dir.iterdir() if p.is_dir()]
    return sorted(f for f in folders if not f.startswith(".")), sorted(
        f for f in folders if f.startswith(".")
    )


def test_the_loser_of_a_cache_race_takes_the_winners_entry(
    tiny_tokenizer, dataset, tmp_path, monkeypatch
) -> None:
    # another job (on a file system whose lock did not keep it out) publishes the same
    # entry while this one tokenizes: this one's rename meets a finished folder
    from trainer_entry.data import cache
    from trainer_entry.data import prepare as prepare_module

    data_dir = tmp_path / "data"
    cfg = DataConfig(dataset=str(dataset), max_seq_len=128)
    real = prepare_module.tokenize_records

    def tokenize_and_lose(records, cfg, tokenizer, meta):
        data = real(records, cfg, tokenizer, meta)
        winner = tmp_path / "winner"
        winner.mkdir()
        cache.save(winner, data)
        (winner / "won").write_text("")
        winner.rename(data_dir / meta["cache_key"])
        return data

    monkeypatch.setattr(prepare_module, "tokenize_records", tokenize_and_lose)
    data = prepare(cfg, tiny_tokenizer, data_dir)
    assert data.meta["cache_hit"] is False and data.meta["sequences"] == 3
    (entry,) = _entries(data_dir)[0]
    assert (data_dir / entry / "won").exists()  # the winner's folder was kept
    assert _entries(data_dir)[1] == []  # and this one's private folder removed
    monkeypatch.setattr(prepare_module, "tokenize_records", real)
    assert prepare(cfg, tiny_tokenizer, data_dir).meta["cache_hit"] is True


def test_a_half_written_cache_entry_is_not_taken_but_replaced(
    tiny_tokenizer, dataset, tmp_path
) -> None:
    data_dir = tmp_path / "data"
    cfg = DataConfig(dataset=str(dataset), max_seq_len=128)
    key = prepare(cfg, tiny_tokenizer, data_dir).meta["cache_key"]
    (data_dir / key / "meta.json").unlink()  # a copy cut short: no meta.json, written last
    again = prepare(cfg, tiny_tokenizer, data_dir)
    assert again.meta["cache_hit"] is False and again.meta["sequences"] == 3
    assert (data_dir / key / "meta.json").is_file()
    assert _entries(data_dir) == ([key], [])


def test_a_failed_preparation_leaves_no_folder(tiny_tokenizer, tmp_path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", [{"instruction": "x", "output": "y"}])
    data_dir = tmp_path / "data"
    with pytest.raises(SpecError, match="dataset field 'text' not found in record 0"):
        prepare(DataConfig(dataset=str(path), formatting="text"), tiny_tokenizer, data_dir)
    assert _entries(data_dir) == ([], [])


def test_a_cache_entry_is_readable_by_the_other_users_of_the_folder(
    tiny_tokenizer, dataset, tmp_path
) -> None:
    import os
    import stat

    old = os.umask(0o022)
    try:
        data = prepare(DataConfig(dataset=str(dataset)), tiny_tokenizer, tmp_path / "data")
    finally:
        os.umask(old)
    folder = Path(data.meta["cache_path"])
    assert stat.S_IMODE(folder.stat().st_mode) == 0o755  # not mkdtemp's 0o700
    lock = folder.parent / f".{folder.name}.lock"
    assert stat.S_IMODE(lock.stat().st_mode) == 0o644


def test_without_a_working_lock_the_cache_still_works(
    tiny_tokenizer, dataset, tmp_path, monkeypatch
) -> None:
    import errno

    from trainer_entry import buildonce

    def no_lock(fd: int, op: int) -> None:
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(buildonce.fcntl, "flock", no_lock)
    cfg = DataConfig(dataset=str(dataset))
    assert prepare(cfg, tiny_tokenizer, tmp_path / "data").meta["cache_hit"] is False
    assert prepare(cfg, tiny_tokenizer, tmp_path / "data").meta["cache_hit"] is True
