"""The tasks a run can train and the trainer backends that train them, each declared once.

The planner checks a scenario's ``task`` and ``trainer`` against these
declarations before any job starts; the child's registries
(``trainer_entry.tasks``, ``trainer_entry.backends``) import a task's or a
backend's module from its line here, and the child's check before the training
stack loads (``trainer_entry.run.preflight``) reads what a backend needs.
Pure: nothing imported beyond the standard library.

To add a task: write its module, a class implementing
``trainer_entry.tasks.task_protocol.Task``, and add one ``TaskLine`` to
``TASK_LINES`` (its name, module, what its tokens and samples are, the settings
that mean something for it alone, the counts it reports beside tokens). To add a trainer
backend: write its module, a class implementing
``trainer_entry.backends.trainer_protocol.TrainerBackend``, and add one
``Trainer`` line to ``TRAINERS``. Order matters once in each: the first task is
the default, and a task's default backend is the first line that trains it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

#: names what the run trains: its model class, data, collator, FLOPs and throughput unit
TASK_KEY = "task"

#: the counts a task may report beside tokens and samples, each a throughput column
#: ``<name>_per_second_global`` (``ChildMetrics``), and what one unit is
COUNT_UNITS: dict[str, str] = {
    "source_tokens": "real tokens of the encoder's input (the source text)",
    "target_tokens": "real tokens of the decoder's labels (the target text, the transcript)",
    "audio_seconds": "seconds of real audio the model read (not its padding; a clip longer "
    "than the model's window counts the window)",
    "image_tokens": "positions the images fill in the language model's sequence",
    "text_tokens": "real text tokens of the language model's sequence (images excluded)",
}


def count_column(count: str) -> str:
    """The throughput column of a count of ``COUNT_UNITS``: per second, all processes."""
    return f"{count}_per_second_global"


@dataclass(frozen=True)
class TaskLine:
    """A task as the planner and the report know it: one line per task.

    Everything outside a task's own module reads the task from here: which
    settings mean something for it, what its tokens and samples are, which
    counts it reports beside them.
    """

    name: str
    """The ``task`` argument's value that chooses it."""
    implementation: str
    """``module:Class`` of its ``Task``; only the child imports it."""
    token: str
    """What one token of tokens/s is (the reading guide and the column's meaning)."""
    sample: str
    """What one sample of samples/s is, plural (``sequences``, ``images``)."""
    settings: tuple[str, ...] = ()
    """The data settings (canonical names) that mean something for this task besides the
    ones every text task reads (``text`` below)."""
    text: bool = True
    """It reads text: ``text_field``, a tokenizer, ``max_seq_len``, ``pad_to_multiple_of``."""
    not_read: tuple[str, ...] = ()
    """Of the text settings, those it does not read (refused like any setting of other
    tasks): seq2seq-lm's text is in ``source_field`` and ``target_field``."""
    classifies: bool = False
    """It learns one class per sample (``label_field``; eval accuracy)."""
    counts: tuple[str, ...] = ()
    """The counts (of ``COUNT_UNITS``) it reports beside tokens and samples."""
    samples_first: bool = False
    """Samples/s is its headline figure next to tokens/s (classification, speech)."""
    fixed_shape: bool = False
    """Every micro-batch has one shape whatever the data (images at the model's size): a
    memory prediction of it is the batch that runs, not a bound."""
    unused_parameters: bool = False
    """Some trained parameters take no part in a step's loss (a vision tower's layers past
    the one the projector reads): DDP must look for them (``ddp_find_unused_parameters``),
    as TRL sets it for such models, unless the scenario says otherwise."""


#: every task, the default first (only the child imports their modules)
TASK_LINES: tuple[TaskLine, ...] = (
    TaskLine(
        "causal-lm",
        "trainer_entry.tasks.causal_lm:CausalLMTask",
        token="a real (not padding) token of the sequence fed",
        sample="sequences",
        settings=(
            "formatting",
            "instruction_field",
            "input_field",
            "response_field",
            "messages_field",
            "chat_template",
            "response_template",
            "completion_only_loss",
            "packing",
            "tokenize",
            "data_formatter_template",
        ),
    ),
    TaskLine(
        "seq-classification",
        "trainer_entry.tasks.seq_classification:SeqClassificationTask",
        token="a real (not padding) token of the text classified",
        sample="sequences",
        classifies=True,
        samples_first=True,
    ),
    TaskLine(
        "image-classification",
        "trainer_entry.tasks.image_classification:ImageClassificationTask",
        token="an image patch (a position of the encoder's sequence, the class token included)",
        sample="images",
        settings=("image_field",),
        text=False,
        classifies=True,
        samples_first=True,
        fixed_shape=True,
    ),
    TaskLine(
        "seq2seq-lm",
        "trainer_entry.tasks.seq2seq_lm:Seq2SeqLMTask",
        token="a real (not padding) token of the source or the target; each side is also "
        "counted apart",
        sample="pairs",
        settings=("source_field", "target_field"),
        not_read=("text_field",),
        counts=("source_tokens", "target_tokens"),
    ),
    TaskLine(
        "masked-lm",
        "trainer_entry.tasks.masked_lm:MaskedLMTask",
        token="a real (not padding) token of the text, masked or not (the encoder and its "
        "head run over every one)",
        sample="texts",
        settings=("mlm_probability",),
    ),
    TaskLine(
        "speech-recognition",
        "trainer_entry.tasks.speech_recognition:SpeechRecognitionTask",
        token="a real (not padding) token of the transcript; audio is counted in seconds apart",
        sample="clips",
        settings=("audio_field",),
        not_read=("pad_to_multiple_of",),
        counts=("audio_seconds",),
        samples_first=True,
    ),
    TaskLine(
        "vision-language",
        "trainer_entry.tasks.vision_language:VisionLanguageTask",
        token="a real (not padding) position of the language model's sequence, an image's or "
        "the text's; each kind is also counted apart",
        sample="conversations",
        settings=("image_field", "messages_field"),
        not_read=("text_field", "pad_to_multiple_of"),
        counts=("image_tokens", "text_tokens"),
        unused_parameters=True,
    ),
)
#: every task, the default first -> ``module:Class`` of its ``Task``
TASK_IMPLEMENTATIONS: dict[str, str] = {t.name: t.implementation for t in TASK_LINES}
TASKS = tuple(TASK_IMPLEMENTATIONS)
DEFAULT_TASK = TASKS[0]


def task_line(name: str) -> TaskLine | None:
    """The declaration of task ``name``, or None for a name none has."""
    return next((t for t in TASK_LINES if t.name == name), None)


#: names the child's trainer backend (one of ``TRAINERS``)
BACKEND_KEY = "trainer"

_ASSETS = Path(__file__).resolve().parent / "assets"


@dataclass(frozen=True)
class Trainer:
    """A trainer backend as the planner and the child's registry know it."""

    name: str
    """The ``trainer`` argument's value that chooses it."""
    tasks: tuple[str, ...]
    """The tasks it trains (of ``TASKS``)."""
    implementation: str
    """``module:Class`` of its ``TrainerBackend``; only the child imports it."""
    library: str
    """What it runs, as messages name it (``TRL``)."""
    needs: str | None = None
    """The package it needs besides the training stack, checked before the stack loads."""
    config_class: str = "TrainingArguments"
    """The class its trainer arguments fill, as messages name it."""
    own_fields_file: Path | None = None
    """The saved names of its configuration's fields that ``TrainingArguments`` lacks
    (``{"<needs>": version, "fields": [...]}``; ``python -m trainer_entry.backends``
    rewrites it): arguments only this backend takes."""
    fused_lm_head: bool = False
    """It gives the model TRL's fused LM head before LoRA wraps it, and takes the loss
    through it: the memory prediction builds and runs the model the same way
    (``trainer_entry.run.memoryplan``)."""
    batches_conversations: bool = False
    """Its library batches a conversation task's examples itself (TRL's collator),
    learning every real position (``trainer_entry.tasks.vision_language``)."""


TRAINERS: tuple[Trainer, ...] = (
    Trainer(
        "sft",
        ("causal-lm", "vision-language"),
        "trainer_entry.backends.sft:SFTTrainerBackend",
        library="TRL",
        needs="trl",
        config_class="SFTConfig",
        own_fields_file=_ASSETS / "sft_arguments.json",
        fused_lm_head=True,
        batches_conversations=True,
    ),
    Trainer("hf", TASKS, "trainer_entry.backends.hf:HFTrainerBackend", library="transformers"),
)


def trainer_names() -> tuple[str, ...]:
    """Every backend's name, in declaration order."""
    return tuple(t.name for t in TRAINERS)


def trainer(name: str) -> Trainer | None:
    """The declaration of backend ``name``, or None for a name none has."""
    return next((t for t in TRAINERS if t.name == name), None)


def declared(name: str) -> Trainer:
    """The declaration of backend ``name``; a ``KeyError`` for a name none has."""
    found = trainer(name)
    if found is None:
        raise KeyError(f"no trainer backend {name!r}; the backends are {trainer_names()}")
    return found


def task_backends(task: str) -> tuple[str, ...]:
    """The backends that train ``task``, its default first (none for an unknown task)."""
    return tuple(t.name for t in TRAINERS if task in t.tasks)


def default_backend(task: str) -> str:
    """The trainer backend a run of ``task`` uses when its scenario names none."""
    return (task_backends(task) or task_backends(DEFAULT_TASK))[0]


def own_fields(name: str) -> frozenset[str]:
    """Backend ``name``'s own configuration fields, as saved (none where nothing is saved)."""
    declared = trainer(name)
    if declared is None or declared.own_fields_file is None:
        return frozenset()
    try:
        return frozenset(json.loads(declared.own_fields_file.read_text())["fields"])
    except OSError:
        return frozenset()


def own_fields_version(name: str) -> str:
    """The version of the package whose fields backend ``name``'s saved list holds."""
    declared = trainer(name)
    if declared is None or declared.own_fields_file is None or declared.needs is None:
        return "?"
    return str(json.loads(declared.own_fields_file.read_text()).get(declared.needs, "?"))
