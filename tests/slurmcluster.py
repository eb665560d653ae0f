"""A real one-node SLURM cluster for the tests: Debian's slurm-wlm and munge, started here.

Where the packages are missing it installs nothing and says so (the tests skip
with that line; ``.ci/run`` installs them as root). Writes
a ``slurm.conf`` for this host (cons_tres, proctrack/linuxproc, no cgroups,
a job completion log instead of a database), starts ``munged``,
``slurmctld`` and ``slurmd``, and stops them by their pids. Anything that
prevents it is a reason to skip, returned rather than raised.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "sinfo", "scancel", "scontrol")


@dataclass
class Cluster:
    folder: Path
    conf: Path
    pids: dict[str, int] = field(default_factory=dict)

    @property
    def env(self) -> dict[str, str]:
        return {
            "SLURM_CONF": str(self.conf),
            "PATH": os.environ.get("PATH", "") + ":/usr/sbin:/sbin",
        }

    def stop(self) -> None:
        cancel_every_job({**os.environ, **self.env})
        for name in ("slurmd", "slurmctld", "munged"):
            pid = self.pids.get(name)
            if not pid:
                continue
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
            for _ in range(50):
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.1)


def cancel_every_job(env: dict[str, str], wait_s: float = 20) -> None:
    """scancel this user's jobs on the cluster and wait until none is left: a job of a
    test whose orchestrator was killed must not outlive the cluster (its processes
    would stay after slurmd)."""
    import pwd

    user = pwd.getpwuid(os.getuid()).pw_name
    try:
        subprocess.run(
            ["scancel", "--quiet", f"--user={user}"], env=env, capture_output=True, timeout=30
        )
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            queue = subprocess.run(
                ["squeue", "-h", f"--user={user}", "-o", "%i"],
                env=env,
                capture_output=True,
                text=True,
                timeout=30,
            )
            if queue.returncode != 0 or not queue.stdout.strip():
                return
            time.sleep(0.5)
    except (OSError, subprocess.TimeoutExpired):
        return


def _which(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin:/usr/bin")


def _missing() -> str | None:
    """Why SLURM cannot run here (what is missing, and how to install it), or None.

    Nothing is installed here: ``.ci/run`` installs slurm-wlm, munge and iproute2
    (as root, with apt-get) and says so; elsewhere the SLURM tests skip with this line.
    """
    missing = [b for b in BINARIES if not _which(b)]
    if not missing:
        return None
    return (
        f"{', '.join(missing)} not found: install slurm-wlm and munge "
        "(as root: apt-get install slurm-wlm munge iproute2) to run the SLURM tests"
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pid(path: Path, timeout: float = 10) -> int | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            return int(path.read_text().strip())
        except (OSError, ValueError):
            time.sleep(0.1)
    return None


def start(folder: Path) -> Cluster | str:
    """A running cluster, or the reason there is none."""
    if os.geteuid() != 0:
        return "a SLURM cluster for the tests needs root (slurmd starts jobs as their user)"
    reason = _missing()
    if reason:
        return reason
    host = socket.gethostname().split(".")[0]
    for sub in ("state", "spool", "log"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    memory_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20 - 1024
    conf = folder / "slurm.conf"
    conf.write_text(
        f"""ClusterName=tunematrix
SlurmctldHost={host}
SlurmUser=root
SlurmdUser=root
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd.pid
SlurmctldLogFile={folder}/log/slurmctld.log
SlurmdLogFile={folder}/log/slurmd.log
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
JobCompType=jobcomp/filetxt
JobCompLoc={folder}/jobcomp.txt
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
ReturnToService=2
InactiveLimit=0
KillWait=10
MinJobAge=600
NodeName={host} CPUs={os.cpu_count() or 1} RealMemory={max(1024, memory_mb)} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""
    )
    cluster = Cluster(folder=folder, conf=conf)
    env = {**os.environ, **cluster.env}
    munged = _munge(folder)
    if isinstance(munged, str):
        return munged
    if munged:
        cluster.pids["munged"] = munged
    for daemon in ("slurmctld", "slurmd"):
        proc = subprocess.run(
            [_which(daemon) or daemon, "-f", str(conf)], capture_output=True, text=True, env=env
        )
        if proc.returncode != 0:
            cluster.stop()
            return f"{daemon} did not start: {' '.join(proc.stderr.split())[:300]}"
        pid = _pid(folder / f"{daemon}.pid")
        if pid:
            cluster.pids[daemon] = pid
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        state = subprocess.run(
            ["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, env=env
        ).stdout
        if "idle" in state:
            return cluster
        time.sleep(0.5)
    cluster.stop()
    log = (
        (folder / "log" / "slurmctld.log").read_text()[-500:]
        if (folder / "log" / "slurmctld.log").exists()
        else ""
    )
    return f"the SLURM node did not come up: {' '.join(log.split())[-300:]}"


def _munge(folder: Path) -> int | str | None:
    """Start munged where it does not run: its pid (None: it ran already), or why not."""
    munge_socket = Path("/run/munge/munge.socket.2")
    if munge_socket.exists():
        return None
    Path("/run/munge").mkdir(parents=True, exist_ok=True)
    shutil.chown("/run/munge", "munge", "munge") if _user_exists("munge") else None
    if not Path("/etc/munge/munge.key").exists():
        subprocess.run(["mungekey", "--create"], capture_output=True)
    proc = subprocess.run(
        [_which("munged") or "munged", "--force", "--pid-file", str(folder / "munged.pid")],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        return f"munged did not start: {' '.join(proc.stderr.split())[:300]}"
    return _pid(folder / "munged.pid")


def _user_exists(name: str) -> bool:
    import pwd

    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


# ---------------------------------------------------------------------------
# Two (or more) nodes on this one machine: one slurmctld in the root network
# namespace, on a bridge; every slurmd in a network namespace of its own
# (``ip netns``, a veth pair into the bridge, its own address), with its own
# node name (``slurmd -N``), sharing munge (a Unix socket: the namespaces share
# the filesystem). Each slurmd starts in a private mount namespace of its own
# with ``/etc/netns/<ns>/hosts`` bound over ``/etc/hosts`` (what ``ip netns
# exec`` does; that one also remounts /sys without the cgroup filesystems
# slurmd needs, so ``nsenter --net`` instead): there every node name, and this
# machine's host name (gloo picks its interface by resolving it), map to that
# namespace's address. A filesystem mounted here after the cluster started is
# not seen on the nodes (a folder that is not shared, as on a real cluster).
# ---------------------------------------------------------------------------

NETNS_ETC = Path("/etc/netns")
#: run in a node's new mount namespace: its hosts file over /etc/hosts, then slurmd
_ENTER = (
    "import os, subprocess, sys; "
    "subprocess.run(['mount', '--bind', sys.argv[1], '/etc/hosts'], check=True); "
    "os.execv(sys.argv[2], sys.argv[2:])"
)


@dataclass
class Node:
    name: str
    #: the network namespace (named like the node)
    netns: str
    address: str
    pid: int | None = None

    def pids(self) -> list[int]:
        """Every process in the node's namespace (slurmd, its steps, the job's)."""
        proc = subprocess.run(["ip", "netns", "pids", self.netns], capture_output=True, text=True)
        return [int(p) for p in proc.stdout.split() if p.isdigit()]


@dataclass
class MultiCluster(Cluster):
    nodes: list[Node] = field(default_factory=list)
    bridge: str = ""
    #: how long the start took, in seconds
    start_s: float = 0.0

    def stop(self) -> None:
        # the slurmds first (they say goodbye to the controller), then the controller and
        # munge together (each takes seconds to shut down), then what the slurmds left
        _stop_pids([n.pid for n in self.nodes], grace_s=10)
        _stop_pids([self.pids.get("slurmctld"), self.pids.get("munged")], grace_s=10)
        for node in self.nodes:
            # the job steps slurmd started (already gone when slurmd stopped them)
            _stop_pids(node.pids(), grace_s=2)
            subprocess.run(["ip", "netns", "del", node.netns], capture_output=True)
            shutil.rmtree(NETNS_ETC / node.netns, ignore_errors=True)
        if self.bridge:
            subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)
        try:
            NETNS_ETC.rmdir()  # only where no other namespace keeps its files there
        except OSError:
            pass
        shutil.rmtree(self.folder, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _stop_pids(pids: list[int | None], grace_s: float = 5) -> None:
    """TERM each pid, wait up to ``grace_s`` for all, then KILL what is left."""
    left = []
    for pid in pids:
        if not pid:
            continue
        try:
            os.kill(pid, signal.SIGTERM)
            left.append(pid)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace_s
    while left and time.monotonic() < deadline:
        left = [pid for pid in left if _alive(pid)]
        time.sleep(0.05)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _stop_pid(pid: int | None, grace_s: float = 5) -> None:
    _stop_pids([pid], grace_s)


def _ip(*argv: str) -> str | None:
    """Run ``ip ARGV``; the error, or None."""
    proc = subprocess.run(["ip", *argv], capture_output=True, text=True)
    return None if proc.returncode == 0 else f"ip {' '.join(argv)}: {proc.stderr.strip()[:200]}"


def _free_subnet() -> str:
    """``10.X.Y`` not used by any address here."""
    used = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True).stdout
    while True:
        prefix = f"10.{random.randint(200, 249)}.{random.randint(0, 255)}"
        if f" {prefix}." not in used:
            return prefix


def start_nodes(folder: Path, count: int = 2, cpus: int = 1) -> MultiCluster | str:
    """A running cluster of ``count`` nodes of ``cpus`` CPUs each, or the reason there is none."""
    started = time.monotonic()
    if os.geteuid() != 0:
        return "a multi-node SLURM cluster for the tests needs root (network namespaces)"
    if not shutil.which("ip"):
        return "a multi-node SLURM cluster needs the ip command (iproute2)"
    reason = _missing()
    if reason:
        return reason
    host = socket.gethostname().split(".")[0]
    sid = f"{os.getpid() % 4096:03x}{random.randint(0, 4095):03x}"  # unique per session
    prefix = _free_subnet()
    bridge_ip = f"{prefix}.1"
    for sub in ("state", "spool", "log"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    memory_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20 // count - 512
    nodes = [
        Node(f"tm{sid}n{i + 1}", f"tm{sid}n{i + 1}", f"{prefix}.{11 + i}") for i in range(count)
    ]
    cluster = MultiCluster(folder=folder, conf=folder / "slurm.conf", nodes=[], bridge="")
    node_lines = "\n".join(
        f"NodeName={n.name} NodeAddr={n.address} NodeHostname={n.name} CPUs={cpus} "
        f"RealMemory={max(1024, memory_mb)} State=UNKNOWN"
        for n in nodes
    )
    cluster.conf.write_text(
        f"""ClusterName=tunematrix
SlurmctldHost={host}({bridge_ip})
SlurmUser=root
SlurmdUser=root
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool/%n
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd.%n.pid
SlurmctldLogFile={folder}/log/slurmctld.log
SlurmdLogFile={folder}/log/slurmd.%n.log
AuthType=auth/munge
AuthInfo=socket={folder}/munge/munge.socket
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
JobCompType=jobcomp/filetxt
JobCompLoc={folder}/jobcomp.txt
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
ReturnToService=2
InactiveLimit=0
KillWait=10
MinJobAge=600
{node_lines}
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""
    )
    try:
        reason = _network(cluster, nodes, f"tm{sid}br", bridge_ip, host)
        if reason:
            cluster.stop()
            return reason
        munged = _own_munge(folder)
        if isinstance(munged, str):
            cluster.stop()
            return munged
        cluster.pids["munged"] = munged
        env = {**os.environ, **cluster.env}
        proc = subprocess.run(
            [_which("slurmctld") or "slurmctld", "-f", str(cluster.conf)],
            capture_output=True,
            text=True,
            env=env,
        )
        pid = _pid(folder / "slurmctld.pid")
        if proc.returncode != 0 or not pid:
            cluster.stop()
            return f"slurmctld did not start: {' '.join(proc.stderr.split())[:300]}"
        cluster.pids["slurmctld"] = pid
        for node in nodes:
            # its own network namespace (nsenter, not ``ip netns exec``, which remounts
            # /sys without the cgroup filesystems slurmd needs), a private mount
            # namespace, and the namespace's hosts file over /etc/hosts
            argv = ["nsenter", f"--net=/run/netns/{node.netns}", "unshare", "--mount"]
            argv += ["--propagation", "private", sys.executable, "-c", _ENTER]
            argv += [str(NETNS_ETC / node.netns / "hosts"), _which("slurmd") or "slurmd"]
            argv += ["-N", node.name, "-f", str(cluster.conf)]
            proc = subprocess.run(argv, capture_output=True, text=True, env=env)
            node.pid = _pid(folder / f"slurmd.{node.name}.pid")
            if proc.returncode != 0 or not node.pid:
                log = folder / "log" / f"slurmd.{node.name}.log"
                said = proc.stderr + (log.read_text()[-400:] if log.exists() else "")
                cluster.stop()
                return f"slurmd -N {node.name} did not start: {' '.join(said.split())[-300:]}"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            state = subprocess.run(
                ["sinfo", "-h", "-N", "-o", "%N %T"], capture_output=True, text=True, env=env
            ).stdout.split()
            if state.count("idle") == count:
                cluster.start_s = time.monotonic() - started
                return cluster
            time.sleep(0.2)
        log = folder / "log" / "slurmctld.log"
        tail = log.read_text()[-500:] if log.exists() else ""
        cluster.stop()
        return f"the SLURM nodes did not come up: {' '.join(tail.split())[-300:]}"
    except BaseException:
        cluster.stop()
        raise


def _own_munge(folder: Path) -> int | str:
    """A munged of this cluster's own, on a socket in ``folder`` (so clusters started
    side by side never stop each other's): its pid, or why not."""
    if not Path("/etc/munge/munge.key").exists():
        subprocess.run(["mungekey", "--create"], capture_output=True)
    where = folder / "munge"
    where.mkdir(mode=0o700, exist_ok=True)
    argv = [_which("munged") or "munged", "--force", f"--socket={where / 'munge.socket'}"]
    argv += [f"--pid-file={where / 'munged.pid'}", f"--log-file={where / 'munged.log'}"]
    argv += [f"--seed-file={where / 'munged.seed'}"]
    proc = subprocess.run(argv, capture_output=True, text=True)
    pid = _pid(where / "munged.pid") if proc.returncode == 0 else None
    if not pid:
        return f"munged did not start: {' '.join(proc.stderr.split())[:300]}"
    return pid


def _network(
    cluster: MultiCluster, nodes: list[Node], bridge: str, bridge_ip: str, host: str
) -> str | None:
    """The bridge here, a namespace per node wired into it, and their hosts files."""
    reason = _ip("link", "add", bridge, "type", "bridge")
    if reason:
        return f"cannot create a bridge: {reason}"
    cluster.bridge = bridge
    for step in (("addr", "add", f"{bridge_ip}/24", "dev", bridge), ("link", "set", bridge, "up")):
        if reason := _ip(*step):
            return reason
    for node in nodes:
        reason = _ip("netns", "add", node.netns)
        if reason:
            return f"cannot create a network namespace: {reason}"
        cluster.nodes.append(node)
        outside, inside = f"{node.netns}h", f"{node.netns}c"
        steps: list[tuple[str, ...]] = [
            ("link", "add", outside, "type", "veth", "peer", "name", inside),
            ("link", "set", inside, "netns", node.netns),
            ("link", "set", outside, "master", bridge),
            ("link", "set", outside, "up"),
            ("-n", node.netns, "addr", "add", f"{node.address}/24", "dev", inside),
            ("-n", node.netns, "link", "set", inside, "up"),
            ("-n", node.netns, "link", "set", "lo", "up"),
        ]
        for step in steps:
            if reason := _ip(*step):
                return reason
        etc = NETNS_ETC / node.netns
        etc.mkdir(parents=True, exist_ok=True)
        names = "\n".join(f"{n.address} {n.name}" for n in nodes if n is not node)
        (etc / "hosts").write_text(
            f"127.0.0.1 localhost\n{node.address} {node.name} {host}\n{names}\n{bridge_ip} {host}-ctl\n"
        )
    return None
