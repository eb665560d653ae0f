"""The command and environment of one experiment's ``accelerate launch``.

Pure functions: the plan prints what they return, and the runner executes it.
Every experiment goes through ``accelerate launch``, one process or many, so a
1-GPU cell and an N-GPU cell differ only in N.
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from orchestrator.contract.allocators import PRELOAD
from orchestrator.contract.layout import ResultsLayout
from orchestrator.matrix.experiment import Experiment
from orchestrator.matrix.frameworks import cpu_launch_flag
from orchestrator.matrix.launches import families

#: Shown in a plan, where the real port is picked free at launch.
PLAN_PORT = 29500


def accelerate_command(python: str | None = None) -> list[str]:
    """``accelerate launch`` of ``python`` (an experiment's environment; default: the
    interpreter running tunematrix).

    The ``accelerate`` script beside that Python when there is one (a venv);
    otherwise the same launcher as a module, so a job never picks up another
    environment's accelerate from the PATH.
    """
    interpreter = python or sys.executable
    script = Path(interpreter).with_name("accelerate")
    if script.is_file():
        return [str(script), "launch"]
    return [interpreter, "-m", "accelerate.commands.launch"]


@dataclass(frozen=True)
class LaunchSite:
    """Where this launch sits in a job: one machine, or one of several (a multi-node job)."""

    num_machines: int = 1
    machine_rank: int = 0
    #: the first machine's address; None on one machine
    main_process_ip: str | None = None


def launch_argv(
    experiment: Experiment,
    spec: Path,
    *,
    port: int,
    accelerate: Sequence[str] = ("accelerate", "launch"),
    site: LaunchSite | None = None,
    later_specs: Sequence[Path] = (),
) -> list[str]:
    """``accelerate launch [flags] -m trainer_entry --spec SPEC`` as an argument list.

    ``later_specs``: experiments of the same family that run after it in this launch
    (``--launch family``), each another ``--spec``.

    On GPUs the accelerate config decides the distributed type (FSDP, DDP,
    DeepSpeed, or one DataParallel process: ``--num_processes`` is the cell's
    processes, not always its GPUs). On the CPU one process runs with
    ``--cpu``; several run as gloo DDP through ``--multi_gpu``, which is
    accelerate's multi-process launcher whatever the device; a DeepSpeed
    config gets neither, as either flag would override it
    (``orchestrator.matrix.frameworks``). Across machines, ``--num_processes``
    is the total, and each machine passes its rank and the first machine's
    address.
    """
    site = site or LaunchSite()
    argv = list(accelerate)
    if experiment.accelerate is not None:
        argv += ["--config_file", str(experiment.accelerate.path)]
    argv += [
        "--num_processes",
        str(experiment.processes),
        "--num_machines",
        str(site.num_machines),
        "--main_process_port",
        str(port),
    ]
    if site.num_machines > 1:
        argv += ["--machine_rank", str(site.machine_rank)]
        if site.main_process_ip:
            argv += ["--main_process_ip", site.main_process_ip]
    if experiment.device == "cpu":
        single = experiment.processes == 1 and site.num_machines == 1
        flag = cpu_launch_flag(experiment.accelerate, single=single)
        argv += [flag] if flag else []
    argv += ["-m", "trainer_entry", "--spec", str(spec)]
    for later in later_specs:
        argv += ["--spec", str(later)]
    return argv


def job_env(
    experiment: Experiment,
    devices: Sequence[str],
    inherited: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Environment variables set for the job on top of the parent's (``inherited``,
    default ``os.environ``, which the job gets too).

    ``devices`` are the ``CUDA_VISIBLE_DEVICES`` entries the scheduler gave the
    job; a CPU job sees no GPU at all. A stated allocator sets its variables and
    preloads its library ahead of what ``LD_PRELOAD`` already names (the framework's,
    else the parent's); without one, the parent's allocator variables reach the job
    unchanged.
    """
    env = {
        "CUDA_VISIBLE_DEVICES": ",".join(devices) if experiment.device == "gpu" else "",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "TOKENIZERS_PARALLELISM": "false",
    }
    env.update(experiment.env)
    if experiment.allocator is not None:
        parent = os.environ if inherited is None else inherited
        preloaded = env.get(PRELOAD, parent.get(PRELOAD))
        env.update(experiment.allocator.environment(preloaded))
    return env


# ---------------------------------------------------------------------------
# The preview's commands (``tunematrix plan --commands``)


def command_for(
    experiment: Experiment, layout: ResultsLayout, later: Sequence[Experiment] = ()
) -> tuple[dict[str, str], list[str]]:
    """The environment overlay and argv that ``run`` will use (GPUs 0..N-1, plan port);
    ``later``: the experiments of its family that follow it in the same launch."""
    devices = [str(i) for i in range(experiment.num_gpus)]
    env = job_env(experiment, devices)
    argv = launch_argv(
        experiment,
        layout.run(experiment.experiment_id).spec,
        port=PLAN_PORT,
        accelerate=accelerate_command(experiment.python),
        later_specs=[layout.run(e.experiment_id).spec for e in later],
    )
    return env, argv


def format_commands(
    experiments: Sequence[Experiment], layout: ResultsLayout, launch: str = "cell"
) -> str:
    """The preview's commands: one per experiment, or with ``launch="family"`` one per
    family (``orchestrator.matrix.launches``), its experiments' specs in turn."""
    lines = [
        "# The exact command of each "
        + ("launch" if launch == "family" else "experiment")
        + ". At run time the scheduler picks the",
        f"# GPUs and a free --main_process_port (shown here as {PLAN_PORT}), and writes",
        "# runs/<experiment_id>/spec.json before launching.",
    ]
    if launch == "family":
        lines.append("# One launch per family: after a run that does not finish, the rest of its")
        lines.append("# family are launched afresh (or pruned).")
    groups = families(experiments) if launch == "family" else [[e] for e in experiments]
    for group in groups:
        env, argv = command_for(group[0], layout, later=group[1:])
        lines.extend(f"# {e.experiment_id}" for e in group)
        lines.append(shlex.join(["env", *_env_words(env), *argv]))
    return "\n".join(lines)


def _env_words(env: Mapping[str, str]) -> list[str]:
    return [f"{k}={v}" for k, v in env.items()]
