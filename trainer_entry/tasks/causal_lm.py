"""``causal-lm``: next-token prediction on text, the default task.

The data steps are ``trainer_entry.data`` (formatting, tokenizing, packing,
the cache); a sample is a sequence (a packed row when packing); every module
runs once per token (the LM head included).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch

from trainer_entry.data.collate import Collator, SequenceDataset
from trainer_entry.data.holdout import pack_part, split_sequences
from trainer_entry.data.prepare import load_unprocessed, prepare
from trainer_entry.settings.parsed import ParsedArguments
from trainer_entry.tasks.task_protocol import TaskData, TaskDefaults


class CausalLMTask(TaskDefaults):
    name = "causal-lm"
    sample_unit = "sequences"
    modality = "text"
    auto_class = "AutoModelForCausalLM"
    tokenizer_model: str | None = "tiny-llama"
    loss_counts_items = True

    def peft_task_type(self) -> str | None:
        return "CAUSAL_LM"

    def prepare(
        self,
        parsed: ParsedArguments,
        processor: Any,
        data_dir: Path,
        *,
        as_given: bool,
        model_config: Any = None,
    ) -> TaskData:
        # the trainer backend's data settings (``TrainerBackend.data_settings``: TRL
        # truncates and packs itself)
        cfg = parsed.data
        split = parsed.evaluation.enabled
        # eval: split documents, then pack each part, so no document is in both
        load_cfg = (
            dataclasses.replace(cfg, packing=False, truncate=False)
            if split and cfg.packing
            else cfg
        )
        data = (
            load_unprocessed(load_cfg, processor)
            if as_given
            else prepare(load_cfg, processor, data_dir)
        )
        if not split:
            return TaskData(examples=data, meta=data.meta)
        train, held = split_sequences(data, parsed.evaluation.holdout)
        if cfg.packing:
            train = pack_part(train, cfg, "the part trained on")
            held = pack_part(held, cfg, "the held-out part")
        return TaskData(examples=train, meta=train.meta, eval_examples=held)

    def dataset(self, data: TaskData) -> torch.utils.data.Dataset[Any]:
        return SequenceDataset(data.examples)

    def collator(self, processor: Any, parsed: ParsedArguments) -> Any:
        return Collator(processor.pad_token_id, parsed.pad_to_multiple_of)
