"""What computes a run's loss, named for its row (``loss_implementation``).

The loss decides much of a causal LM's peak memory: whether a step holds the
full logits (tokens × vocabulary) in fp32 or never builds them. On one H100 the
same Llama 1B at the same tokens/s peaked at 34 GB allocated under ``trainer:
hf`` and 12.3 GB under ``trainer: sft``, for this reason alone:

- transformers' ``ForCausalLMLoss`` (``transformers/loss/loss_utils.py``), the
  loss of the ``Trainer`` and of every ``*ForCausalLM`` model, upcasts the whole
  logits to fp32 before its cross-entropy;
- TRL's ``SFTTrainer`` puts its fused LM head on the model (``add_fused_lm_head``,
  ``trl/trainer/utils.py``) and computes the loss from per-token log-probabilities
  made in tiles, only for the positions with a label, never holding the logits;
  ``loss_type`` ``nll`` (the default) or ``dft`` (each token's loss weighted by its
  probability) are both computed this way. ``compute_loss_func`` and (under
  ``nll``) ``label_smoothing_factor`` leave the fused head to TRL's metrics and
  compute the loss from a forward with the full logits;
- liger's fused linear cross-entropy (``use_liger_kernel``, the ``hf`` trainer's;
  ``liger-kernel`` installed) replaces the model's forward with one that computes
  the loss in chunks of the LM head's product, never the logits. Under ``sft``
  TRL turns that part of liger off and keeps its own head.

The names here are decided from the built trainer and its model, never from
the scenario's text: a backend's ``loss_implementation``
(``trainer_entry.backends.trainer_protocol``) calls these.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from orchestrator.contract.trainers import task_line

#: transformers' causal-LM loss: the logits built whole and upcast to fp32
FULL_LOGITS = "transformers ForCausalLMLoss (full fp32 logits)"
#: liger's fused linear cross-entropy: the loss in chunks of the LM head's product
LIGER_FUSED = "liger fused linear cross-entropy"
#: liger's cross-entropy kernel alone (its fused linear cross-entropy turned off)
LIGER_CROSS_ENTROPY = "liger cross-entropy (full logits)"
#: the task whose loss is over the vocabulary (``orchestrator.contract.trainers``)
CAUSAL_LM = "causal-lm"
#: what a classification model's own loss is, by its config's ``problem_type``
_PROBLEMS = {
    "regression": "MSE",
    "single_label_classification": "cross-entropy",
    "multi_label_classification": "BCE with logits",
}


def trl_fused(loss_type: str) -> str:
    """TRL's fused LM head computing loss ``loss_type`` (``nll``, ``dft``)."""
    return f"trl fused LM head (chunked {loss_type})"


def trainer_of(trainer_run: Any) -> Any:
    """The trainer of a backend's built trainer (``TrainerRun.trainer``), or ``trainer_run``
    itself when it is a trainer already (one another module built)."""
    return getattr(trainer_run, "trainer", trainer_run)


def unwrapped(model: Any) -> Any:
    """The model under its wrappers: DDP's and FSDP1's ``module``, PEFT's base model."""
    for _ in range(8):
        if hasattr(model, "get_base_model"):
            model = model.get_base_model()
        elif hasattr(getattr(model, "module", None), "forward"):
            model = model.module
        else:
            break
    return model


def _forward_function(model: Any) -> Any:
    forward = getattr(model, "forward", None)
    return getattr(forward, "__func__", forward)


def trl_fused_head(model: Any) -> bool:
    """Whether TRL's fused LM head (``add_fused_lm_head``) is on the model: TRL wraps the
    model's own forward (``functools.wraps``: its name is the model's), its code is TRL's."""
    code = getattr(_forward_function(unwrapped(model)), "__code__", None)
    return (
        code is not None
        and code.co_name == "_fused_forward"
        and f"{os.sep}trl{os.sep}" in code.co_filename
    )


def liger_forward(model: Any) -> bool:
    """Whether liger replaced the model's forward (its fused linear cross-entropy)."""
    module = getattr(_forward_function(unwrapped(model)), "__module__", None) or ""
    return module.split(".")[0] == "liger_kernel"


def liger_asked(args: Any) -> str | None:
    """The loss ``use_liger_kernel`` will put in force when training starts (transformers
    applies liger there), from the trainer's arguments; None when liger is not asked for
    or changes no loss."""
    if not getattr(args, "use_liger_kernel", False):
        return None
    config: Mapping[str, Any] = getattr(args, "liger_kernel_config", None) or {}
    # liger's defaults: fused linear cross-entropy on, its plain cross-entropy off
    if config.get("fused_linear_cross_entropy", True):
        return LIGER_FUSED
    if config.get("cross_entropy", False):
        return LIGER_CROSS_ENTROPY
    return None


def custom_function(function: Any) -> str:
    """A ``compute_loss_func`` the trainer was given, by its name."""
    name = getattr(function, "__qualname__", None) or type(function).__name__
    return f"custom compute_loss_func {name} (full logits)"


def label_smoothing(epsilon: float) -> str:
    """transformers' ``LabelSmoother``: log-softmax over the full logits."""
    return f"label smoothing {epsilon:g} (full logits)"


def overridden_compute_loss(trainer: Any, base: type) -> str | None:
    """The class that overrides ``base.compute_loss`` in ``trainer``'s class, if any."""
    for cls in type(trainer).__mro__:
        if cls is base:
            return None
        if "compute_loss" in vars(cls):
            return cls.__name__
    return None


def replaced(trainer: Any, base: type, *, smoothing: bool = True) -> str | None:
    """What computes the loss of ``trainer`` (a ``base``) in place of what ``base`` computes,
    in the order ``compute_loss`` decides it: a subclass's own ``compute_loss``, a
    ``compute_loss_func``, label smoothing (where ``smoothing``); None: none of them."""
    own = overridden_compute_loss(trainer, base)
    if own is not None:
        return f"custom compute_loss ({own})"
    if getattr(trainer, "compute_loss_func", None) is not None:
        return custom_function(trainer.compute_loss_func)
    if smoothing and getattr(trainer, "label_smoother", None) is not None:
        return label_smoothing(trainer.args.label_smoothing_factor)
    return None


#: the loss a model's forward computes, by transformers' kind of head (``loss_type``)
_HEADS = {
    "ForCTC": "CTC over the frames",
    "ForMaskedLM": "cross-entropy over the masked tokens, full logits",
    "ForConditionalGeneration": "cross-entropy over the target tokens, full logits",
}


def model_loss(model: Any, task: str) -> str:
    """The model's own loss: what its forward computes when given the labels."""
    base = unwrapped(model)
    name = type(base).__name__
    line = task_line(task)
    if line is not None and line.classifies:
        config = getattr(base, "config", None)
        labels = getattr(config, "num_labels", None)
        problem = getattr(config, "problem_type", None)
        kind = _PROBLEMS.get(str(problem)) or ("MSE" if labels == 1 else "cross-entropy")
        return f"{name}'s own loss ({kind}, {labels} labels)"
    if task != CAUSAL_LM:
        # what the forward computes, by the kind of head transformers says the class is
        kind = _HEADS.get(str(getattr(base, "loss_type", None)), "its forward's")
        return f"{name}'s own loss ({kind})"
    if liger_forward(base):
        return LIGER_FUSED
    # ``loss_function`` is transformers' (a property of ``PreTrainedModel``): the mapped
    # loss of the model's class, or one set on the model
    function = getattr(type(base), "loss_function", None) and getattr(base, "loss_function", None)
    if function is None:
        return f"{name}'s own loss (its forward's)"
    loss = getattr(function, "__name__", type(function).__name__)
    return FULL_LOGITS if loss == "ForCausalLMLoss" else f"transformers {loss}"
