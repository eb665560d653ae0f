"""A real local Ray cluster for the tests: node processes started with ``ray start --block``.

``RayCluster.start`` starts a head (``ray start --head --block``) and
``add_node`` adds worker nodes (``ray start --address HEAD --block``), each a
process in a session of its own, with its own ports (free ones, chosen here),
in one temp folder of the cluster's (``RAY_TMPDIR``, ``--temp-dir``). A node
can start inside a memory cgroup (``preexec_fn``) or under a wrapper argv
(``unshare -m ...``: a mount namespace of its own).

Teardown is by the sessions started here, never ``ray stop`` (which stops
every Ray cluster of the machine): every Ray process of a node (its GCS,
raylet, agents and workers; workers take process groups of their own but keep
the session) carries the session id of its ``ray start``, so ``stop_node``
TERMs the ``ray start`` (which stops its children), waits, KILLs whatever is
left in the session, and checks the session is empty. Processes that leave
the session on purpose (a job's ``accelerate launch``, in a session of its
own) are what the tests' orphan checks look for.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RAY = Path(sys.executable).with_name("ray")
#: the smallest object store Ray accepts (bytes): the tests move no objects
OBJECT_STORE_BYTES = 80 * 1024 * 1024


def free_ports(count: int) -> list[int]:
    """Ports free right now (the kernel's picks), all distinct."""
    socks, ports = [], []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
            ports.append(int(s.getsockname()[1]))
    finally:
        for s in socks:
            s.close()
    return ports


def session_pids(sid: int) -> list[int]:
    """The processes of session ``sid``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # after the name: state ppid pgrp session ...; a zombie holds nothing
        if int(fields[3]) == sid and fields[0] != "Z":
            found.append(int(entry))
    return found


def processes_mentioning(text: str) -> list[str]:
    """Live processes whose command line contains ``text`` (an orphan check)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if text in cmdline and state != "Z":
            found.append(f"{entry}: {cmdline[:200]}")
    return found


@dataclass
class RayNode:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path

    @property
    def sid(self) -> int:
        return self.proc.pid

    def pids(self) -> list[int]:
        return session_pids(self.sid)


@dataclass
class RayCluster:
    temp: Path
    address: str = ""
    nodes: list[RayNode] = field(default_factory=list)

    @property
    def env(self) -> dict[str, str]:
        """What a driver (``tunematrix run``) needs to reach this cluster and only it."""
        return {
            **os.environ,
            "RAY_ADDRESS": self.address,
            "RAY_TMPDIR": str(self.temp),
            "PYTHONPATH": str(REPO),
            "HF_HUB_OFFLINE": "1",
            "OMP_NUM_THREADS": "1",
            "RAY_USAGE_STATS_ENABLED": "0",
        }

    def _start(
        self,
        name: str,
        argv: list[str],
        *,
        wrapper: Sequence[str] = (),
        preexec_fn: Callable[[], None] | None = None,
        extra_env: Mapping[str, str] | None = None,
    ) -> RayNode:
        log = self.temp / f"{name}.log"
        env = {**self.env, **(extra_env or {})}
        env.pop("RAY_ADDRESS")
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [*wrapper, *argv],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
                preexec_fn=preexec_fn,
            )
        node = RayNode(name, proc, log)
        self.nodes.append(node)
        return node

    def _ports(self) -> list[str]:
        names = (
            "--node-manager-port",
            "--object-manager-port",
            "--dashboard-agent-grpc-port",
            "--dashboard-agent-listen-port",
            "--runtime-env-agent-port",
            "--metrics-export-port",
        )
        ports = free_ports(len(names))
        argv = [f"{n}={p}" for n, p in zip(names, ports, strict=True)]
        # each node its own range of worker ports, below the kernel's ephemeral range
        # (32768 and up, where the free ports above come from)
        base = 10000 + (os.getpid() % 90) * 200 + len(self.nodes) * 30
        return [*argv, f"--min-worker-port={base}", f"--max-worker-port={base + 29}"]

    def start_head(self, num_cpus: int) -> None:
        (port,) = free_ports(1)
        self.address = f"127.0.0.1:{port}"
        argv = [
            str(RAY),
            "start",
            "--head",
            "--block",
            f"--port={port}",
            "--node-ip-address=127.0.0.1",
            f"--num-cpus={num_cpus}",
            "--num-gpus=0",
            "--include-dashboard=false",
            f"--temp-dir={self.temp}",
            f"--object-store-memory={OBJECT_STORE_BYTES}",
            "--disable-usage-stats",
            *self._ports(),
        ]
        self._start("head", argv)
        self.wait_for_nodes(1)

    def add_node(
        self,
        name: str,
        num_cpus: int,
        *,
        resources: Mapping[str, float] | None = None,
        wrapper: Sequence[str] = (),
        preexec_fn: Callable[[], None] | None = None,
        extra_env: Mapping[str, str] | None = None,
        wait: bool = True,
    ) -> RayNode:
        """Start a worker node and (``wait``) wait until the cluster counts it."""
        argv = [
            str(RAY),
            "start",
            f"--address={self.address}",
            "--block",
            "--node-ip-address=127.0.0.1",
            f"--num-cpus={num_cpus}",
            "--num-gpus=0",
            f"--temp-dir={self.temp}",
            f"--object-store-memory={OBJECT_STORE_BYTES}",
            "--disable-usage-stats",
            *self._ports(),
        ]
        if resources:
            argv.append(f"--resources={json.dumps(dict(resources))}")
        node = self._start(name, argv, wrapper=wrapper, preexec_fn=preexec_fn, extra_env=extra_env)
        if wait:
            self.wait_for_nodes(len(self.nodes))
        return node

    def alive(self) -> list[dict[str, object]]:
        """The cluster's alive nodes, as ``ray list nodes`` would say (asked by a driver)."""
        # the driver finds the cluster through RAY_ADDRESS (self.env)
        code = (
            "import json, ray; ray.init(logging_level='ERROR', log_to_driver=False);"
            "print(json.dumps([n for n in ray.nodes() if n['Alive']], default=str))"
        )
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=self.env, timeout=120
        )
        if out.returncode != 0:
            return []
        found: list[dict[str, object]] = json.loads(out.stdout.strip().splitlines()[-1])
        return found

    @property
    def node_ids(self) -> dict[str, str]:
        """Ray's node id of each node started with a resource named after it."""
        names = {n.name for n in self.nodes}
        found = {}
        for node in self.alive():
            resources = node.get("Resources")
            for key in resources if isinstance(resources, dict) else {}:
                if key in names:
                    found[key] = str(node["NodeID"])
        return found

    def alive_count(self) -> int:
        return len(self.alive())

    def wait_for_nodes(self, count: int) -> None:
        """Until every node started here says it runs and the cluster counts ``count``."""
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            for node in self.nodes:
                if node.proc.poll() is not None:
                    raise RuntimeError(
                        f"ray start ({node.name}) exited: {node.log.read_text()[-2000:]}"
                    )
            started = all("Ray runtime started" in n.log.read_text() for n in self.nodes)
            if started and self.alive_count() >= count:
                return
            time.sleep(0.5)
        logs = " | ".join(n.log.read_text()[-500:] for n in self.nodes)
        raise RuntimeError(f"the Ray cluster did not reach {count} node(s): {logs}")

    def stop_node(self, node: RayNode) -> None:
        """TERM its ``ray start``, then KILL what is left of its session; check none is."""
        if node.proc.poll() is None:
            node.proc.send_signal(signal.SIGTERM)
            try:
                node.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                pass
        deadline = time.monotonic() + 15
        while node.pids() and time.monotonic() < deadline:
            for pid in node.pids():
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.2)
        if node.proc.poll() is None:
            node.proc.kill()
        node.proc.wait()
        left = node.pids()
        if node in self.nodes:
            self.nodes.remove(node)
        if left:
            raise RuntimeError(f"Ray node {node.name}: processes left after stopping: {left}")

    def kill_node(self, node: RayNode) -> None:
        """A node dying: KILL every process of its session at once (no cleanup of its own)."""
        for pid in node.pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.stop_node(node)

    def stop(self) -> None:
        errors = []
        for node in reversed(list(self.nodes)):
            try:
                self.stop_node(node)
            except RuntimeError as exc:
                errors.append(str(exc))
        shutil.rmtree(self.temp, ignore_errors=True)
        if errors:
            raise RuntimeError("; ".join(errors))


def start_cluster(
    head_cpus: int, worker_cpus: int, more: Callable[[RayCluster], None] = lambda c: None
) -> RayCluster:
    """A head and one worker node, and those ``more`` adds; one after the other (nodes
    that start together on a busy machine can time out registering with the head).
    Skips (with the reason) where Ray cannot run here."""
    if not RAY.exists():
        pytest.skip(
            f"ray is not installed in this environment ({RAY} missing): pip install 'tunematrix[ray]'"
        )
    # short: Ray's unix sockets live under it (a socket path holds at most 107 bytes)
    cluster = RayCluster(Path(tempfile.mkdtemp(prefix="tmray-", dir="/tmp")))
    try:
        cluster.start_head(head_cpus)
        cluster.add_node("worker", worker_cpus)
        more(cluster)
    except Exception:
        cluster.stop()
        raise
    return cluster
