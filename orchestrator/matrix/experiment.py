"""One experiment of the matrix: a fully resolved, immutable cell (and repeat)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from orchestrator.config.environments import Environment
from orchestrator.config.scenarios import AccelerateConfig
from orchestrator.contract.allocators import Allocator
from orchestrator.contract.applicability import (
    BACKEND_KEY,
    DEFAULT_TASK,
    TASK_KEY,
    canonical_name,
    default_backend,
)
from orchestrator.contract.errors import Place
from orchestrator.contract.gpumemory import MemoryVerdict
from orchestrator.contract.steady import SteadyMeasure
from orchestrator.matrix import frameworks
from orchestrator.matrix.ids import spec_hash


@dataclass(frozen=True)
class Experiment:
    """Everything needed to run one cell once; built by ``orchestrator.matrix.expand``."""

    #: readable, stable id; also the folder name under ``runs/``
    experiment_id: str
    #: the id shared by all repeats of this cell (the id of its first repeat)
    cell_id: str
    scenario: str
    #: framework overlay name, ``none`` when the scenario listed ``null``
    framework: str
    model_name_or_path: str
    #: ``gpu`` or ``cpu``; on ``cpu`` the GPU count means processes
    device: str
    num_gpus: int
    effective_batch_size: int
    per_device_train_batch_size: int
    gradient_accumulation_steps: int
    #: None where the task takes none (an image task)
    max_seq_len: int | None
    packing: bool | None
    repeat: int
    #: every trainer argument, merged: defaults < scenario < sweep < framework
    arguments: Mapping[str, Any]
    #: the swept arguments and their values for this experiment
    swept: Mapping[str, Any]
    accelerate: AccelerateConfig | None
    #: environment overlay of the framework
    env: Mapping[str, str]
    data_processing: Mapping[str, Any] | None
    #: time limit in seconds (not part of the id: it does not change what is measured)
    timeout_s: float | None = None
    #: folders the child puts first on ``sys.path`` for a ``python:`` model (the
    #: scenarios file's folder; not part of the id: moving the folder changes nothing)
    python_path: tuple[str, ...] = ()
    #: steps recorded with torch.profiler after the warm-up (0: no profile; not part
    #: of the id: it measures the setup rather than changing it, and the profiled
    #: steps are left out of the measured window)
    profile_steps: int = 0
    #: the interpreter it runs under and that one's versions (``environments:``); None:
    #: the one running tunematrix
    environment: Environment | None = None
    #: its 1-based place in the plan's run order (``orchestrator.matrix.order``; not part
    #: of the id: the same cell may run at another place in another plan)
    position: int | None = None
    #: steady-state measuring (``measure: {until: steady}``, ``--until steady``); None:
    #: the fixed max_steps. Part of the id only when set, so other ids stay as they were
    measure: SteadyMeasure | None = None
    #: the host memory allocator its processes run under (``allocator:``); None: as the
    #: environment has it. Part of the id only when set, so other ids stay as they were
    allocator: Allocator | None = None
    #: where each of its settings was written (not part of the id): an argument's name
    #: (as tunematrix spells it) or a data_processing key -> its file, line and key
    #: path; ``""``: the scenario
    places: Mapping[str, Place] = field(default_factory=dict, compare=False, repr=False)
    #: its model was found in the hub cache while the hub could not be reached
    #: (``orchestrator.running.stackcheck``): the job runs with ``HF_HUB_OFFLINE=1`` rather
    #: than wait out the hub's retries (not part of the id)
    hub_offline: bool = False
    #: its predicted GPU memory against the device's, from the check before launch
    #: (``orchestrator.running.memoryfit``; not part of the id nor of its spec)
    memory: MemoryVerdict | None = field(default=None, compare=False, repr=False)

    def has_place(self, key: str) -> bool:
        """Whether setting ``key`` was written somewhere (rather than set by tunematrix)."""
        return canonical_name(key) in self.places

    def place(self, key: str | None = None) -> Place:
        """Where setting ``key`` was written (the scenario, where it has no line of its own)."""
        found = self.places.get(canonical_name(key)) if key else None
        return found or self.places.get("") or Place(key=f"scenario '{self.scenario}'")

    @property
    def python(self) -> str | None:
        """The interpreter of its ``accelerate launch``; None: the one running tunematrix."""
        return self.environment.python if self.environment is not None else None

    @property
    def processes(self) -> int:
        """Training processes: one per GPU, or one for all of them (``distributed_type: NO``,
        the ``dp`` framework's DataParallel)."""
        return frameworks.processes(self.accelerate, self.num_gpus)

    def int_argument(self, key: str) -> int | None:
        """Argument ``key`` where it is an integer (not a boolean), else None."""
        value = self.arguments.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    @property
    def peft_method(self) -> str | None:
        value = self.arguments.get("peft_method")
        return None if value is None else str(value)

    @property
    def task(self) -> str:
        """What the cell trains (``causal-lm``, ...): the planner always names it."""
        return str(self.arguments.get(TASK_KEY, DEFAULT_TASK))

    @property
    def trainer(self) -> str:
        """The trainer backend (``sft``, ``hf``): the planner always names it."""
        return str(self.arguments.get(BACKEND_KEY, default_backend(self.task)))

    @property
    def torch_dtype(self) -> str | None:
        value = self.arguments.get("torch_dtype")
        return None if value is None else str(value)

    def spec(self) -> dict[str, Any]:
        """The JSON-ready description of the experiment (``spec.json`` without paths)."""
        # an environment's fields only where one is named: other specs stay as they were
        environment = (
            {
                "environment": self.environment.name,
                "environment_python": self.environment.python,
                "environment_versions": dict(self.environment.versions),
            }
            if self.environment is not None
            else {}
        )
        return {
            **environment,
            "experiment_id": self.experiment_id,
            "cell_id": self.cell_id,
            "scenario": self.scenario,
            "framework_config": self.framework,
            "model_name_or_path": self.model_name_or_path,
            "device": self.device,
            "num_gpus": self.num_gpus,
            "processes": self.processes,
            "effective_batch_size": self.effective_batch_size,
            "per_device_train_batch_size": self.per_device_train_batch_size,
            "gradient_accumulation_steps": self.gradient_accumulation_steps,
            "max_seq_len": self.max_seq_len,
            "packing": self.packing,
            "repeat": self.repeat,
            "arguments": dict(self.arguments),
            "swept": dict(self.swept),
            "accelerate_config": str(self.accelerate.path) if self.accelerate else None,
            "env": dict(self.env),
            "data_processing": dict(self.data_processing) if self.data_processing else None,
            "python_path": list(self.python_path),
            # only where profiled: other specs stay as they were
            **({"profile_steps": self.profile_steps} if self.profile_steps else {}),
            **({"position": self.position} if self.position is not None else {}),
            # only in steady-state mode: other specs stay as they were
            **({"measure": self.measure.identity()} if self.measure is not None else {}),
            # only where the scenario names an allocator: other specs stay as they were
            **({"allocator": self.allocator.model_dump()} if self.allocator is not None else {}),
        }


def allocator_id(experiment_id: str, allocator: Allocator) -> str:
    """``experiment_id`` with the allocator hashed into its ``-<hash8>``: a cell run under a
    stated allocator is another experiment than the same cell under the environment's."""
    readable, _, digest = experiment_id.rpartition("-")
    return f"{readable}-{spec_hash({'cell': digest, 'allocator': allocator.identity()})}"


def with_allocator(cell: Experiment, allocator: Allocator | None) -> Experiment:
    """``cell`` run under ``allocator``: its ids carry it (``cell`` itself where None)."""
    if allocator is None:
        return cell
    return dataclasses.replace(
        cell,
        experiment_id=allocator_id(cell.experiment_id, allocator),
        cell_id=allocator_id(cell.cell_id, allocator),
        allocator=allocator,
    )
