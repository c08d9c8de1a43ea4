"""Run a piece of the studio as a user who may not write where the test says, for real.

The suite runs as root in CI, and root writes into a chmod 0o555 folder anyway, so a read-only folder is
made one the way it is for a user: the folder belongs to root and the write runs in a forked child that
has dropped to the unprivileged uid/gid 65534 (nobody). The child is forked, not exec'd: the interpreter
lives under /root, which nobody may not enter, so everything the call needs is imported before the fork.
As a normal user the folder is chmod 0o555 and the call runs in this process."""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

NOBODY = 65534


@contextmanager
def read_only_place():
    """A folder (under /tmp, which nobody may enter) whose contents the writer may read but not change."""
    root = Path(tempfile.mkdtemp(prefix="sd-studio-ro-", dir="/tmp"))
    root.chmod(0o755)
    try:
        yield root
    finally:
        for p in [root, *root.rglob("*")]:
            if p.is_dir() and not p.is_symlink():
                p.chmod(0o755)
        shutil.rmtree(root, ignore_errors=True)


def as_writer_without_rights(folder: Path, call: Callable[[], object]) -> tuple[str, str]:
    """Make `folder` read-only for the writer and run `call` as that writer: ("ok", "") when it returned,
    else (exception class name, message)."""
    for p in [folder, *folder.rglob("*")]:
        p.chmod(0o555 if p.is_dir() else 0o444)
    if os.geteuid() != 0:
        return _outcome(call)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: drop root for good, run, report through the pipe, never return into pytest
        try:
            os.close(read_end)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            os.write(write_end, json.dumps(_outcome(call)).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        data = pipe.read()
    os.waitpid(pid, 0)
    assert data, "the unprivileged child died without an answer"
    kind, message = json.loads(data)
    return kind, message


def _outcome(call: Callable[[], object]) -> tuple[str, str]:
    try:
        call()
    except Exception as e:  # the test asserts on the kind and the message
        return type(e).__name__, str(e)
    return "ok", ""
