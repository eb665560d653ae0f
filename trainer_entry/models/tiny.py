"""The embedded default model ``tiny-llama``: built offline, deterministically, once.

A byte-level BPE tokenizer trained on the shipped instruction dataset and a
two-layer Llama initialised from a fixed seed. Nothing is downloaded. The
first use builds both into a cache folder in a few seconds; later uses load
them. The folder name carries a hash of everything the build depends on, so a
change to the recipe or the dataset builds a new one instead of reusing a
stale one.

Any number of processes may ask for it at once (the ranks of one job, packed
jobs, several users sharing one cache). Each builder writes everything into a
private folder beside the target, ends with the ``COMPLETE`` marker, and
publishes with one rename: the folder is there whole or not at all, and a
reader takes it only with the marker inside. An exclusive ``flock`` keeps the
others from building too; where the file system does not honour it, the
losers of the race find the winner's folder at the rename and use it. Private
folders left by a killed builder are removed by the next one.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import secrets
import shutil
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

TINY_NAME = "tiny-llama"
ASSETS = Path(__file__).resolve().parent.parent / "assets"
DATASET = ASSETS / "instructions.jsonl"

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


def cache_root() -> Path:
    """``$TUNEMATRIX_CACHE``, else ``$XDG_CACHE_HOME/tunematrix``, else ``~/.cache/tunematrix``."""
    explicit = os.environ.get("TUNEMATRIX_CACHE")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "tunematrix"


def _key() -> str:
    h = hashlib.sha256(json.dumps(_RECIPE, sort_keys=True).encode())
    h.update(DATASET.read_bytes())
    return h.hexdigest()[:12]


def tiny_path() -> Path:
    """Where the tiny model lives (built or not)."""
    return cache_root() / f"{TINY_NAME}-{_key()}"


#: Written last into a finished build; a folder without it is not the model.
COMPLETE = ".complete"
#: What a build must have written before it is marked finished.
BUILT_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")
#: A private folder this old is stale even when its owner cannot be checked.
STALE_AFTER_S = 3600.0


def is_complete(folder: Path) -> bool:
    """Whether ``folder`` holds a finished build (its marker names this recipe's key)."""
    try:
        return (folder / COMPLETE).read_text(encoding="utf-8").strip() == _key()
    except OSError:
        return False


def ensure_tiny() -> Path:
    """The folder of the tiny model and tokenizer, building it on first use."""
    target = tiny_path()
    if is_complete(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with _exclusive(target.parent / f".{target.name}.lock") as locked:
        if is_complete(target):  # another process built it meanwhile
            return target
        if locked:
            _remove_stale(target)
        tmp = _private_dir(target)
        try:
            build(tmp)
            missing = [name for name in BUILT_FILES if not (tmp / name).is_file()]
            if missing:
                raise RuntimeError(f"the {TINY_NAME} build wrote no {', '.join(missing)}")
            (tmp / COMPLETE).write_text(_key() + "\n", encoding="utf-8")
            _publish(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)  # gone when published
    return target


@contextlib.contextmanager
def _exclusive(path: Path) -> Iterator[bool]:
    """Hold an exclusive ``flock`` on ``path``; yields False where it cannot be had.

    Read-only and group/world-readable (per umask), so the users of a shared
    cache can all lock the one file. Without the lock the build is still safe
    (``_publish`` settles the race), only done more than once.
    """
    fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o666)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            locked = True
        except OSError:  # e.g. ENOLCK/EOPNOTSUPP on some network file systems
            locked = False
        yield locked
    finally:
        os.close(fd)  # releases the lock


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9]", "_", socket.gethostname()) or "host"


def _private_dir(target: Path) -> Path:
    """A new empty folder beside ``target``, named for this host and process.

    Made with ``mkdir`` (mode 0o777 less the umask) so that the published
    folder is as readable as the rest of the cache, not 0o700.
    """
    while True:
        path = target.parent / f".{target.name}.{_host()}-{os.getpid()}-{secrets.token_hex(4)}"
        try:
            path.mkdir(0o777)
        except FileExistsError:
            continue
        return path


def _publish(tmp: Path, target: Path) -> None:
    """Rename ``tmp`` (a finished build) to ``target``, the one publish point.

    When ``target`` is already there: a finished build (another builder won)
    is kept and ``tmp`` is left to the caller to discard; an unfinished one
    (left by other means: a partial copy, an older layout) is moved aside and
    replaced.
    """
    for _ in range(3):
        try:
            os.rename(tmp, target)
            return
        except OSError as exc:
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
        if is_complete(target):
            return
        aside = _private_dir(target)
        try:
            os.rename(target, aside)
        except FileNotFoundError:
            pass  # someone else moved it meanwhile
        finally:
            shutil.rmtree(aside, ignore_errors=True)
    if not is_complete(target):
        raise OSError(errno.ENOTEMPTY, f"{target} is unfinished and could not be replaced")


_PRIVATE = re.compile(r"(?P<host>[A-Za-z0-9_]+)-(?P<pid>\d+)-[0-9a-f]{8}")


def _remove_stale(target: Path) -> None:
    """Remove the private folders of ``target`` that no builder is using.

    Called with the lock held: the folder of a builder on this host that is no
    longer running, and any folder older than ``STALE_AFTER_S`` (a builder on
    another host, where the lock may not reach, or an older naming).
    """
    host, now = _host(), time.time()
    for path in target.parent.glob(f".{target.name}.*"):
        if not path.is_dir():
            continue  # the lock file
        m = _PRIVATE.fullmatch(path.name[len(target.name) + 2 :])
        try:
            age = now - path.stat().st_mtime
        except FileNotFoundError:
            continue
        gone = m is not None and m["host"] == host and not _running(int(m["pid"]))
        if gone or age > STALE_AFTER_S:
            shutil.rmtree(path, ignore_errors=True)


def _running(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def _training_texts() -> Iterator[str]:
    from trainer_entry.data.prepare import INSTRUCT_PROMPT, INSTRUCT_PROMPT_NO_INPUT

    with DATASET.open(encoding="utf-8") as f:
        for line in f:
            record = json.loads(line)
            template = INSTRUCT_PROMPT if record.get("input") else INSTRUCT_PROMPT_NO_INPUT
            yield template.format(**record) + record["output"]


def build(folder: Path) -> None:
    """Train the tokenizer, initialise the model, save both to ``folder``."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    pad, bos, eos = _RECIPE["special_tokens"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=_RECIPE["vocab_size"],
        min_frequency=2,
        special_tokens=_RECIPE["special_tokens"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_training_texts(), trainer=trainer)
    bos_id = tok.token_to_id(bos)
    # Like Llama's tokenizer: a BOS before every encoded text.
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, bos_id)]
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=bos,
        eos_token=eos,
        pad_token=pad,
        model_max_length=_RECIPE["model"]["max_position_embeddings"],
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(folder)

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        bos_token_id=bos_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **_RECIPE["model"],
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(_RECIPE["seed"])
        model = LlamaForCausalLM(config)
    _save_model(model, folder)


def _save_model(model: Any, folder: Path) -> None:
    """Write what ``model.save_pretrained(folder)`` writes, the same bytes, on any rank.

    With a process group up, transformers' ``save_pretrained`` writes the
    config and the weights on rank 0 only (the tokenizer's on every rank);
    whichever rank of a job builds the tiny model, it must come out whole.
    """
    from safetensors.torch import save_file

    model.config.dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    model.config.architectures = [type(model).__name__]
    model.config.save_pretrained(folder)
    model.generation_config.save_pretrained(folder)
    weights = {name: t.contiguous() for name, t in model.state_dict().items()}
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
