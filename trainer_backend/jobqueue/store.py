"""The queue file: one SQLite database (the standard library's sqlite3, WAL) under the studio's
state folder, holding the jobs in their order, the queue's pause flag and the API tokens' hashes.

Order is one integer `position` per waiting job; a new job goes after every waiting job of the
same or a higher priority (`front=True`: before all of them). Every change that reads then
writes runs in one `BEGIN IMMEDIATE` transaction, so concurrent submits from many threads or
processes neither lose nor duplicate a job.

The file carries a schema version (`PRAGMA user_version`) and an application id: an older file
is migrated in place, a newer one or a file that is not a queue is refused with one line and
left exactly as it was."""
from __future__ import annotations

import json
import sqlite3
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from trainer_backend.errors import ConfigError

QUEUE_FILE = "queue.sqlite3"
APPLICATION_ID = 0x53445451   # "SDTQ": this file is the studio's queue
WAITING, STARTING, RUNNING, STOPPING = "waiting", "starting", "running", "stopping"
DONE, ERROR, STOPPED, INTERRUPTED = "done", "error", "stopped", "interrupted"
LIVE = (STARTING, RUNNING, STOPPING)
FINISHED = (DONE, ERROR, STOPPED, INTERRUPTED)
STATUSES = (WAITING, *LIVE, *FINISHED)
KINDS = ("train", "command")   # a training config, or a prepared argv (caption jobs, LoRA tools, tests)

# MIGRATIONS[i] takes a file at version i to version i + 1; the file's version is their count.
MIGRATIONS: tuple[str, ...] = (
    """CREATE TABLE jobs (
         id INTEGER PRIMARY KEY AUTOINCREMENT,
         kind TEXT NOT NULL, name TEXT NOT NULL, run_dir TEXT NOT NULL,
         config_toml TEXT NOT NULL DEFAULT '', argv TEXT NOT NULL DEFAULT '[]',
         priority INTEGER NOT NULL DEFAULT 0, position INTEGER,
         status TEXT NOT NULL, gpus_wanted INTEGER NOT NULL DEFAULT 1, gpus TEXT NOT NULL DEFAULT '[]',
         pid INTEGER, pid_started REAL, exit_code INTEGER, message TEXT NOT NULL DEFAULT '',
         created REAL NOT NULL, started REAL, ended REAL);
       CREATE INDEX jobs_status ON jobs(status, position);
       CREATE TABLE settings (key TEXT PRIMARY KEY, value TEXT NOT NULL);""",
    # version 2: API tokens (only their SHA-256 is kept) and who submitted a job
    """CREATE TABLE tokens (name TEXT PRIMARY KEY, scope TEXT NOT NULL, sha256 TEXT NOT NULL UNIQUE,
                            created REAL NOT NULL);
       ALTER TABLE jobs ADD COLUMN submitted_by TEXT NOT NULL DEFAULT '';""",
    # version 3: a submit's "does a job already write to this folder?" without reading every row
    """CREATE INDEX jobs_run_dir ON jobs(run_dir, status);""",
)
SCHEMA_VERSION = len(MIGRATIONS)
LIST_COLUMNS = ("id, kind, name, run_dir, argv, priority, position, status, gpus_wanted, gpus, pid, pid_started, "
                "exit_code, message, created, started, ended, submitted_by")


class QueueFileError(ConfigError):
    """The queue file cannot be used (corrupt, not a queue, from a newer version); it is kept as it is."""


@dataclass
class Job:
    id: int
    kind: str
    name: str
    run_dir: str
    config_toml: str = ""
    argv: list[str] = field(default_factory=list)
    priority: int = 0
    position: int | None = None
    status: str = WAITING
    gpus_wanted: int = 1
    gpus: list[str] = field(default_factory=list)
    pid: int | None = None
    pid_started: float | None = None
    exit_code: int | None = None
    message: str = ""
    created: float = 0.0
    started: float | None = None
    ended: float | None = None
    submitted_by: str = ""

    @classmethod
    def from_row(cls, row: sqlite3.Row) -> "Job":
        data = dict(row)
        data["argv"] = json.loads(data["argv"] or "[]")
        data["gpus"] = json.loads(data["gpus"] or "[]")
        return cls(**data)

    def to_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k not in ("config_toml", "argv", "pid_started")}


def _refuse(path: Path, why: str) -> QueueFileError:
    return QueueFileError(f"queue file {path}: {why}; it is kept as it is (move it away to start an empty queue)")


class QueueStore:
    """The jobs, the pause flag and the tokens in one SQLite file; safe to share between threads."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.lock = threading.RLock()
        try:
            self.db = sqlite3.connect(self.path, timeout=30, isolation_level=None, check_same_thread=False)
            self.db.row_factory = sqlite3.Row
            self._check_and_migrate()
        except sqlite3.DatabaseError as e:
            raise _refuse(self.path, f"not a readable SQLite database ({e})") from None

    # ------------------------------------------------------------------ the file
    def _check_and_migrate(self) -> None:
        db = self.db
        app_id = db.execute("PRAGMA application_id").fetchone()[0]
        version = db.execute("PRAGMA user_version").fetchone()[0]
        tables = db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
        if app_id not in (0, APPLICATION_ID) or (app_id == 0 and tables):
            raise _refuse(self.path, "not a queue file of this studio")
        if version > SCHEMA_VERSION:
            raise _refuse(self.path, f"written by a newer version (schema {version}, this one knows "
                                     f"{SCHEMA_VERSION})")
        check = db.execute("PRAGMA quick_check").fetchone()[0]
        if check != "ok":
            raise _refuse(self.path, f"damaged ({check})")
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        for target in range(version + 1, SCHEMA_VERSION + 1):
            with self.transaction():
                for statement in _statements(MIGRATIONS[target - 1]):
                    db.execute(statement)
                db.execute(f"PRAGMA user_version = {target}")
                db.execute(f"PRAGMA application_id = {APPLICATION_ID}")

    def transaction(self):
        return _Transaction(self)

    def close(self) -> None:
        with self.lock:
            self.db.close()

    # ------------------------------------------------------------------ jobs
    def add(self, kind: str, name: str, run_dir: str, *, config_toml: str = "", argv: list[str] = (),
            priority: int = 0, gpus_wanted: int = 1, front: bool = False, submitted_by: str = "") -> Job:
        """Append a waiting job after every waiting job of the same or a higher priority (`front`:
        before every waiting job). Refuses a second live job writing to the same run folder."""
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}")
        with self.transaction() as db:
            clash = db.execute("SELECT id, status FROM jobs WHERE run_dir = ? AND status IN (?,?,?,?)",
                               (run_dir, WAITING, *LIVE)).fetchone()
            if clash:
                raise ConfigError(f"output.name: job {clash['id']} ({clash['status']}) already writes to {run_dir}; "
                                  f"choose another output.name")
            if front:
                position = (db.execute("SELECT min(position) FROM jobs WHERE status = ?", (WAITING,))
                            .fetchone()[0] or 1) - 1
                priority = max(priority, db.execute("SELECT max(priority) FROM jobs WHERE status = ?",
                                                    (WAITING,)).fetchone()[0] or priority)
            else:
                position = self._slot_for(db, priority)
            cur = db.execute(
                "INSERT INTO jobs (kind, name, run_dir, config_toml, argv, priority, position, status, gpus_wanted,"
                " created, submitted_by) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                (kind, name, run_dir, config_toml, json.dumps(list(argv)), priority, position, WAITING,
                 gpus_wanted, time.time(), submitted_by))
            return self._get(db, cur.lastrowid)

    @staticmethod
    def _slot_for(db, priority: int) -> int:
        """The position after the last waiting job of priority >= `priority`; the rest move down one."""
        after = db.execute("SELECT min(position) FROM jobs WHERE status = ? AND priority < ?",
                           (WAITING, priority)).fetchone()[0]
        if after is None:
            return (db.execute("SELECT max(position) FROM jobs WHERE status = ?", (WAITING,)).fetchone()[0]
                    or 0) + 1
        db.execute("UPDATE jobs SET position = position + 1 WHERE status = ? AND position >= ?", (WAITING, after))
        return after

    def _get(self, db, job_id: int) -> Job:
        row = db.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        if row is None:
            raise KeyError(job_id)
        return Job.from_row(row)

    def get(self, job_id: int) -> Job:
        with self.lock:
            return self._get(self.db, job_id)

    def jobs(self, statuses: tuple[str, ...] = STATUSES, limit: int | None = None, with_config: bool = True
             ) -> list[Job]:
        """Jobs in these states: waiting ones in queue order, then the others newest first
        (`with_config=False`: without their config text, for listings)."""
        marks = ",".join("?" * len(statuses))
        columns = "*" if with_config else LIST_COLUMNS
        sql = (f"SELECT {columns} FROM jobs WHERE status IN ({marks}) ORDER BY status != 'waiting', "
               f"CASE WHEN status = 'waiting' THEN position END, id DESC")
        if limit:
            sql += f" LIMIT {int(limit)}"
        with self.lock:
            return [Job.from_row(r) for r in self.db.execute(sql, statuses)]

    def latest_for(self, run_dir: str) -> Job | None:
        """The newest job writing to this run folder."""
        with self.lock:
            row = self.db.execute("SELECT * FROM jobs WHERE run_dir = ? ORDER BY id DESC LIMIT 1", (run_dir,)).fetchone()
        return Job.from_row(row) if row else None

    def waiting(self) -> list[Job]:
        return self.jobs((WAITING,))

    def live(self) -> list[Job]:
        return self.jobs(LIVE)

    def update(self, job_id: int, **values) -> Job:
        for key in ("gpus", "argv"):
            if key in values:
                values[key] = json.dumps(list(values[key]))
        cols = ", ".join(f"{k} = ?" for k in values)
        with self.transaction() as db:
            db.execute(f"UPDATE jobs SET {cols} WHERE id = ?", (*values.values(), job_id))
            return self._get(db, job_id)

    def claim(self, job_id: int, gpus: list[str]) -> Job | None:
        """waiting -> starting with these slots, unless someone else changed it meanwhile."""
        with self.transaction() as db:
            cur = db.execute("UPDATE jobs SET status = ?, gpus = ?, position = NULL, started = ? "
                             "WHERE id = ? AND status = ?", (STARTING, json.dumps(gpus), time.time(), job_id, WAITING))
            return self._get(db, job_id) if cur.rowcount else None

    def move(self, job_id: int, where: str) -> Job:
        """Reorder a waiting job: 'up', 'down', 'top' or 'bottom'."""
        with self.transaction() as db:
            job = self._get(db, job_id)
            if job.status != WAITING:
                raise ConfigError(f"job {job_id} is {job.status}: only waiting jobs can be reordered")
            ids = [r[0] for r in db.execute("SELECT id FROM jobs WHERE status = ? ORDER BY position", (WAITING,))]
            i = ids.index(job_id)
            j = {"up": max(i - 1, 0), "down": min(i + 1, len(ids) - 1), "top": 0, "bottom": len(ids) - 1}[where]
            ids.insert(j, ids.pop(i))
            neighbour = ids[j + 1] if j + 1 < len(ids) else (ids[j - 1] if j else None)
            if neighbour is not None and where in ("up", "top"):
                # moving above a job takes its priority at least, so a later submit keeps the order sensible
                prio = db.execute("SELECT priority FROM jobs WHERE id = ?", (neighbour,)).fetchone()[0]
                db.execute("UPDATE jobs SET priority = max(priority, ?) WHERE id = ?", (prio, job_id))
            db.executemany("UPDATE jobs SET position = ? WHERE id = ?", [(n + 1, jid) for n, jid in enumerate(ids)])
            return self._get(db, job_id)

    def cancel(self, job_id: int) -> Job:
        """Remove a waiting job from the queue."""
        with self.transaction() as db:
            job = self._get(db, job_id)
            if job.status != WAITING:
                raise ConfigError(f"job {job_id} is {job.status}: only a waiting job can be deleted (stop a running one)")
            db.execute("DELETE FROM jobs WHERE id = ?", (job_id,))
            return job

    def retry(self, job_id: int) -> Job:
        """Put a finished job (error, stopped, interrupted) back at the end of its priority."""
        with self.transaction() as db:
            job = self._get(db, job_id)
            if job.status not in (ERROR, STOPPED, INTERRUPTED):
                raise ConfigError(f"job {job_id} is {job.status}: only a failed, stopped or interrupted job is retried")
            clash = db.execute("SELECT id FROM jobs WHERE run_dir = ? AND id != ? AND status IN (?,?,?,?)",
                               (job.run_dir, job_id, WAITING, *LIVE)).fetchone()
            if clash:
                raise ConfigError(f"job {clash[0]} already writes to {job.run_dir}")
            db.execute("UPDATE jobs SET status = ?, position = ?, gpus = '[]', pid = NULL, pid_started = NULL, "
                       "exit_code = NULL, message = '', started = NULL, ended = NULL WHERE id = ?",
                       (WAITING, self._slot_for(db, job.priority), job_id))
            return self._get(db, job_id)

    # ------------------------------------------------------------------ settings
    def setting(self, key: str, default: str = "") -> str:
        with self.lock:
            row = self.db.execute("SELECT value FROM settings WHERE key = ?", (key,)).fetchone()
        return row[0] if row else default

    def set_setting(self, key: str, value: str) -> None:
        with self.transaction() as db:
            db.execute("INSERT INTO settings (key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = ?",
                       (key, value, value))

    @property
    def paused(self) -> bool:
        return self.setting("paused") == "1"

    def set_paused(self, paused: bool) -> None:
        self.set_setting("paused", "1" if paused else "0")


class _Transaction:
    """`with store.transaction() as db:` one BEGIN IMMEDIATE … COMMIT (ROLLBACK on error), under the lock."""

    def __init__(self, store: QueueStore):
        self.store = store

    def __enter__(self) -> sqlite3.Connection:
        self.store.lock.acquire()
        try:
            self.store.db.execute("BEGIN IMMEDIATE")
        except BaseException:
            self.store.lock.release()
            raise
        return self.store.db

    def __exit__(self, kind, value, tb) -> None:
        try:
            self.store.db.execute("ROLLBACK" if kind else "COMMIT")
        finally:
            self.store.lock.release()


def _statements(script: str) -> list[str]:
    return [s.strip() for s in script.split(";") if s.strip()]
