"""One trainer per run folder: the lock a start takes before it writes anything into the folder.

The lock is an exclusive `flock` on `<run>/.sd-studio-lock` (contract.LOCK_FILE). The kernel drops
it when the last process holding the open file ends, however it ends, so a crash never leaves a
run locked. The file's text says who holds it (JSON: by, pid, host, since, token, argv), so a
refused start can name the holder, and a lock whose holder ended without releasing it (a crash,
SIGKILL, a lost machine) is recognised as stale when the next start takes it over.

Who takes it: the process that first writes into the folder (the studio's Start, `launch`, or
`train` run by hand). A launcher hands its lock to the trainer it starts: the child inherits the
open file (`pass_fds`) and the environment names the token (LOCK_ENV), so the trainer's rank 0
finds the lock held by its own launcher and goes on; the lock then lives as long as the
longest-lived of them. Pure (stdlib only): the trainer, the CLI, the studio and the queue import it.
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import secrets
import socket
import sys
import time
from pathlib import Path

from . import contract
from .run_folder import RunFolderError, claim, run_folder_problem

LOCK_FILE = contract.LOCK_FILE
LOCK_ENV = "SD_STUDIO_RUN_LOCK"   # the token of a lock held for this process by its launcher
RETRIES, RETRY_S = 20, 0.05      # a reader's probe holds the lock for microseconds: wait it out
_OPEN = getattr(os, "O_NOFOLLOW", 0) | os.O_CLOEXEC


class RunLocked(RunFolderError):
    """Another trainer holds the run folder (exit 2, one line naming the run and the holder)."""

    def __init__(self, message: str, holder: dict):
        super().__init__(message)
        self.holder = holder


def _read(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8") or "{}")
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def describe(holder: dict) -> str:
    """'the studio (pid 412 on host-a, since 04:41:07 UTC)'."""
    by = {"studio": "the studio", "launch": "a `launch` command", "train": "a `train` command",
          "queue": "the job queue"}.get(str(holder.get("by")), str(holder.get("by") or "another process"))
    since = holder.get("since")
    when = time.strftime(", since %H:%M:%S UTC", time.gmtime(since)) if isinstance(since, (int, float)) else ""
    return f"{by} (pid {holder.get('pid', '?')} on {holder.get('host', '?')}{when})"


def _try_flock(fd: int, path: Path, token: str | None) -> bool:
    """Lock, waiting out a reader's probe; False when someone else holds it (at once when the
    holder is the launcher whose token this process was given)."""
    for attempt in range(RETRIES):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError as e:
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            if token and _read(path).get("token") == token:
                return False
            if attempt + 1 < RETRIES:
                time.sleep(RETRY_S)
    return False


class RunLock:
    """A held lock (or, `inherited`, the launcher's lock this process runs under). Release it with
    release() or by leaving its `with` block; process exit releases it too."""

    def __init__(self, run_dir: Path, fd: int | None, record: dict, stale: dict | None, inherited: bool = False):
        self.run_dir, self.fd, self.record, self.stale, self.inherited = run_dir, fd, record, stale, inherited

    @property
    def path(self) -> Path:
        return self.run_dir / LOCK_FILE

    def child_env(self) -> dict[str, str]:
        """What a launcher adds to its child's environment (with pass_fds=lock.pass_fds())."""
        return {LOCK_ENV: self.record["token"]} if self.record.get("token") else {}

    def pass_fds(self) -> tuple[int, ...]:
        """The open lock file for subprocess's pass_fds: the child keeps the lock alive."""
        return (self.fd,) if self.fd is not None else ()

    def handed_to(self, pid: int) -> None:
        """The child started with the inherited file holds the lock now: name it, drop ours."""
        self.record = {**self.record, "pid": pid}
        self._write(self.record)
        os.close(self.fd)
        self.fd = None

    def release(self) -> None:
        """Mark the lock released (so the next start does not call it stale) and drop it. A trainer
        running under its launcher's lock marks it too: the run is over."""
        if self.fd is None and not self.inherited:
            return
        if _read(self.path).get("token") == self.record.get("token"):
            self._write({**self.record, "released": round(time.time(), 3)})
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        self.inherited = False

    def _write(self, record: dict) -> None:
        # rewritten in place (never replaced): the flock belongs to this inode
        fd = os.open(self.path, os.O_WRONLY | _OPEN)
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(record).encode(), 0)
        finally:
            os.close(fd)

    def __enter__(self) -> "RunLock":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def acquire(run_dir: Path | str, by: str, argv: list[str] | None = None) -> RunLock:
    """Take the run folder's lock: check the folder may hold a run (run_folder_problem), create it,
    lock, then write the run marker. Raises RunLocked (naming the run and the holder) when another
    live process holds it, RunFolderError for a folder that is not a run's. A process started under
    its launcher's lock (LOCK_ENV matching the file's token) gets an `inherited` RunLock."""
    run_dir = Path(run_dir)
    problem = run_folder_problem(run_dir)
    if problem:
        raise RunFolderError(problem)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(run_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT | _OPEN, 0o644)
    except OSError as e:
        raise RunFolderError(f"output.dir: cannot create the run folder {run_dir} ({e.strerror or e})") from None
    token = os.environ.get(LOCK_ENV)
    try:
        got = _try_flock(fd, run_dir / LOCK_FILE, token)
    except OSError as e:
        os.close(fd)
        raise RunFolderError(f"output.name: cannot lock the run folder {run_dir} ({e.strerror or e})") from None
    before = _read(run_dir / LOCK_FILE)
    if not got:
        os.close(fd)
        if token and before.get("token") == token:   # our launcher holds it for us
            claim(run_dir)
            return RunLock(run_dir, None, before, None, inherited=True)
        raise RunLocked(f"output.name: the run '{run_dir.name}' ({run_dir}) is already being trained by "
                        f"{describe(before)}; stop it first, or choose another output.name", before)
    stale = before if before.get("pid") and not before.get("released") else None
    record = {"by": by, "pid": os.getpid(), "host": socket.gethostname(), "since": round(time.time(), 3),
              "token": secrets.token_hex(8), "argv": list(argv or [])[:12]}
    lock = RunLock(run_dir, fd, record, stale)
    try:
        lock._write(record)
        claim(run_dir)
    except BaseException:
        os.close(fd)
        raise
    return lock


def unlocked(run_dir: Path | str) -> RunLock:
    """No lock (a machine other than machine 0 of a multi-node run, where the run's rank 0 holds
    it): the folder is only claimed, and nothing is handed on."""
    return RunLock(claim(run_dir), None, {}, None)


def note_stale(lock: RunLock) -> None:
    """One line on stderr when the lock was left by a holder that ended without releasing it."""
    if lock.stale:
        print(f"note: the run '{lock.run_dir.name}' was left locked by {describe(lock.stale)}, which ended "
              "without releasing it (a crash or a kill); this start took it over", file=sys.stderr)


def holder(run_dir: Path | str) -> dict | None:
    """Who holds the run folder's lock now (the file's record), or None when nobody does. For the
    studio and the queue: a run whose lock is held is being trained, whatever process.json says."""
    path = Path(run_dir) / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDONLY | _OPEN)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return _read(path) or {"by": "unknown"}
    finally:
        os.close(fd)   # closing drops the probe's shared lock at once
    return None


def stale_record(run_dir: Path | str) -> dict | None:
    """The record of a holder that ended without releasing the lock (crash, SIGKILL), when nobody
    holds it now; None otherwise."""
    if holder(run_dir) is not None:
        return None
    record = _read(Path(run_dir) / LOCK_FILE)
    return record if record.get("pid") and not record.get("released") else None
