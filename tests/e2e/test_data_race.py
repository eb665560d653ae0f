"""Many processes preparing one dataset into one results folder's cache at the same moment.

The ranks of one job and the jobs packed into one results folder all call
``prepare()`` for the same key. Every one must get the same finished entry,
whether or not the file system honours the lock, and no private build folder
may stay behind.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from test_tiny_race import child_env, finish, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.long]

# One preparer: import everything first, say ready, wait for the start file, then prepare.
CHILD = """\
import fcntl, json, os, sys, time
from pathlib import Path
from transformers import AutoTokenizer
from trainer_entry.run.parse import DataConfig
from trainer_entry.data import prepare as prepare_module
from trainer_entry.models.tiny import ensure_tiny

if os.environ["RACE_LOCK"] == "ignored":  # a file system where flock does not exclude
    fcntl.flock = lambda fd, op: None
built = []
real = prepare_module.tokenize_records
def tokenize(*args):
    built.append(1)
    data = real(*args)
    time.sleep(0.5)  # all are under way before the first publishes
    return data
prepare_module.tokenize_records = tokenize

tokenizer = AutoTokenizer.from_pretrained(ensure_tiny())
Path(sys.argv[1]).touch()
go = Path(sys.argv[2])
deadline = time.monotonic() + 120
while not go.exists():
    assert time.monotonic() < deadline, "no start signal"
    time.sleep(0.002)
data = prepare_module.prepare(DataConfig(max_seq_len=64), tokenizer, Path(sys.argv[3]))
print(json.dumps({"path": data.meta["cache_path"], "built": len(built),
                  "sequences": len(data.input_ids), "hit": data.meta["cache_hit"]}))
"""


@pytest.mark.parametrize("lock", ["honoured", "ignored"])
def test_concurrent_preparers_all_get_the_one_finished_entry(tmp_path: Path, lock: str) -> None:
    cache = tmp_path / "cache"
    # the tiny model first, so that the race is over the dataset alone
    subprocess.run(
        [sys.executable, "-c", "from trainer_entry.models.tiny import ensure_tiny; ensure_tiny()"],
        env=child_env(cache),
        check=True,
        timeout=240,
    )
    data_dir, signals, n = tmp_path / "data", tmp_path / "signals", 3
    signals.mkdir()
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                CHILD,
                str(signals / f"ready-{i}"),
                str(signals / "go"),
                str(data_dir),
            ],
            env=child_env(cache, RACE_LOCK=lock),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(n)
    ]

    def release() -> None:
        wait_for(lambda: len(list(signals.glob("ready-*"))) == n, "the preparers to import")
        (signals / "go").touch()

    got = finish(procs, release)
    paths = {g["path"] for g in got}
    assert len(paths) == 1
    (path,) = paths
    assert len({g["sequences"] for g in got}) == 1 and got[0]["sequences"] > 100
    builds = sum(g["built"] for g in got)
    if lock == "honoured":
        assert builds == 1  # the others waited on the lock and read the finished entry
        assert sorted(g["hit"] for g in got) == [False, True, True]
    else:
        assert builds >= 2  # they did race to the rename; the losers took the winner's
    entry = Path(path)
    assert {"tokens.npz", "meta.json"} <= {p.name for p in entry.iterdir()}
    # only the lock file and the published entry: no private build folder is left
    assert sorted(p.name for p in data_dir.iterdir()) == sorted([entry.name, f".{entry.name}.lock"])
