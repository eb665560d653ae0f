"""What a run is set to do, parsed from its spec: the model, data, PEFT, measurement
and eval settings, and the trainer backend's own arguments (``ParsedArguments``).

Plain types that import nothing else of the child, so every stage of a run can
name them; ``trainer_entry.run.parse`` fills them from a spec.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from orchestrator.contract.applicability import DEFAULT_TASK, default_backend

#: the trainer backend a run uses when its scenario names none (the default task's)
DEFAULT_BACKEND = default_backend(DEFAULT_TASK)


@dataclass(frozen=True)
class DataConfig:
    """How to turn a dataset into training sequences (see ``trainer_entry.data``)."""

    #: local .jsonl/.json/.csv file, or a Hugging Face datasets name; None: the shipped one
    dataset: str | None = None
    split: str = "train"
    formatting: str = "instruct"
    instruction_field: str = "instruction"
    input_field: str = "input"
    response_field: str = "output"
    text_field: str = "text"
    #: classification: the field holding the class (a name or an integer)
    label_field: str = "label"
    #: image classification: the field holding the image
    image_field: str = "image"
    #: seq2seq-lm: the fields holding the source text (the encoder's) and the target text
    #: (the decoder's labels)
    source_field: str = "source"
    target_field: str = "target"
    #: masked-lm: the share of each text's tokens masked for the loss
    mlm_probability: float = 0.15
    #: speech-recognition: the field holding the audio (its transcript: ``text_field``)
    audio_field: str = "audio"
    messages_field: str = "messages"
    chat_template: str | None = None
    response_template: str | None = None
    #: compute the loss on responses only (prompts masked with -100)
    completion_only_loss: bool = False
    max_seq_len: int = 512
    packing: bool = False
    dataset_kwargs: dict[str, Any] = field(default_factory=dict)
    #: False: sequences are left whole, none dropped (the trainer truncates: ``sft``); not a
    #: scenario setting
    truncate: bool = True


@dataclass(frozen=True)
class ModelConfig:
    name: str
    tokenizer: str | None = None
    dtype: str | None = None
    attn_implementation: str | None = None
    trust_remote_code: bool = False
    revision: str | None = None
    #: keyword arguments for a ``python:`` model's factory
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class PeftConfig:
    method: str | None = None  # None (full fine-tuning), "lora" or "qlora"
    r: int = 8
    lora_alpha: float = 16
    lora_dropout: float = 0.0
    target_modules: list[str] | str | None = None
    bias: str = "none"
    modules_to_save: list[str] | None = None


@dataclass(frozen=True)
class MeasureConfig:
    #: steps left out of throughput; None: max(3, 10% of the steps)
    warmup_steps_excluded: int | None = None
    #: override the device's peak for MFU (TFLOP/s per device)
    peak_tflops_per_device: float | None = None
    #: false: no step timing, token counting or memory metrics (to measure their cost)
    instrumentation: bool = True


@dataclass(frozen=True)
class EvalConfig:
    """Eval after training (``trainer_entry.results.evaluate``), on a held-out split of the data."""

    #: ``eval: true``: hold out part of the prepared data and evaluate on it after training
    enabled: bool = False
    #: how many examples are held out: a count (≥ 1) or a fraction in (0, 1); None: 10%,
    #: at most 256 (``trainer_entry.data.holdout``)
    holdout: int | float | None = None


@dataclass
class ParsedArguments:
    model: ModelConfig
    data: DataConfig
    peft: PeftConfig
    measure: MeasureConfig
    #: the trainer backend's own arguments
    training: dict[str, Any]
    pad_to_multiple_of: int | None = None
    notes: list[str] = field(default_factory=list)
    #: the trainer backend (``trainer_entry.backends``)
    backend: str = DEFAULT_BACKEND
    #: what the run trains (``trainer_entry.tasks``)
    task: str = DEFAULT_TASK
    #: eval after training (``eval``, ``holdout``)
    evaluation: EvalConfig = field(default_factory=EvalConfig)
