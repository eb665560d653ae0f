"""The embedded default model ``tiny-llama``: built offline, deterministically, once.

A byte-level BPE tokenizer trained on the shipped instruction dataset and a
two-layer Llama initialised from a fixed seed. Nothing is downloaded. The
first use builds both into a cache folder in a few seconds; later uses load
them. The folder name carries a hash of everything the build depends on, so a
change to the recipe or the dataset builds a new one instead of reusing a
stale one.

Any number of processes may ask for it at once (the ranks of one job, packed
jobs, several users sharing one cache): it is built once and published whole
(``trainer_entry.buildonce``), and a reader takes the folder only with the
``COMPLETE`` marker, which names this recipe's key, inside.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.contract.layout import cache_root
from trainer_entry import ASSETS
from trainer_entry.buildonce import build_once
from trainer_entry.data.formats import INSTRUCT_PROMPT, INSTRUCT_PROMPT_NO_INPUT
from trainer_entry.data.sources import SHIPPED_DATASET

TINY_NAME = "tiny-llama"
#: what the tokenizer is trained on (part of the cache key)
DATASET = SHIPPED_DATASET

# The recipe. Changing any of it changes the cache key.
_RECIPE: dict[str, Any] = {
    "version": 1,
    "seed": 1234,
    "vocab_size": 1024,
    "special_tokens": ["<pad>", "<s>", "</s>"],
    "model": {
        "hidden_size": 64,
        "intermediate_size": 176,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
    },
}

# A plain chat template so that `formatting: chat` works on the tiny model too.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}{{ eos_token }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


#: Written last into a finished build; a folder without it is not the model.
COMPLETE = ".complete"
#: What a build must have written before it is marked finished.
BUILT_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


def marked_complete(folder: Path, key: str) -> bool:
    """Whether ``folder`` holds a finished build whose marker names ``key``."""
    try:
        return (folder / COMPLETE).read_text(encoding="utf-8").strip() == key
    except OSError:
        return False


def ensure_built(
    name: str, key: str, build: Callable[[Path], None], files: tuple[str, ...]
) -> Path:
    """``<cache>/<name>-<key>``, built by ``build`` once however many processes ask.

    The build must write ``files``; the ``COMPLETE`` marker, naming ``key``, is
    written last, and a reader takes the folder only with it (see
    ``trainer_entry.buildonce``). Every embedded tiny model is built this way.
    """

    def build_and_mark(folder: Path) -> None:
        build(folder)
        missing = [f for f in files if not (folder / f).is_file()]
        if missing:
            raise RuntimeError(f"the {name} build wrote no {', '.join(missing)}")
        (folder / COMPLETE).write_text(key + "\n", encoding="utf-8")

    target = cache_root() / f"{name}-{key}"
    build_once(target, build_and_mark, lambda folder: marked_complete(folder, key), what=name)
    return target


def recipe_key(recipe: dict[str, Any], files: tuple[Path, ...] = ()) -> str:
    """A tiny model's cache key: a hash of its recipe and of the files it is trained on."""
    h = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode())
    for path in files:
        h.update(path.read_bytes())
    return h.hexdigest()[:12]


@dataclass(frozen=True)
class TinyModel:
    """An embedded tiny model: ``<cache>/<name>-<key>``, its key a hash of its recipe
    and of the files it is trained on, built by ``build`` once (``ensure_built``)."""

    name: str
    recipe: dict[str, Any]
    texts: tuple[Path, ...]
    build: Callable[[Path], None]
    files: tuple[str, ...]
    #: more of the recipe, read when the key is asked for (another model's key)
    more: Callable[[], dict[str, Any]] = dict

    def key(self) -> str:
        return recipe_key({**self.recipe, **self.more()}, self.texts)

    def path(self) -> Path:
        """Where it lives (built or not)."""
        return cache_root() / f"{self.name}-{self.key()}"

    def is_complete(self, folder: Path) -> bool:
        """Whether ``folder`` holds a finished build (its marker names this recipe's key)."""
        return marked_complete(folder, self.key())

    def ensure(self) -> Path:
        """Its folder, built on first use."""
        return ensure_built(self.name, self.key(), self.build, self.files)

    def functions(self) -> tuple[Callable[[], Path], Callable[[Path], bool], Callable[[], Path]]:
        """(``path``, ``is_complete``, ``ensure``): what its module names
        ``<name>_path``, ``is_complete`` and ``ensure_<name>``."""
        return self.path, self.is_complete, self.ensure


# ``build`` looked up at call time: tests replace it
TINY = TinyModel(TINY_NAME, _RECIPE, (DATASET,), lambda folder: build(folder), BUILT_FILES)
tiny_path, is_complete, ensure_tiny = TINY.functions()


#: the texts the other tiny models' tokenizers are trained on: the review set, then the
#: instruction set (part of their cache keys)
SHIPPED_TEXTS = (ASSETS / "reviews.jsonl", SHIPPED_DATASET)


def shipped_texts() -> Iterator[str]:
    """``SHIPPED_TEXTS``' texts: each review, then each instruction record's fields joined."""
    reviews, instructions = SHIPPED_TEXTS
    with reviews.open(encoding="utf-8") as f:
        for line in f:
            yield json.loads(line)["text"]
    with instructions.open(encoding="utf-8") as f:
        for line in f:
            record = json.loads(line)
            yield " ".join(str(record.get(k) or "") for k in ("instruction", "input", "output"))


def _training_texts() -> Iterator[str]:
    with DATASET.open(encoding="utf-8") as f:
        for line in f:
            record = json.loads(line)
            template = INSTRUCT_PROMPT if record.get("input") else INSTRUCT_PROMPT_NO_INPUT
            yield template.format(**record) + record["output"]


def byte_level_bpe(
    texts: Iterator[str],
    special_tokens: list[str],
    vocab_size: int,
    *,
    unk: str | None = None,
    prefix_space: bool = False,
) -> Any:
    """A byte-level BPE tokenizer (``tokenizers.Tokenizer``) trained on ``texts``: the
    special tokens first, in their order (ids 0, 1, …), then the merges of pairs seen
    twice or more; ``unk`` its unknown token, ``prefix_space`` a space put before the
    first word (BERT's, not GPT's). The caller adds its post-processor."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token=unk) if unk is not None else models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=prefix_space)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def fast_tokenizer(
    tok: Any, template: tuple[str, str], marks: list[str], max_length: int, **tokens: Any
) -> Any:
    """``tok`` (a ``tokenizers.Tokenizer``) as a transformers fast tokenizer of
    ``model_max_length`` ``max_length`` and special tokens ``tokens`` (``bos_token``, ...),
    writing a text and a pair of texts as ``template`` says (``marks``: the special tokens
    it writes)."""
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast

    single, pair = template
    marked = [(mark, tok.token_to_id(mark)) for mark in marks]
    tok.post_processor = processors.TemplateProcessing(
        single=single, pair=pair, special_tokens=marked
    )
    return PreTrainedTokenizerFast(tokenizer_object=tok, **tokens, model_max_length=max_length)


def token_ids(tokenizer: Any, *roles: str) -> dict[str, Any]:
    """A model config's ``vocab_size`` and the ``<role>_token_id`` of each of ``roles``
    (``pad``, ``bos``, ``eos``), as ``tokenizer`` has them."""
    ids = {f"{role}_token_id": getattr(tokenizer, f"{role}_token_id") for role in roles}
    return {"vocab_size": len(tokenizer), **ids}


def seeded(model_class: Any, config: Any, seed: int) -> Any:
    """``model_class(config)`` initialised from ``seed``, the caller's random state left
    as it was."""
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return model_class(config)


def build(folder: Path) -> None:
    """Train the tokenizer, initialise the model, save both to ``folder``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    pad, bos, eos = _RECIPE["special_tokens"]
    tok = byte_level_bpe(_training_texts(), _RECIPE["special_tokens"], _RECIPE["vocab_size"])
    # Like Llama's tokenizer: a BOS before every encoded text.
    tokenizer = fast_tokenizer(
        tok,
        (f"{bos} $A", f"{bos} $A {bos} $B"),
        [bos],
        _RECIPE["model"]["max_position_embeddings"],
        bos_token=bos,
        eos_token=eos,
        pad_token=pad,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(folder)
    config = LlamaConfig(**token_ids(tokenizer, "bos", "eos", "pad"), **_RECIPE["model"])
    save_model(seeded(LlamaForCausalLM, config, _RECIPE["seed"]), folder)


def save_model(model: Any, folder: Path) -> None:
    """Write what ``model.save_pretrained(folder)`` writes, the same bytes, on any rank.

    With a process group up, transformers' ``save_pretrained`` writes the
    config and the weights on rank 0 only (the tokenizer's on every rank);
    whichever rank of a job builds the tiny model, it must come out whole. A model
    that generates has its generation config written too; weights tied to another
    (a T5's shared embedding, Whisper's output projection) are saved once, under the
    name they are tied to, as ``save_pretrained`` saves them: safetensors stores no
    aliases.
    """
    from safetensors.torch import save_file

    model.config.dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    model.config.architectures = [type(model).__name__]
    model.config.save_pretrained(folder)
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(folder)
    tied = getattr(model, "all_tied_weights_keys", None) or {}
    state = {name: t for name, t in model.state_dict().items() if name not in tied}
    try:
        from transformers.core_model_loading import revert_weight_conversion
    except ImportError:  # a release that saves the modules' own names
        pass
    else:
        # the checkpoint names save_pretrained writes where the modules' differ (LLaVA's
        # language_model.model.*), which every transformers 5 loads
        state = revert_weight_conversion(model, state)
    weights = {name: t.contiguous() for name, t in state.items()}
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
