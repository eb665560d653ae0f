"""The verdicts of a multi-node job's other nodes, and the rule that merges them into its outcome.

Node 0 writes the run's ``outcome.json``; node ``k`` (k ≥ 1) writes its own
verdict as ``outcome.node<k>.json`` next to its logs (``stderr.node<k>.log``).
When the executor collects the finished job, ``merge`` decides which node
explains the run: a node whose own rank died first (killed by the kernel's
OOM killer, or by a signal) is the root cause over node 0's "a peer went away"
failure. Memory peaks are the largest over the nodes; node 0's other figures
(times, utilisation, the result) stay.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from orchestrator.contract.layout import RunPaths, write_atomic
from orchestrator.contract.outcome import Outcome, Status, outcome_from_record

#: a verdict of a rank's death by a signal (``orchestrator.job.classify``'s wording)
_KILLED = re.compile(r"\bkilled by (?:SIG[A-Z0-9]+|signal \d+)")
#: node 0's statuses that another node's own death may explain (a peer that went away;
#: a rendezvous or collective that waited for a peer until the time limit)
_EXPLAINABLE: tuple[Status, ...] = ("failed", "timeout")


def outcome_path(run: RunPaths, rank: int) -> Path:
    """Node ``rank``'s own verdict (rank ≥ 1; node 0's is the run's ``outcome.json``)."""
    return run.dir / f"outcome.node{rank}.json"


def write_node_outcome(run: RunPaths, rank: int, outcome: Outcome) -> None:
    write_atomic(
        outcome_path(run, rank), json.dumps(outcome.as_dict(), indent=2, sort_keys=True) + "\n"
    )


def clear_node_outcomes(run: RunPaths) -> None:
    """Remove the other nodes' verdicts of an earlier launch (before submitting anew)."""
    for path in run.dir.glob("outcome.node*.json"):
        path.unlink(missing_ok=True)


def read_node_outcomes(run: RunPaths) -> dict[int, Outcome]:
    """Rank -> the verdict that node wrote (ranks ≥ 1), for every readable one."""
    found: dict[int, Outcome] = {}
    for path in run.dir.glob("outcome.node*.json"):
        match = re.fullmatch(r"outcome\.node(\d+)\.json", path.name)
        if not match:
            continue
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        outcome = outcome_from_record(record) if isinstance(record, dict) else None
        if outcome is not None:
            found[int(match.group(1))] = outcome
    return found


def died_first(outcome: Outcome) -> bool:
    """Whether a node's own rank died on its own: an OOM, or a death by a signal."""
    if outcome.status == "oom":
        return True
    return outcome.status == "failed" and bool(outcome.error and _KILLED.search(outcome.error))


#: the sidecar's per-device NVML peaks (device index -> bytes): every node numbers its own
_PER_DEVICE = "mem_nvidia_peak_bytes_per_device"


def fold_memory(primary: dict[str, Any], others: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """The job's memory figures over all its nodes (pure): each peak the largest any node
    saw, the GPUs of node k as ``node<k>:<index>``, the mean over every GPU; the
    rest (utilisation, how the peak was measured) stays node 0's."""
    folded = dict(primary)
    for rank in sorted(others):
        memory = others[rank]
        for key, value in memory.items():
            if key == _PER_DEVICE and isinstance(value, dict):
                devices = dict(folded.get(_PER_DEVICE) or {})
                devices.update({f"node{rank}:{d}": v for d, v in value.items()})
                folded[_PER_DEVICE] = devices
            elif key == "mem_sidecar_samples" and isinstance(value, int):
                folded[key] = int(folded.get(key) or 0) + value
            elif "peak" in key and isinstance(value, (int, float)) and not isinstance(value, bool):
                mine = folded.get(key)
                if not isinstance(mine, (int, float)) or value > mine:
                    folded[key] = value
    every_gpu = folded.get(_PER_DEVICE)
    if isinstance(every_gpu, dict) and every_gpu and others:
        mean = sum(every_gpu.values()) / len(every_gpu)
        folded["mem_nvidia_peak_bytes_mean"] = mean
        folded["mem_nvidia_mem_reserved"] = mean / 2**20
    return folded


def merge(primary: Outcome, others: dict[int, Outcome]) -> Outcome:
    """The run's outcome from node 0's and the other nodes' verdicts (pure).

    The memory figures are folded over every node (``fold_memory``). Node 0's
    own verdict stands where it is the root cause itself (its rank died
    first), where the run is ok, timed out on its own or was interrupted.
    Otherwise the lowest-ranked node whose own rank died first explains the
    run: its status, its error (naming the node) and its log; node 0's other
    figures stay.
    """
    if others and any(o.memory for o in others.values()):
        primary = primary.model_copy(
            update={"memory": fold_memory(primary.memory, {k: o.memory for k, o in others.items()})}
        )
    if primary.status not in _EXPLAINABLE or died_first(primary):
        return primary
    for rank in sorted(others):
        node = others[rank]
        if not died_first(node):
            continue
        # node 0 timing out while waiting for a dead peer is the peer's failure too
        merged = primary.model_copy()
        merged.status = node.status
        where = f"node {rank}" + (f" ({node.log})" if node.log else "")
        merged.error = f"{where}: {node.error or node.status}"
        merged.log = node.log or primary.log
        return merged
    return primary
