"""Is the results folder shared with the cluster's nodes? A token written here, looked for there.

Jobs on a cluster write their results into the results folder, so it must be
on a filesystem every node sees under the same path (NFS, Lustre, GPFS, a
Kubernetes volume). In its ``check`` (before the results folder is opened,
so a refusal moves nothing aside), an executor writes a token here
(``token``), runs ``seen`` inside a job on the cluster, and refuses in one
line (``not_shared``) where the job did not see it. ``seen`` runs on the
node: it imports nothing beyond the standard library.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from orchestrator.contract.errors import UserError
from orchestrator.contract.layout import nearest_existing

#: the token's name starts with this (one file per check, removed after it)
PREFIX = ".tunematrix-shared-check-"


@dataclass(frozen=True)
class Token:
    """A file in the results folder and its content, as written here."""

    path: str
    content: str


@contextmanager
def token(root: Path) -> Iterator[Token]:
    """Write a token into the results folder ``root`` (where it does not exist yet: into
    its nearest existing parent, so a refused run leaves nothing behind); removed on
    leaving."""
    content = uuid.uuid4().hex
    path = nearest_existing(root.resolve()) / f"{PREFIX}{content[:12]}"
    path.write_text(content)
    try:
        yield Token(str(path), content)
    finally:
        path.unlink(missing_ok=True)


def seen(path: str, content: str) -> bool:
    """On the node: does the token exist at the same path, with the same content?"""
    try:
        with open(path) as f:
            return f.read() == content
    except OSError:
        return False


def where_am_i() -> str:
    """A name for the node a check ran on (its host name)."""
    return os.uname().nodename


def skipped(root: Path, where: str, why: str) -> str:
    """The one line when a check could not run (a busy cluster): the run goes on."""
    return f"could not check that {root} is shared with {where} ({why}); skipped"


def say_stderr(line: str) -> None:
    """Say a line of a check where no progress display runs yet (before the run starts)."""
    print(line, file=sys.stderr, flush=True)


def not_shared(executor: str, root: Path, node: str) -> UserError:
    """The one line when a job did not see the results folder."""
    return UserError(
        f"--executor {executor}: the results folder {root.resolve()} is not visible from a job "
        f"on {node}; put it on a filesystem every node shares (NFS, Lustre, a Kubernetes "
        "volume) under the same path, e.g. --results /shared/tunematrix/results"
    )
