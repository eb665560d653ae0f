"""The ``masked-lm`` task: masking, counts, and FLOPs against PyTorch's counter."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from countedcheck import counted_over_reference, in_mode

from trainer_entry.data.collate import REAL_TOKENS, ROW_DIMS
from trainer_entry.data.formats import IGNORE_INDEX
from trainer_entry.tasks.masked_lm import MaskedLMTask, MaskingCollator

ROWS = [{"tokens": 30}, {"tokens": 9}, {"tokens": 64}]
PAD, MASK, CLS, SEP = 0, 4, 2, 3


def _collator(probability: float = 0.15) -> MaskingCollator:
    return MaskingCollator(
        pad_token_id=PAD,
        mask_token_id=MASK,
        vocab_size=1000,
        special_ids=frozenset({PAD, MASK, CLS, SEP}),
        probability=probability,
    )


def _text(n: int) -> list[int]:
    return [CLS, *range(10, 10 + n), SEP]


def test_only_real_words_are_masked_and_every_row_has_a_loss() -> None:
    torch.manual_seed(0)
    features = [{"input_ids": _text(200)}, {"input_ids": _text(3)}, {"input_ids": _text(1)}]
    batch = _collator()(features)
    labels, ids = batch["labels"], batch["input_ids"]
    chosen = labels != IGNORE_INDEX
    original = torch.full_like(labels, PAD)
    for row, f in enumerate(features):
        original[row, : len(f["input_ids"])] = torch.as_tensor(f["input_ids"])
    # a masked position's label is its original token; specials and padding never masked
    assert torch.equal(labels[chosen], original[chosen])
    assert not chosen[original == PAD].any() and not chosen[original == CLS].any()
    assert not chosen[original == SEP].any()
    assert chosen.any(dim=1).all()  # the short rows too
    # about 15% of the long row's 200 words, most of them the mask token
    share = chosen[0].sum().item() / 200
    assert 0.08 < share < 0.22
    assert (ids[0][chosen[0]] == MASK).float().mean() > 0.6
    # unmasked positions keep their token
    assert torch.equal(ids[~chosen], original[~chosen])
    assert batch[REAL_TOKENS] == 202 + 5 + 3 and batch[ROW_DIMS] == {"tokens": [202, 5, 3]}


def test_the_share_follows_mlm_probability() -> None:
    torch.manual_seed(1)
    batch = _collator(0.5)([{"input_ids": _text(400)}])
    share = (batch["labels"] != IGNORE_INDEX).sum().item() / 400
    assert 0.42 < share < 0.58


def _model(mode: str, folder: Path):
    from transformers import AutoModelForMaskedLM

    torch.manual_seed(0)
    model = AutoModelForMaskedLM.from_pretrained(folder, attn_implementation="eager")
    return in_mode(model, MaskedLMTask(), mode, ["query", "value"])


@pytest.mark.parametrize("mode", ["full", "lora", "checkpointed"])
def test_counted_flops_match_the_flop_counter(mode: str) -> None:
    """The tiny BERT with its new MLM head; the shipped bert-base and roberta-base are the
    same model types, their structure checked by seq-classification's tests."""
    from trainer_entry.models.tiny_bert import ensure_tiny_bert

    model = _model(mode, ensure_tiny_bert())
    ratio = counted_over_reference(
        MaskedLMTask(), model, ROWS, checkpointing=mode == "checkpointed"
    )
    assert ratio == pytest.approx(1.0, rel=0.10)
    assert ratio == pytest.approx(1.0, rel=1e-6)


def test_a_tokenizer_without_a_mask_token_is_refused(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from trainer_entry.settings.parsed import DataConfig
    from trainer_entry.spec_errors import SpecError

    parsed = SimpleNamespace(data=DataConfig(), evaluation=SimpleNamespace(enabled=False))
    tokenizer = SimpleNamespace(pad_token_id=0, mask_token_id=None)
    with pytest.raises(SpecError, match="mask token"):
        MaskedLMTask().prepare(parsed, tokenizer, tmp_path, as_given=False)  # type: ignore[arg-type]
