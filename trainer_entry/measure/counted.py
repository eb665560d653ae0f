"""FLOPs of a training step counted by PyTorch's FLOP counter, for tasks with several lengths.

The analytic formula (``trainer_entry.measure.flops``) knows one sequence per
sample. An encoder-decoder runs its encoder over the source and its decoder,
with cross-attention, over the target; a speech or vision tower runs over
audio frames or image patches before the text. Rather than a hand formula per
family, the step is counted where the counter sees it:

- the run's model is built again on the ``meta`` device from its config (no
  memory, no weights), with the same adapters (the live model's PEFT
  configuration), the same parameters trained (read by name from the live
  model) and, for the hardware figure, the same activation checkpointing;
- one sample without padding (``Task.probe_batch``) runs forward and backward
  under ``FlopCounterMode`` at a few lengths around the run's mean ones;
- a transformer's FLOPs for one sample are a polynomial of degree two in its
  lengths (linear layers grow with each length; attention with the product of
  a query length and a key length, cross-attention included), so the counts
  are fitted to ``c + Σ a_d·n_d + Σ b_de·n_d·n_e``; one more sample than the
  fit needs is counted, and a fit that misses any probe by more than
  ``FIT_TOLERANCE`` gives no figure (a model whose FLOPs follow another law);
- a step's FLOPs are then the coefficients times the sums the run recorded
  over the rows it fed (``trainer_entry.measure.steps.length_moments``): the
  real lengths, so padding is excluded as for causal-LM.

The forward FLOPs are also split by the model's parts (``components``: the
encoder, the decoder, a vision or audio tower, the head), each fitted alike.
"""

from __future__ import annotations

import contextlib
import importlib
import itertools
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from trainer_entry.measure.flops import FlopsUnavailable

#: the largest relative miss of the fit on any probe before the figure is refused
FIT_TOLERANCE = 0.02
#: the constant term's key in the coefficients (once per sample)
PER_SAMPLE = "1"


@dataclass(frozen=True)
class CountedFlops:
    """Coefficients of one sample's training FLOPs in the monomials of its lengths.

    Keys are ``PER_SAMPLE``, a dimension ``d`` (per unit of ``n_d``) and ``d*e``
    (per unit of ``n_d·n_e``), as ``length_moments`` names the sums.
    """

    dims: tuple[str, ...]
    #: forward and backward, no recomputation
    model: Mapping[str, float]
    #: with the run's activation checkpointing (None: the run recomputes nothing it
    #: reproduces here; see ``hardware_note``)
    hardware: Mapping[str, float] | None
    #: part of the model -> the forward FLOPs of that part, same keys
    components: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    hardware_note: str | None = None

    @staticmethod
    def total(coefficients: Mapping[str, float], rows: int, moments: Mapping[str, int]) -> float:
        """FLOPs of ``rows`` samples whose lengths have the sums ``moments``."""
        out = 0.0
        for key, value in coefficients.items():
            out += value * (rows if key == PER_SAMPLE else moments.get(key, 0))
        return out


def monomials(dims: Sequence[str]) -> list[str]:
    """The fit's terms: per sample, each dimension, each product of two (by name)."""
    names = sorted(dims)
    return [
        PER_SAMPLE,
        *names,
        *(f"{a}*{b}" for i, a in enumerate(names) for b in names[i:]),
    ]


def _terms(lengths: Mapping[str, int]) -> dict[str, float]:
    out = {PER_SAMPLE: 1.0}
    names = sorted(lengths)
    for i, a in enumerate(names):
        out[a] = float(lengths[a])
        for b in names[i:]:
            out[f"{a}*{b}"] = float(lengths[a] * lengths[b])
    return out


def probe_lengths(typical: Mapping[str, float]) -> list[dict[str, int]]:
    """The lengths to count: three per dimension, at a third, two thirds and all of the
    run's mean (never longer than what the run fed), enough combinations to fit every
    term and one more."""
    names = sorted(typical)
    levels: dict[str, tuple[int, int, int]] = {}
    for name in names:
        mean = max(3.0, float(typical[name]))
        lo = max(1, round(mean / 3))
        mid = max(lo + 1, round(2 * mean / 3))
        hi = max(mid + 1, round(mean))
        levels[name] = (lo, mid, hi)
    if not names:
        return [{}, {}]
    if len(names) == 1:
        # four lengths for three terms: a quarter, half, three quarters and all of the mean
        (name,) = names
        mean = max(4.0, float(typical[name]))
        values: list[int] = []
        for quarter in (1, 2, 3, 4):
            values.append(max(round(mean * quarter / 4), values[-1] + 1 if values else 1))
        return [{name: v} for v in values]
    points: list[dict[str, int]] = []
    # every dimension at its low level, then each raised alone (linear and square terms),
    # then each pair raised together (the products), then all high (the check)
    low = {n: levels[n][0] for n in names}
    points.append(dict(low))
    for n in names:
        for level in (1, 2):
            points.append({**low, n: levels[n][level]})
    for a, b in itertools.combinations(names, 2):
        points.append({**low, a: levels[a][1], b: levels[b][1]})
    points.append({n: levels[n][2] for n in names})
    return points


def _solve(
    points: Sequence[Mapping[str, int]], counts: Sequence[float], keys: Sequence[str]
) -> tuple[dict[str, float], float]:
    """Least-squares coefficients of ``keys`` through ``counts``, and the worst relative miss
    of those coefficients (as returned) on any probe.

    The columns are scaled to one before solving (a length in audio samples squares to
    10⁹), and a term is dropped as the solve's rounding only where its largest
    contribution to any probe is a billionth of the largest count or less: a small
    coefficient of a large term (attention per sample², about 1 FLOP) is kept.
    """
    a = torch.tensor([[_terms(p)[k] for k in keys] for p in points], dtype=torch.float64)
    y = torch.tensor(list(counts), dtype=torch.float64)
    scale = a.abs().amax(dim=0).clamp(min=1.0)
    solution = torch.linalg.lstsq(a / scale, y.unsqueeze(1)).solution.squeeze(1) / scale
    largest = float(y.abs().max()) if len(y) else 1.0
    contribution = (solution.abs() * a.abs().amax(dim=0)).tolist()
    kept = torch.tensor(
        [
            0.0 if c <= largest * 1e-9 else float(v)
            for c, v in zip(contribution, solution, strict=True)
        ],
        dtype=torch.float64,
    )
    fitted = a @ kept
    miss = max(
        (abs(float(f) - float(t)) / abs(float(t)) for f, t in zip(fitted, y, strict=True) if t),
        default=0.0,
    )
    return {k: float(v) for k, v in zip(keys, kept, strict=True)}, miss


class _OnesOnMeta(torch.utils._python_dispatch.TorchDispatchMode):
    """Reading a number out of a ``meta`` tensor answers 1 (true).

    A probe is one sample without padding: its masks are all ones, which is what
    transformers reads them for (``mask.all()``: may the mask be skipped?). A
    meta tensor has no values, so the read would fail; 1 is the probe's answer.
    """

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func is torch.ops.aten._local_scalar_dense.default and args[0].device.type == "meta":
            return True if args[0].dtype == torch.bool else 1
        return func(*args, **(kwargs or {}))


@dataclass
class _Count:
    forward: float
    backward: float
    parts: dict[str, float]


def _count_once(
    model: torch.nn.Module,
    batch: Mapping[str, Any],
    components: Mapping[str, torch.nn.Module],
    loss_of: Callable[[Any], torch.Tensor],
) -> _Count:
    from torch.utils.flop_counter import FlopCounterMode

    parts: dict[str, float] = dict.fromkeys(components, 0.0)
    forward = FlopCounterMode(display=False)
    started: dict[str, float] = {}
    handles = []
    for name, module in components.items():

        def before(_m: Any, _a: Any, name: str = name) -> None:
            started[name] = forward.get_total_flops()

        def after(_m: Any, _a: Any, _o: Any, name: str = name) -> None:
            if name in started:
                parts[name] += forward.get_total_flops() - started.pop(name)

        # a list of layers is never called itself: each layer counts for it
        called = (
            list(module.children())
            if isinstance(module, torch.nn.ModuleList | torch.nn.ModuleDict)
            else [module]
        )
        for each in called:
            handles.append(each.register_forward_pre_hook(before))
            handles.append(each.register_forward_hook(after))
    try:
        with forward, _OnesOnMeta():
            loss = loss_of(model(**batch))
        with FlopCounterMode(display=False) as backward, _OnesOnMeta():
            loss.backward()
    finally:
        for handle in handles:
            handle.remove()
    return _Count(float(forward.get_total_flops()), float(backward.get_total_flops()), parts)


def _loss(output: Any) -> torch.Tensor:
    """The probe's loss: the model's own; a probe given no labels (a loss that reads its
    labels' values, CTC's, cannot run on meta) backpropagates the mean of the logits,
    which sends a gradient through the same products (the loss's own, which the counter
    does not count, aside)."""
    loss = output.get("loss") if isinstance(output, Mapping) else getattr(output, "loss", None)
    if loss is not None:
        return loss
    logits = (
        output.get("logits") if isinstance(output, Mapping) else getattr(output, "logits", None)
    )
    if logits is None:
        raise FlopsUnavailable("the model computed neither a loss nor logits from the probe")
    return logits.float().mean()


def components_of(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """The parts the forward FLOPs are split by: the children of the transformers model
    that hold weights, a child named ``model`` (transformers' base model) opened into its
    own children (``model.encoder``, ``model.vision_tower``, …)."""
    inner = _transformers_model(model)
    out: dict[str, torch.nn.Module] = {}
    for name, child in inner.named_children():
        if not any(True for _ in child.parameters()):
            continue
        if name == "model":
            for sub, grandchild in child.named_children():
                if any(True for _ in grandchild.parameters()):
                    out[f"model.{sub}"] = grandchild
            continue
        out[name] = child
    return out


def _transformers_model(model: Any) -> Any:
    inner = getattr(model, "get_base_model", None)
    return inner() if callable(inner) else model


def meta_clone(
    model: Any,
    *,
    checkpointing: bool,
    reentrant: bool = False,
    overrides: Mapping[str, Any] | None = None,
) -> torch.nn.Module:
    """The run's model again on the ``meta`` device: its class and config (``overrides``
    set on it), its adapters, the same parameters trained; activation checkpointing on
    when ``checkpointing`` (torch's reentrant variant when ``reentrant``)."""
    import copy

    inner = _transformers_model(model)
    config = copy.deepcopy(inner.config)
    for key, value in (overrides or {}).items():
        setattr(config, key, value)
    # eager attention: its products are plain matrix products the counter sees (a fused
    # kernel's, flash-attn's, it may not); the FLOPs are the same
    _eager(config)
    try:
        # the class itself, not ``_from_config``: under ZeRO-3 that would partition the
        # copy across ranks (a collective only this rank enters)
        with torch.device("meta"):
            clone = type(inner)(config)
    except Exception as exc:
        raise FlopsUnavailable(
            f"the model could not be built again to count its FLOPs ({type(exc).__name__}: {exc})"
        ) from None
    peft_config = getattr(model, "peft_config", None)
    if isinstance(peft_config, Mapping) and peft_config:
        from peft import get_peft_model

        adapter = getattr(model, "active_adapter", None) or next(iter(peft_config))
        clone = get_peft_model(clone, copy.deepcopy(peft_config[adapter]))
    trained = {_plain(name): p.requires_grad for name, p in model.named_parameters()}
    for name, p in clone.named_parameters():
        key = _plain(name)
        if key not in trained:
            raise FlopsUnavailable(
                f"the model built again to count its FLOPs has a parameter '{name}' the run's "
                "model does not"
            )
        p.requires_grad_(trained[key])
    if checkpointing:
        target = _transformers_model(clone)
        kwargs = {"use_reentrant": reentrant}
        if hasattr(target, "activation_checkpointing_enable"):  # transformers >= 5.22
            target.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            target.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        try:
            embeddings = target.get_input_embeddings()
        except NotImplementedError:  # a model without input embeddings (wav2vec2)
            embeddings = None
        if embeddings is not None and any(not p.requires_grad for p in embeddings.parameters()):
            # as the Trainer does under LoRA: the checkpointed blocks' inputs need a gradient
            target.enable_input_require_grads()
    clone.train()
    return clone


def _eager(config: Any) -> None:
    """``config`` and the configs nested in it (a tower's, a decoder's) set to eager attention."""
    seen: set[int] = set()

    def visit(c: Any) -> None:
        if id(c) in seen or not hasattr(c, "to_dict"):
            return
        seen.add(id(c))
        if hasattr(c, "_attn_implementation"):
            try:
                c._attn_implementation = "eager"
            except (AttributeError, ValueError):
                pass
        for value in vars(c).values():
            if hasattr(value, "to_dict") and hasattr(value, "_attn_implementation"):
                visit(value)

    visit(config)


def _plain(name: str) -> str:
    """A parameter's name without the wrappers' prefixes (FSDP's, torch.compile's)."""
    for prefix in ("_fsdp_wrapped_module.", "_orig_mod.", "_checkpoint_wrapped_module.", "module."):
        name = name.replace(prefix, "")
    return name


def count_flops(
    model: Any,
    probe_batch: Callable[[Mapping[str, int]], Mapping[str, Any]],
    typical: Mapping[str, float],
    *,
    checkpointing: bool,
    reentrant: bool = False,
    overrides: Mapping[str, Any] | None = None,
) -> CountedFlops:
    """Count one sample's step at ``probe_lengths(typical)`` and fit the coefficients.

    ``probe_batch``: one sample's inputs (labels included) at the given lengths, on the
    ``meta`` device. ``checkpointing``: the run recomputes under the transformers
    model's activation checkpointing (``reentrant``: torch's reentrant variant); its
    hardware figure is counted with it on. ``overrides``: config settings the copy
    takes, which change nothing the counter counts (``Task.probe_config``).
    Raises ``FlopsUnavailable`` where the step cannot be counted or fitted.
    """
    try:
        return _fit(model, probe_batch, typical, checkpointing, reentrant, overrides)
    except FlopsUnavailable:
        raise
    except Exception as exc:  # a figure missing, never a run failed after its training
        first = (str(exc).strip().splitlines() or [""])[0]
        raise FlopsUnavailable(
            f"the step could not be counted ({type(exc).__name__}: {first})"
        ) from None


def _fit(
    model: Any,
    probe_batch: Callable[[Mapping[str, int]], Mapping[str, Any]],
    typical: Mapping[str, float],
    checkpointing: bool,
    reentrant: bool,
    overrides: Mapping[str, Any] | None,
) -> CountedFlops:
    dims = tuple(sorted(typical))
    keys = monomials(dims) if dims else [PER_SAMPLE]
    points = probe_lengths(typical)
    counted = _count_all(model, probe_batch, points, checkpointing=False, overrides=overrides)
    model_coef, miss = _solve(points, [c.forward + c.backward for c in counted], keys)
    if miss > FIT_TOLERANCE:
        raise FlopsUnavailable(
            f"the counted FLOPs do not follow a polynomial of degree two in the lengths "
            f"({', '.join(dims)}): the fit misses a probe by {miss:.1%}"
        )
    components = {
        name: _solve(points, [c.parts[name] for c in counted], keys)[0] for name in counted[0].parts
    }
    hardware: dict[str, float] | None = dict(model_coef)
    if checkpointing:
        again = _count_all(
            model, probe_batch, points, checkpointing=True, reentrant=reentrant, overrides=overrides
        )
        hardware, miss = _solve(points, [c.forward + c.backward for c in again], keys)
        if miss > FIT_TOLERANCE:
            hardware = None
    return CountedFlops(
        dims=dims,
        model=model_coef,
        hardware=hardware,
        components=components,
        hardware_note=None
        if hardware is not None
        else "the FLOPs counted under activation checkpointing do not fit the lengths",
    )


def _count_all(
    model: Any,
    probe_batch: Callable[[Mapping[str, int]], Mapping[str, Any]],
    points: Sequence[Mapping[str, int]],
    *,
    checkpointing: bool,
    reentrant: bool = False,
    overrides: Mapping[str, Any] | None = None,
) -> list[_Count]:
    clone = meta_clone(model, checkpointing=checkpointing, reentrant=reentrant, overrides=overrides)
    parts = components_of(clone)
    out = []
    with _all_nonzero():
        for lengths in points:
            out.append(_count_point(clone, probe_batch, lengths, parts))
    return out


@contextlib.contextmanager
def _all_nonzero() -> Iterator[None]:
    """``nonzero`` on a meta tensor takes every element for true, as ``_OnesOnMeta``
    answers: a probe's masks are all ones (a mask indexing a tensor keeps all of it)."""
    config = importlib.import_module("torch.fx.experimental._config")
    before = getattr(config, "meta_nonzero_assume_all_nonzero", None)
    if before is None:
        yield
        return
    setattr(config, "meta_nonzero_assume_all_nonzero", True)  # noqa: B010 (a module's flag)
    try:
        yield
    finally:
        setattr(config, "meta_nonzero_assume_all_nonzero", before)  # noqa: B010


def _count_point(
    clone: torch.nn.Module,
    probe_batch: Callable[[Mapping[str, int]], Mapping[str, Any]],
    lengths: Mapping[str, int],
    parts: Mapping[str, torch.nn.Module],
) -> _Count:
    dtype = next((p.dtype for p in clone.parameters() if p.is_floating_point()), None)
    try:
        batch = {
            name: value.to(dtype)
            if dtype is not None and isinstance(value, torch.Tensor) and value.is_floating_point()
            else value
            for name, value in probe_batch(lengths).items()
        }
        counted = _count_once(clone, batch, parts, _loss)
    except FlopsUnavailable:
        raise
    except Exception as exc:
        shown = ", ".join(f"{k} {v}" for k, v in sorted(lengths.items()))
        first = (str(exc).strip().splitlines() or [""])[0]
        raise FlopsUnavailable(
            f"one sample ({shown}) could not be counted on the meta device "
            f"({type(exc).__name__}: {first})"
        ) from None
    clone.zero_grad(set_to_none=True)
    return counted


def per_row_mean(rows: int, moments: Mapping[str, int], dims: Sequence[str]) -> dict[str, float]:
    """Each dimension's mean real length over the rows fed (the probes' scale)."""
    return {d: moments.get(d, 0) / rows if rows else 0.0 for d in dims}
