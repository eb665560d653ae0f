"""tunematrix orchestrator: plan, run, report and compare a fine-tuning benchmark matrix.

Nothing in this package imports torch, transformers, trl or peft: planning and
reporting run on a machine without the training stack. Only ``trainer_entry``
(the child process of each experiment) touches it.
"""

__version__ = "0.1.0"
