"""Build a folder once and publish it whole, however many processes ask at the same moment.

The ranks of one job, packed jobs and several users sharing a cache may all
need the same folder (the tiny model, a prepared dataset) before it exists.
Each builder writes everything into a private folder beside the target,
finishes it (the caller's ``complete`` test must then pass on it), and
publishes it with one rename: the folder is there whole or not at all, and a
reader takes it only when ``complete`` says so. An exclusive ``flock`` keeps
the others from building too; where the file system does not honour it, the
losers of the race find the winner's folder at the rename and use it. Private
folders left by a killed builder are removed by the next one.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import secrets
import shutil
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

#: A private folder this old is stale even when its owner cannot be checked.
STALE_AFTER_S = 3600.0


def build_once(
    target: Path,
    build: Callable[[Path], None],
    complete: Callable[[Path], bool],
    *,
    what: str,
) -> bool:
    """Make sure ``target`` holds a complete build; True when this process built it.

    ``build`` fills an empty private folder; ``complete`` says whether a folder
    holds a finished build (a marker written last, or a file written last). A
    build after which ``complete`` fails is discarded with an error naming
    ``what``. An unfinished folder already at ``target`` is replaced.
    """
    if complete(target):
        return False
    target.parent.mkdir(parents=True, exist_ok=True)
    with _exclusive(target.parent / f".{target.name}.lock") as locked:
        if complete(target):  # another process built it meanwhile
            return False
        if locked:
            _remove_stale(target)
        tmp = private_dir(target)
        try:
            build(tmp)
            if not complete(tmp):
                raise RuntimeError(f"the build of {what} did not finish: {tmp} is incomplete")
            _publish(tmp, target, complete)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)  # gone when published
    return True


@contextlib.contextmanager
def _exclusive(path: Path) -> Iterator[bool]:
    """Hold an exclusive ``flock`` on ``path``; yields False where it cannot be had.

    Read-only and group/world-readable (per umask), so the users of a shared
    cache can all lock the one file. Without the lock the build is still safe
    (``_publish`` settles the race), only done more than once.
    """
    fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o666)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            locked = True
        except OSError:  # e.g. ENOLCK/EOPNOTSUPP on some network file systems
            locked = False
        yield locked
    finally:
        os.close(fd)  # releases the lock


def host() -> str:
    """This host's name, safe in a file name."""
    return re.sub(r"[^A-Za-z0-9]", "_", socket.gethostname()) or "host"


def private_dir(target: Path) -> Path:
    """A new empty folder beside ``target``, named for this host and process.

    Made with ``mkdir`` (mode 0o777 less the umask) so that the published
    folder is as readable as the rest of the cache, not 0o700.
    """
    while True:
        path = target.parent / f".{target.name}.{host()}-{os.getpid()}-{secrets.token_hex(4)}"
        try:
            path.mkdir(0o777)
        except FileExistsError:
            continue
        return path


def _publish(tmp: Path, target: Path, complete: Callable[[Path], bool]) -> None:
    """Rename ``tmp`` (a finished build) to ``target``, the one publish point.

    When ``target`` is already there: a finished build (another builder won)
    is kept and ``tmp`` is left to the caller to discard; an unfinished one
    (left by other means: a partial copy, an older layout) is moved aside and
    replaced.
    """
    for _ in range(3):
        try:
            os.rename(tmp, target)
            return
        except OSError as exc:
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
        if complete(target):
            return
        aside = private_dir(target)
        try:
            os.rename(target, aside)
        except FileNotFoundError:
            pass  # someone else moved it meanwhile
        finally:
            shutil.rmtree(aside, ignore_errors=True)
    if not complete(target):
        raise OSError(errno.ENOTEMPTY, f"{target} is unfinished and could not be replaced")


_PRIVATE = re.compile(r"(?P<host>[A-Za-z0-9_]+)-(?P<pid>\d+)-[0-9a-f]{8}")


def _remove_stale(target: Path) -> None:
    """Remove the private folders of ``target`` that no builder is using.

    Called with the lock held: the folder of a builder on this host that is no
    longer running, and any folder older than ``STALE_AFTER_S`` (a builder on
    another host, where the lock may not reach, or an older naming).
    """
    here, now = host(), time.time()
    for path in target.parent.glob(f".{target.name}.*"):
        if not path.is_dir():
            continue  # the lock file
        m = _PRIVATE.fullmatch(path.name[len(target.name) + 2 :])
        try:
            age = now - path.stat().st_mtime
        except FileNotFoundError:
            continue
        gone = m is not None and m["host"] == here and not _running(int(m["pid"]))
        if gone or age > STALE_AFTER_S:
            shutil.rmtree(path, ignore_errors=True)


def _running(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True
