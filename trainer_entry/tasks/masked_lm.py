"""``masked-lm``: an encoder (BERT, RoBERTa, DistilBERT) learns to fill in masked tokens.

**Model.** ``AutoModelForMaskedLM``: the encoder and its MLM head (a
checkpoint saved as the encoder alone, ``tiny-bert``, gets a new head). Under
LoRA a plain ``PeftModel``. A ``config:`` model (``config:bert-base-uncased``)
takes ``tiny-bert``'s tokenizer unless the scenario names one; the tokenizer
must have a mask token.

**Data.** Plain text: the shipped review set's texts when the scenario names
no dataset, else a local file or hub dataset whose records hold a
``text_field`` (default ``text``); a ``.txt`` file gives one text per line.
Each text is tokenized with the tokenizer's special tokens and cut to
``max_seq_len``, and cached like seq-classification's texts (prefix
``mlm1-``).

**Masking.** As BERT was trained, each micro-batch masks ``mlm_probability``
(default 0.15) of each text's real tokens (special tokens never): 80% of those
become the mask token, 10% a random token, 10% stay; the loss is on them
alone. At least one token per row is masked, so no row is without a loss. The
draws follow the trainer's seed.

**Counts.** A sample is a text; a token is a real (not padding) token of
it: the encoder runs over every one, and the MLM head too (transformers runs
it on every position), so tokens/s counts them all, masked or not. The data
record's ``label_tokens`` is the expected number masked.

**FLOPs.** Counted (``trainer_entry.measure.counted``) along the text's
length; split by part (encoder, head).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from trainer_entry.data.collate import ROW_DIMS, padded_batch
from trainer_entry.data.formats import IGNORE_INDEX
from trainer_entry.data.sources import load_records
from trainer_entry.settings.parsed import ParsedArguments
from trainer_entry.spec_errors import SpecError
from trainer_entry.tasks.seq_classification import (
    ClassifiedTexts,
    check_positions,
    data_config,
    prepare_texts,
    texts_as_given,
)
from trainer_entry.tasks.task_protocol import (
    ColumnDataset,
    ReadOnce,
    TaskData,
    TaskDefaults,
    refuse_for_texts,
    with_split_sequences,
)

#: the cache folder's prefix (the texts are kept as seq-classification keeps them)
CACHE_PREFIX = "mlm1-"
#: what a masked token becomes: the mask token, a random token, itself
MASK_SHARE, RANDOM_SHARE = 0.8, 0.1


@dataclass
class MaskingCollator:
    """Right-pads a batch of texts and masks a share of each row's real tokens.

    ``labels`` hold the original token where masked, ``IGNORE_INDEX`` elsewhere. The
    counts are those of ``trainer_entry.data.collate.padded_batch``, and each row's
    length along ``tokens`` for the counted FLOPs.
    """

    pad_token_id: int
    mask_token_id: int
    vocab_size: int
    special_ids: frozenset[int]
    probability: float
    pad_to_multiple_of: int | None = None

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        batch = padded_batch(features, self.pad_token_id, self.pad_to_multiple_of)
        ids = batch["input_ids"]
        real = batch["attention_mask"].bool()
        special = torch.zeros_like(real)
        for token in self.special_ids:
            special |= ids == token
        candidates = real & ~special
        chosen = (torch.rand(ids.shape) < self.probability) & candidates
        for row in range(ids.shape[0]):
            # every row gets a loss: its first candidate when the draw masked none
            if not chosen[row].any() and candidates[row].any():
                chosen[row, int(candidates[row].nonzero()[0])] = True
        labels = torch.where(chosen, ids, torch.full_like(ids, IGNORE_INDEX))
        draw = torch.rand(ids.shape)
        masked = ids.clone()
        masked[chosen & (draw < MASK_SHARE)] = self.mask_token_id
        swap = chosen & (draw >= MASK_SHARE) & (draw < MASK_SHARE + RANDOM_SHARE)
        masked[swap] = torch.randint(self.vocab_size, ids.shape)[swap]
        return {
            **batch,
            "input_ids": masked,
            "labels": labels,
            ROW_DIMS: {"tokens": list(batch["real_lengths"])},
        }


class MaskedLMTask(TaskDefaults):
    name = "masked-lm"
    sample_unit = "texts"
    modality = "text"
    auto_class = "AutoModelForMaskedLM"
    tokenizer_model: str | None = "tiny-bert"
    #: False: BERT's MLM loss is the mean over the micro-batch's masked tokens
    loss_counts_items = False
    flop_dims: tuple[str, ...] = ("tokens",)

    def __init__(self) -> None:
        self._records = ReadOnce(load_records)

    def prepare(
        self,
        parsed: ParsedArguments,
        processor: Any,
        data_dir: Path,
        *,
        as_given: bool,
        model_config: Any = None,
    ) -> TaskData:
        cfg = data_config(parsed.data)
        refuse_for_texts(cfg, processor, self.name, "on masked tokens")
        if processor.mask_token_id is None:
            raise SpecError(
                "masked-lm needs a tokenizer with a mask token; this one has none "
                "(set tokenizer_name_or_path to one that has)"
            )
        records, source = self._records(cfg)
        # the texts are kept as seq-classification keeps them, without classes
        data = (
            texts_as_given(cfg, processor, records, source, labelled=False)
            if as_given
            else prepare_texts(
                cfg, processor, data_dir, records, source, prefix=CACHE_PREFIX, labelled=False
            )
        )
        check_positions(data, model_config, "a text")
        task_data = with_split_sequences(data, parsed)  # one text is one document
        specials = int(processor.num_special_tokens_to_add())
        # of the part trained on (the whole without eval)
        self._expected_masked(task_data.examples, cfg.mlm_probability, specials)
        return task_data

    @staticmethod
    def _expected_masked(data: ClassifiedTexts, share: float, specials: int) -> None:
        """``label_tokens``: the expected number masked: ``share`` of each text's words (its
        tokens less the special ones, which are never masked), at least one per text."""
        expected = sum(max(1.0, share * max(0, len(x) - specials)) for x in data.input_ids)
        data.meta["label_tokens"] = round(expected)

    def dataset(self, data: TaskData) -> torch.utils.data.Dataset[Any]:
        return ColumnDataset(input_ids=data.examples.input_ids)

    def collator(self, processor: Any, parsed: ParsedArguments) -> Any:
        return MaskingCollator(
            pad_token_id=processor.pad_token_id,
            mask_token_id=processor.mask_token_id,
            vocab_size=len(processor),
            special_ids=frozenset(int(i) for i in processor.all_special_ids),
            probability=parsed.data.mlm_probability,
            pad_to_multiple_of=parsed.pad_to_multiple_of,
        )
