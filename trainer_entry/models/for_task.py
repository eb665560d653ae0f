"""What loading a model needs to know of the task it is trained for.

``trainer_entry.tasks.task_protocol.Task`` extends this protocol: the models
package knows a task only through it, so it never imports the tasks.
"""

from __future__ import annotations

from typing import Any, Protocol

#: the modalities whose models come with a processor (``AutoProcessor``: a feature or
#: image processor with the tokenizer) rather than a tokenizer alone
PROCESSOR_MODALITIES = ("audio", "image-text")


class ModelTask(Protocol):
    #: the task's name, as a scenario writes it
    name: str
    #: ``text``: a tokenizer comes with the model; ``image``: pixels, no tokenizer; one of
    #: ``PROCESSOR_MODALITIES`` (``audio``, ``image-text``): a processor
    modality: str
    #: the embedded tiny model whose tokenizer a model built here (``config:``,
    #: ``python:``) takes unless the scenario names one; None: no tokenizer
    tokenizer_model: str | None

    def model_class(self) -> Any:
        """The transformers auto class a model of this task is loaded as."""
        ...

    def peft_task_type(self) -> str | None:
        """PEFT's ``task_type`` under LoRA (None: a plain ``PeftModel``)."""
        ...

    def head_modules(self, model: Any) -> list[str]:
        """Modules trained in full under LoRA (a new classifier head); [] for none."""
        ...
