"""The Ray executor's pure logic: settings, what a task asks for, what no node can hold,
Ray's endings -> statuses, doctor's line.

The real cluster path (placement on two nodes, faults, Ctrl-C, the shared-folder
check, refusals) is in tests/e2e/test_ray.py; here only what needs no cluster.
"""

from __future__ import annotations

import pytest

from orchestrator.cli.app import build_parser
from orchestrator.contract.errors import UserError
from orchestrator.executors import registry
from orchestrator.executors.raycluster import (
    NodeInfo,
    RayExecutor,
    RayModel,
    RaySettings,
    failure_status,
    requests,
    settings_from,
    unfit,
)
from orchestrator.executors.raycluster.doctor import RayFacts, readiness
from orchestrator.executors.raycluster.settings import parse_resource

GPU_SCENARIO = """\
scenarios:
  - name: big
    num_gpus: [8]
    arguments:
      model_name_or_path: tiny-llama
"""

CPU_SCENARIO = """\
scenarios:
  - name: small
    device: cpu
    num_gpus: [4]
    arguments:
      model_name_or_path: tiny-llama
"""


def args(*argv: str):
    return build_parser().parse_args(["run", *argv])


def test_registered_under_ray_and_not_shadowing_the_package() -> None:
    assert registry.get("ray") is RayExecutor
    assert "ray" in registry.sections()
    # the package is orchestrator.executors.raycluster: `import ray` is Ray's
    assert RayExecutor.__module__ == "orchestrator.executors.raycluster"
    assert [n.module for n in RayExecutor.needs] == ["ray"]
    assert "pip install 'tunematrix[ray]'" in RayExecutor.needs[0].install


def test_the_address_is_the_flag_then_the_file_then_ray_address_then_auto(monkeypatch) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert settings_from(args(), None).address == "auto"
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    assert settings_from(args(), None).address == "10.0.0.1:6379"
    file = RayModel.model_validate({"address": "head:6379", "cpus_per_gpu": 8})
    assert settings_from(args(), file) == RaySettings(address="head:6379", cpus_per_gpu=8)
    flags = args("--ray-address", "ray://head:10001", "--ray-cpus-per-gpu", "2")
    assert settings_from(flags, file) == RaySettings(address="ray://head:10001", cpus_per_gpu=2)


def test_resources_from_the_file_and_the_flags() -> None:
    file = RayModel.model_validate({"resources": {"big_memory": 1.0, "a": 2.0}})
    got = settings_from(args("--ray-resource", "a=0.5", "--ray-resource", "x:y=1"), file)
    assert dict(got.resources) == {"big_memory": 1.0, "a": 0.5, "x:y": 1.0}
    assert parse_resource("accelerator_type:A100=0.001") == ("accelerator_type:A100", 0.001)
    for bad in ("a", "a=", "=1", "a=-1", "a=x"):
        with pytest.raises(UserError, match="NAME=AMOUNT"):
            parse_resource(bad)
    with pytest.raises(ValueError):
        RayModel.model_validate({"adress": "x"})


def test_ray_flags_are_refused_with_another_executor() -> None:
    with pytest.raises(UserError, match="only with --executor ray"):
        RayExecutor.check_flags(args(), registry.get("local"), ["--ray-address"])


def test_a_task_asks_for_its_gpus_or_one_cpu_per_process(plan) -> None:
    (gpu,) = plan(GPU_SCENARIO, num_gpus=[8], effective_batch_size=[8]).experiments
    assert requests(gpu, RaySettings()) == {"GPU": 8.0, "CPU": 8.0}
    assert requests(gpu, RaySettings(cpus_per_gpu=4, resources={"a100": 1})) == {
        "GPU": 8.0,
        "CPU": 32.0,
        "a100": 1,
    }
    (cpu,) = plan(CPU_SCENARIO, device="cpu", num_gpus=[4], effective_batch_size=[4]).experiments
    assert requests(cpu, RaySettings()) == {"CPU": 4.0}


def node(cpus: float, gpus: float = 0, **more: float) -> NodeInfo:
    return NodeInfo("n" * 20, "10.0.0.2", "host", {"CPU": cpus, "GPU": gpus, **more})


def test_an_experiment_no_single_node_holds_is_refused(plan) -> None:
    (gpu,) = plan(GPU_SCENARIO, num_gpus=[8], effective_batch_size=[8]).experiments
    nodes = [node(64, 4), node(64, 4)]
    why = unfit(gpu, requests(gpu, RaySettings()), nodes, "the Ray cluster at auto")
    # 8 GPUs in all, but Ray runs an experiment on one node
    assert why is not None and "needs 8 GPUs on one node; the largest node" in why
    assert "has 4 (2 node(s))" in why
    assert unfit(gpu, requests(gpu, RaySettings()), [node(64, 8)], "c") is None
    why = unfit(gpu, requests(gpu, RaySettings(cpus_per_gpu=16)), [node(64, 8)], "c")
    assert why is not None and "needs 128 CPUs (16 per GPU: --ray-cpus-per-gpu)" in why
    why = unfit(gpu, requests(gpu, RaySettings(resources={"a100": 1})), [node(64, 8)], "c")
    assert why is not None and "Ray resource a100=1; no node of c" in why
    # each resource on some node, but never all on one
    both = [node(64, 8), node(64, 0, a100=1)]
    why = unfit(gpu, requests(gpu, RaySettings(resources={"a100": 1})), both, "c")
    assert why is not None and "no node of c has all of it at once" in why


def test_ray_endings_map_to_our_statuses() -> None:
    from ray import exceptions as rex

    oom = rex.OutOfMemoryError("Task was killed due to the node running low on memory.")
    assert failure_status(oom, True)[0] == "oom"
    assert failure_status(rex.TaskCancelledError(), True)[0] == "interrupted"
    assert failure_status(rex.WorkerCrashedError(), True) == (
        "failed",
        "the Ray worker running it died",
    )
    # the worker's node is gone: that, not the worker, is what the user needs to hear
    assert failure_status(rex.WorkerCrashedError(), False) == (
        "failed",
        "the node died while running it",
    )
    assert failure_status(RuntimeError("boom"), None) == ("failed", "the Ray task raised")


def facts(**change: object) -> RayFacts:
    base = dict(
        installed=True, command="/bin/ray", address="auto", target="10.0.0.1:6379", error=None
    )
    return RayFacts(**{**base, **change})  # type: ignore[arg-type]


def test_doctor_line() -> None:
    assert readiness(facts()).state == "ok"
    assert "answers at auto -> 10.0.0.1:6379" in readiness(facts()).detail
    down = readiness(facts(error="Connection refused"))
    assert down.state == "warn" and "does not answer: Connection refused" in down.detail
    none = readiness(facts(target=None, error="no cluster started here (ray start --head)"))
    assert none.state == "info" and none.lacks == ("a Ray cluster",)
    missing = readiness(facts(installed=False, target=None))
    assert missing.state == "info" and "ray not installed" in missing.detail


def test_tasks_that_shared_a_node_in_time_are_packed_with_each_other() -> None:
    from orchestrator.executors.raycluster.submit import beside

    spans = {
        "a": ("n1", 10.0, 50.0),
        "b": ("n1", 40.0, None),  # still running, started before a ended
        "c": ("n1", 50.0, 60.0),  # started as a ended: not beside a
        "d": ("n2", 0.0, 100.0),  # another node
        "e": (None, None, None),  # never started
        "f": ("n1", 0.0, 10.0),  # ended as a started
    }
    assert beside("a", spans) == ["b"]
    assert beside("b", spans) == ["a", "c"]
    assert beside("c", spans) == ["b"]
    assert beside("d", spans) == []
    assert beside("e", spans) == []
    assert beside("f", spans) == []


def test_the_task_span_takes_the_nodes_end_else_the_drivers() -> None:
    from orchestrator.executors.raycluster.submit import span

    started = {"node_id": "n1", "started_at": 10.0}
    # the task recorded its end on its node's clock: that, not when the driver saw it
    assert span({**started, "ended_at": 20.0}, 25.0) == ("n1", 10.0, 20.0)
    # it did not return (killed, cancelled): the driver's end
    assert span(started, 25.0) == ("n1", 10.0, 25.0)
    assert span(started, None) == ("n1", 10.0, None)
    assert span({"name": "tunematrix:x"}, None) == (None, None, None)


def test_the_child_gets_the_drivers_omp_num_threads() -> None:
    from orchestrator.executors.raycluster.task import driver_threads

    # Ray set the task's CPUs in its worker; the driver had none: removed, so the child
    # chooses as it would from the driver
    worker = {"OMP_NUM_THREADS": "2", "PATH": "/bin"}
    driver_threads(worker, None)
    assert worker == {"PATH": "/bin"}
    driver_threads(worker, None)
    assert worker == {"PATH": "/bin"}
    driver_threads(worker, "1")
    assert worker == {"OMP_NUM_THREADS": "1", "PATH": "/bin"}
    worker["OMP_NUM_THREADS"] = "2"
    driver_threads(worker, "4")
    assert worker["OMP_NUM_THREADS"] == "4"


def test_an_http_address_is_refused_naming_the_port_to_give(monkeypatch) -> None:
    from orchestrator.executors.raycluster.cluster import connect, web_address

    line = web_address("http://raycluster-head-svc:8265")
    assert line is not None and "\n" not in line
    assert "dashboard" in line and "raycluster-head-svc:6379" in line
    assert "ray://raycluster-head-svc:10001" in line
    assert web_address("HTTPS://head") is not None
    for fine in ("auto", "10.0.0.1:6379", "head:6379", "ray://head:10001", "[::1]:6379"):
        assert web_address(fine) is None, fine
    # refused before any connection is tried
    with pytest.raises(UserError, match=r"give its head as HOST:6379"):
        connect(RaySettings(address="http://head:8265"))


def test_the_jobs_own_error_is_kept_when_rays_ending_chose_the_status(tmp_path, plan) -> None:
    from ray import exceptions as rex

    from orchestrator.contract.layout import ResultsLayout
    from orchestrator.contract.outcome import Outcome, read_outcome, write_outcome
    from orchestrator.executors.base import Ready
    from orchestrator.executors.raycluster.submit import Submitted, final_outcome

    (e,) = plan(CPU_SCENARIO, device="cpu", num_gpus=[4], effective_batch_size=[4]).experiments
    layout = ResultsLayout(tmp_path)
    run = layout.run(e.experiment_id)
    run.dir.mkdir(parents=True)
    write_outcome(run, Outcome(status="failed", error="rank 1 exited with code 9"))
    s = Submitted(Ready(e, run, 1), None, "abc123")
    got = final_outcome(s, layout, rex.WorkerCrashedError())
    assert got.status == "failed"
    assert got.error is not None
    assert got.error.startswith("the Ray worker running it died (Ray task abc123 on a Ray node")
    assert got.error.endswith("; the job said: rank 1 exited with code 9")
    assert read_outcome(run) == got
