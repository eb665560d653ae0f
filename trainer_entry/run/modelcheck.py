"""A cell's model built as its job will build it, before launch: what would fail, named.

The check before launch (``trainer_entry.check``) builds every cell's model from
its config on the meta device (nothing is drawn: a 70B model takes a fraction
of a second) with the cell's attention kernel and dtype, wraps it as the job
does (TRL's fused head, then the cell's LoRA), and reads its positions. What
raises is a job that would fail after its imports and its model's load; here it
is one line, with the setting to blame:

- the attention kernel (``attn_implementation``, or ``use_flash_attn``): the
  build is tried again with SDPA, and where that one builds, the kernel is to
  blame (flash-attn not installed, or asked of a CPU cell);
- LoRA (``target_modules``: targets that match no module, or none given where
  PEFT knows none for the architecture: Whisper, wav2vec2, LLaVA);
- a length beyond a model's learned positions (``max_seq_len``): a model with a
  table of N position embeddings (GPT-2, GPT-BigCode, OPT, BERT) indexes past it
  on the first longer batch. Refused, as every task of the child refuses it, never
  cut down under the cell's name: the cell says the length it runs. Rotary
  positions (Llama, Mistral) have no table and take any length.

A GPU cell checked on a machine without a GPU is built with SDPA in place of a
flash-attn kernel (the kernel is the GPU machine's to have); the rest is checked
as it is. Cells that share their model's settings share one build. A model whose
config is neither in a folder, the hub cache nor shipped (a hub name the job will
download) and a ``python:`` model (its own code builds it) are not built here.
"""

from __future__ import annotations

from typing import Any

import torch

from trainer_entry.run.memoryplan import FLASH_KERNELS, meta_model, model_config
from trainer_entry.spec_errors import SpecError, first_line


def _attention_key(spec: Any) -> str:
    """The setting a cell's attention kernel was written as."""
    arguments = spec.arguments or {}
    if "attn_implementation" not in arguments and arguments.get("use_flash_attn"):
        return "use_flash_attn"
    return "attn_implementation"


def _positions(model: Any, config: Any) -> tuple[int, str] | None:
    """(the number of learned positions, the config key that says so), where the model
    has a table of position embeddings; None where it has none (rotary positions)."""
    for key in ("n_positions", "max_position_embeddings", "n_ctx"):
        limit = getattr(config, key, None)
        if isinstance(limit, int) and limit > 0:
            break
    else:
        return None
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    tokens = inner.get_input_embeddings() if hasattr(inner, "get_input_embeddings") else None
    for module in inner.modules():
        if (
            isinstance(module, torch.nn.Embedding)
            and module is not tokens
            # BART keeps two rows of offset in front of its positions
            and module.num_embeddings in (limit, limit + 2)
        ):
            return limit, key
    return None


def build_once(spec: Any, parsed: Any, task: Any, *, gpu_here: bool, seen: dict[str, Any]) -> None:
    """Build the cell's model on the meta device as its job will (the module's docstring);
    ``SpecError`` with the setting to blame where it would fail. ``seen``: the builds of
    the cells before it, by what a build depends on."""
    on_gpu = spec.device == "gpu"
    attn = parsed.model.attn_implementation or "sdpa"
    if on_gpu and not gpu_here and attn in FLASH_KERNELS:
        attn = "sdpa"  # the GPU machine's kernel to have; the rest is checked as it is
    key = repr((parsed.model, parsed.peft, parsed.backend, parsed.task, attn, on_gpu))
    if key not in seen:
        seen[key] = _build(spec, parsed, task, attn=attn, on_gpu=on_gpu)
    config, model = seen[key]
    found = _positions(model, config) if model is not None else None
    try:
        lengths = task.longest(parsed, config) if found is not None else None
    except SpecError:
        lengths = None  # a task whose lengths are its data's (an image's positions)
    tokens = (lengths or {}).get("tokens")
    if found is not None and isinstance(tokens, int) and tokens > found[0]:
        limit, where = found
        raise SpecError(
            f"max_seq_len {tokens} is longer than the model's {limit} learned positions "
            f"({where}): its embedding table has no row past {limit - 1}; set max_seq_len "
            f"to {limit} or less",
            key="max_seq_len",
        )


def _build(spec: Any, parsed: Any, task: Any, *, attn: str, on_gpu: bool) -> tuple[Any, Any]:
    """(the model's config, the model on the meta device); both None where the model is
    built by code the check does not run (a ``python:`` model) or its config is not here
    (a hub model not in the cache: the job downloads it; the check asks the hub nothing
    more than the resolution's one request)."""
    try:
        config = model_config(parsed, task, local_only=True)
    except (SpecError, OSError):
        return None, None
    try:
        return config, _meta(parsed, task, config, attn=attn, on_gpu=on_gpu)
    except SpecError:
        raise  # LoRA's own refusals name target_modules (``models.load.apply_peft``)
    except Exception as exc:
        if attn != "sdpa":
            try:
                _meta(parsed, task, config, attn="sdpa", on_gpu=on_gpu, peft=False)
            except Exception:
                pass
            else:  # with SDPA it builds: the kernel is to blame
                where = "a CPU cell" if not on_gpu else "where the job runs"
                raise SpecError(
                    f"attention {attn} cannot be built for {where}: {type(exc).__name__}: "
                    f"{first_line(exc)}",
                    key=_attention_key(spec),
                ) from None
        if parsed.peft.method is not None:
            try:
                _meta(parsed, task, config, attn=attn, on_gpu=on_gpu, peft=False)
            except Exception:
                pass
            else:  # without its LoRA it builds: LoRA is to blame
                raise SpecError(
                    f"LoRA could not be applied: {type(exc).__name__}: {first_line(exc)}",
                    key="target_modules",
                ) from None
        raise SpecError(
            f"the model does not build: {type(exc).__name__}: {first_line(exc)}"
        ) from None


def _meta(
    parsed: Any, task: Any, config: Any, *, attn: str, on_gpu: bool, peft: bool = True
) -> Any:
    import dataclasses

    if not peft:
        parsed = dataclasses.replace(parsed, peft=dataclasses.replace(parsed.peft, method=None))
    return meta_model(parsed, task, config, attn=attn, on_gpu=on_gpu)
