"""tunematrix orchestrator: plan, run, report and compare a fine-tuning benchmark matrix.

Nothing in this package imports torch, transformers, trl or peft: planning and
reporting run on a machine without the training stack. Only ``trainer_entry``
(the child process of each experiment) touches it.

The Python API is four functions, stable whatever modules implement them::

    from orchestrator import plan, run, report, compare

(see ``orchestrator.api``). No module of the package is named after them, so
the names always mean the functions.
"""

from typing import TYPE_CHECKING, Any

from orchestrator._version import __version__

if TYPE_CHECKING:
    from orchestrator.api import (
        BenchConfig,
        Comparison,
        Experiment,
        Plan,
        Report,
        RunResult,
        UserError,
        compare,
        load,
        plan,
        report,
        run,
    )

__all__ = [
    "BenchConfig",
    "Comparison",
    "Experiment",
    "Plan",
    "Report",
    "RunResult",
    "UserError",
    "__version__",
    "compare",
    "load",
    "plan",
    "report",
    "run",
]


def __getattr__(name: str) -> Any:
    # Loaded on first use: the child and the sidecar import submodules of this
    # package and should not pay for the API's imports.
    if name in __all__:
        from orchestrator import api

        value = getattr(api, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'orchestrator' has no attribute {name!r}")
