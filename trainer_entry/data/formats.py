"""How a record becomes a prompt and a response: the formattings a dataset is trained in.

- ``instruct`` (default): Alpaca-style prompt from ``instruction``/``input``
  fields, the ``output`` field as the response;
- ``chat``: a ``messages`` list (role/content) through the tokenizer's chat
  template (or ``chat_template``); records without one are turned into a
  user/assistant exchange from their instruction fields;
- ``text``: the ``dataset_text_field`` as it is;
- ``template``: a Jinja template rendered with ``messages=[record]``, the
  predecessor's ``data_processing.chat_template``.

Text only: no tokenizer is needed here except the special tokens a template
may print. ``trainer_entry.data.tokenize`` turns the text into token ids.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trainer_entry.spec_errors import SpecError

if TYPE_CHECKING:
    from trainer_entry.settings.parsed import DataConfig

#: every ``formatting`` a scenario may name
FORMATTINGS = ("instruct", "chat", "text", "template")

#: the label of a position that carries no loss (the prompt, padding)
IGNORE_INDEX = -100

INSTRUCT_PROMPT = (
    "Below is an instruction that describes a task, paired with an input that provides "
    "further context. Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n"
)
INSTRUCT_PROMPT_NO_INPUT = (
    "Below is an instruction that describes a task. Write a response that appropriately "
    "completes the request.\n\n### Instruction:\n{instruction}\n\n### Response:\n"
)


def field(record: dict[str, Any], name: str, index: int) -> str:
    """The text of field ``name`` of record ``index`` (None as empty); an error names its fields."""
    if name not in record:
        fields = ", ".join(sorted(map(str, record))) or "none"
        raise SpecError(f"dataset field '{name}' not found in record {index}; its fields: {fields}")
    value = record[name]
    return "" if value is None else str(value)


def instruct_parts(record: dict[str, Any], index: int, cfg: DataConfig) -> tuple[str, str]:
    """(prompt, response) of a record in the ``instruct`` formatting."""
    instruction = field(record, cfg.instruction_field, index)
    extra = str(record.get(cfg.input_field) or "")
    template = INSTRUCT_PROMPT if extra else INSTRUCT_PROMPT_NO_INPUT
    prompt = template.format(instruction=instruction, input=extra)
    return prompt, field(record, cfg.response_field, index)


def chat_messages(record: dict[str, Any], index: int, cfg: DataConfig) -> list[dict[str, Any]]:
    """The conversation of a record in the ``chat`` formatting.

    Its ``messages_field`` when it has one, else a user/assistant exchange made
    from its instruction fields.
    """
    messages = record.get(cfg.messages_field)
    if messages is None:
        instruction = field(record, cfg.instruction_field, index)
        extra = str(record.get(cfg.input_field) or "")
        messages = [
            {"role": "user", "content": instruction + (f"\n\n{extra}" if extra else "")},
            {"role": "assistant", "content": field(record, cfg.response_field, index)},
        ]
    if not isinstance(messages, list) or not all(
        isinstance(m, dict) and "role" in m and "content" in m for m in messages
    ):
        raise SpecError(
            f"record {index}: '{cfg.messages_field}' must be a list of {{role, content}}"
        )
    return messages


def render_template(record: dict[str, Any], cfg: DataConfig, tokenizer: Any, env: Any) -> str:
    """The text of a record in the ``template`` formatting (``env``: a sandboxed Jinja one)."""
    assert cfg.chat_template is not None
    text: str = env.from_string(cfg.chat_template).render(
        messages=[record],
        eos_token=tokenizer.eos_token or "",
        bos_token=tokenizer.bos_token or "",
    )
    return text


def split_at_response(text: str, index: int, cfg: DataConfig) -> tuple[str, str]:
    """(prompt, response) of a ``template`` text: cut after the last ``response_template``."""
    assert cfg.response_template is not None
    cut = text.rfind(cfg.response_template)
    if cut < 0:
        raise SpecError(
            f"record {index}: the response_template {cfg.response_template!r} does not "
            "occur in the formatted text, so the prompt cannot be masked"
        )
    cut += len(cfg.response_template)
    return text[:cut], text[cut:]


def check_tokenizer(cfg: DataConfig, tokenizer: Any) -> None:
    """What only the tokenizer can tell (the rest is checked when the arguments are parsed)."""
    if cfg.formatting == "chat" and not (
        cfg.chat_template or getattr(tokenizer, "chat_template", None)
    ):
        raise SpecError(
            "formatting 'chat' needs a chat template: the tokenizer has none; set chat_template"
        )
