"""A real one-node SLURM cluster for the tests: Debian's slurm-wlm and munge, started here.

Installs the packages where they are missing (as root, with apt-get), writes
a ``slurm.conf`` for this host (cons_tres, proctrack/linuxproc, no cgroups,
a job completion log instead of a database), starts ``munged``,
``slurmctld`` and ``slurmd``, and stops them by their pids. Anything that
prevents it is a reason to skip, returned rather than raised.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
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


def _which(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin:/usr/bin")


def _install() -> str | None:
    """Install slurm-wlm and munge if missing; the reason it cannot, or None."""
    if all(_which(b) for b in BINARIES):
        return None
    if os.geteuid() != 0:
        return "SLURM is not installed and installing it needs root"
    if not shutil.which("apt-get"):
        return "SLURM is not installed and there is no apt-get to install it"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (
        ["apt-get", "update", "-q"],
        ["apt-get", "install", "-y", "-q", "slurm-wlm", "munge"],
    ):
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=900)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"installing SLURM failed: {exc}"
        if proc.returncode != 0:
            return f"installing SLURM failed: {' '.join(proc.stderr.split())[-300:]}"
    missing = [b for b in BINARIES if not _which(b)]
    return f"SLURM installed but {', '.join(missing)} missing" if missing else None


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
    reason = _install()
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
KillWait=5
MinJobAge=600
NodeName={host} CPUs={os.cpu_count() or 1} RealMemory={max(1024, memory_mb)} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""
    )
    cluster = Cluster(folder=folder, conf=conf)
    env = {**os.environ, **cluster.env}
    munge_socket = Path("/run/munge/munge.socket.2")
    if not munge_socket.exists():
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
        pid = _pid(folder / "munged.pid")
        if pid:
            cluster.pids["munged"] = pid
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


def _user_exists(name: str) -> bool:
    import pwd

    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True
