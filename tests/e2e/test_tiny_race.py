"""Many processes building the tiny model into one fresh cache at the same moment.

The ranks of one job, packed jobs and the users of a shared cache all call
``ensure_tiny()`` on first use. Every one must get the same finished,
loadable folder, whether or not the file system honours the build lock, and
no private build folder may stay behind.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.long]

REPO = Path(__file__).resolve().parents[2]

# One builder: import everything first, say ready, wait for the start file,
# then ask for the model and load what it got.
CHILD = """\
import fcntl, json, os, sys, time
from pathlib import Path
from transformers import AutoConfig, AutoTokenizer
from trainer_entry.models import tiny

if os.environ["RACE_LOCK"] == "ignored":  # a file system where flock does not exclude
    fcntl.flock = lambda fd, op: None
built = []
real_build = tiny.build
def build(folder):
    built.append(str(folder))
    real_build(folder)
    time.sleep(float(os.environ.get("RACE_SLOW_S", "0")))
tiny.build = build

Path(sys.argv[1]).touch()
go = Path(sys.argv[2])
deadline = time.monotonic() + 120
while not go.exists():
    assert time.monotonic() < deadline, "no start signal"
    time.sleep(0.002)
path = tiny.ensure_tiny()
config = AutoConfig.from_pretrained(path)
tokenizer = AutoTokenizer.from_pretrained(path)
print(json.dumps({"path": str(path), "built": len(built), "model_type": config.model_type,
                  "vocab": len(tokenizer)}))
"""


# Two ranks of one job (gloo, as on the CPU): the process group is up before the
# model is asked for, and rank 1 gets to build first.
CHILD_RANK = """\
import json, sys
from pathlib import Path
import torch.distributed as dist
from transformers import AutoModelForCausalLM, AutoTokenizer
from trainer_entry.models import tiny

rank = int(sys.argv[1])
dist.init_process_group("gloo", init_method="file://" + sys.argv[2], rank=rank, world_size=2)
if rank == 1:
    path = tiny.ensure_tiny()
dist.barrier()
if rank == 0:
    path = tiny.ensure_tiny()
model = AutoModelForCausalLM.from_pretrained(path)
tokenizer = AutoTokenizer.from_pretrained(path)
dist.barrier()
dist.destroy_process_group()
print(json.dumps({"path": str(path), "files": sorted(p.name for p in Path(path).iterdir()),
                  "vocab": len(tokenizer), "params": sum(p.numel() for p in model.parameters())}))
"""


def child_env(cache: Path, **extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "TUNEMATRIX_CACHE": str(cache),
        "PYTHONPATH": str(REPO),
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        **extra,
    }


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def race(cache: Path, signals: Path, n: int, lock: str) -> list[dict[str, Any]]:
    """Start ``n`` builders, release them together, return what each one got."""
    signals.mkdir()
    go = signals / "go"
    # each build lingers half a second before publishing: all are under way before the first lands
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, str(signals / f"ready-{i}"), str(go)],
            env=child_env(cache, RACE_LOCK=lock, RACE_SLOW_S="0.5"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(n)
    ]

    def release() -> None:
        wait_for(lambda: len(list(signals.glob("ready-*"))) == n, "the builders to import")
        go.touch()

    return finish(procs, release)


def finish(
    procs: list[subprocess.Popen[str]], start: Callable[[], None] | None = None
) -> list[Any]:
    """Run ``start``, wait for every process, kill what is left on the way out; each
    must succeed, and each prints its report as JSON on its last line."""
    try:
        if start is not None:
            start()
        outs = [p.communicate(timeout=240) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    failed = [err[-3000:] for p, (_, err) in zip(procs, outs, strict=True) if p.returncode != 0]
    assert not failed, "\n---\n".join(failed)
    return [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]


@pytest.mark.parametrize("lock", ["honoured", "ignored"])
def test_concurrent_builders_all_get_the_one_finished_folder(tmp_path, lock) -> None:
    cache = tmp_path / "cache"
    got = race(cache, tmp_path / "signals", 4, lock)
    from trainer_entry.models import tiny

    paths = {g["path"] for g in got}
    assert len(paths) == 1
    (path,) = paths
    assert Path(path).parent == cache
    assert all((g["model_type"], g["vocab"]) == ("llama", 1024) for g in got)
    assert tiny.is_complete(Path(path))
    builds = sum(g["built"] for g in got)
    if lock == "honoured":
        assert builds == 1  # the others waited on the lock and took the finished folder
    else:
        assert builds >= 2  # they did race to the rename; the losers took the winner's
    # only the lock file and the published folder: no private build folder is left
    assert sorted(p.name for p in cache.iterdir()) == sorted(
        [Path(path).name, f".{Path(path).name}.lock"]
    )


def test_a_killed_builders_folder_is_cleaned_up_by_the_next(tmp_path) -> None:
    cache = tmp_path / "cache"
    signals = tmp_path / "signals"
    signals.mkdir()
    (signals / "go").touch()
    killed = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(signals / "ready"), str(signals / "go")],
        env=child_env(cache, RACE_LOCK="honoured", RACE_SLOW_S="600"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        # killed while its build is under way (files written), before publishing it
        wait_for(
            lambda: any(p.is_dir() and (p / "config.json").exists() for p in cache.glob(".*")),
            "the first builder to write its folder",
        )
    finally:
        killed.send_signal(signal.SIGKILL)
        killed.wait()
    (left,) = [p for p in cache.glob(".*") if p.is_dir()]
    (got,) = race(cache, tmp_path / "again", 1, "honoured")
    assert got["built"] == 1 and got["model_type"] == "llama"
    assert not left.exists()
    assert sorted(p.name for p in cache.iterdir()) == sorted(
        [Path(got["path"]).name, f".{Path(got['path']).name}.lock"]
    )


def test_a_build_by_a_rank_other_than_0_is_whole(tmp_path) -> None:
    # with a process group up, transformers' save_pretrained writes the config and
    # weights on rank 0 only: a build by rank 1 must not come out as the tokenizer alone
    cache = tmp_path / "cache"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD_RANK, str(rank), str(tmp_path / "pg")],
            env=child_env(cache),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    got = finish(procs)
    assert got[0] == got[1]
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(got[0]["files"])
    assert got[0]["vocab"] == 1024 and 0 < got[0]["params"] < 300_000
