"""The background uploader: an events sink on the main process that copies each complete
checkpoint (manifest last), exported LoRA files, samples and the final outputs to the bucket,
then applies the remote retention policy.

Training never waits for the network: `handle` only queues work. Failed requests are retried
with exponential backoff (1 s, 2 s, 4 s … at most 60 s) for as long as the run lasts; `close`
(at the end of the run, or after a stop) waits at most `cloud.final_wait_s` for the queue to
drain and says clearly what could not be uploaded. Progress and failures are `upload` events.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from .s3 import RemoteStore
from ..config import TrainConfig
from ..run.contract import CONFIG_FILE, EVENTS_FILE, LOG_FILE, SAMPLES_DIR, Event
from ..run.retention import RetentionPolicy, retained_steps

LOG = logging.getLogger("trainer")
MAX_BACKOFF_S = 60.0
RUN_FILES = (CONFIG_FILE, LOG_FILE, EVENTS_FILE)


@dataclass(eq=False)
class Job:
    kind: str                 # "checkpoint" | "file" (a file or a folder)
    path: Path
    rel: str = ""             # remote name (files)
    step: int | None = None
    done: set = field(default_factory=set)   # files of a folder already uploaded (retries skip them)


class Uploader:
    def __init__(self, store: RemoteStore, cfg: TrainConfig, run_dir: Path, emit: Callable[..., None],
                 mask: Callable[[str], str] = lambda s: s):
        self.store, self.cfg, self.run_dir, self._emit, self.mask = store, cfg, Path(run_dir), emit, mask
        self.policy = RetentionPolicy.from_config(cfg.checkpoints, cfg.cloud.keep_last)
        self.queue: queue.Queue[Job | None] = queue.Queue()
        self.pending: list[Job] = []
        self._pending_lock = threading.Lock()
        self.deadline: float | None = None
        self.uploaded_any = False
        self.thread = threading.Thread(target=self._work, name="s3-uploader", daemon=True)
        self.thread.start()

    # ------------------------------------------------------------------ sink interface
    def handle(self, record: dict) -> None:
        c = self.cfg.cloud
        kind = record.get("event")
        if kind == "checkpoint":
            if c.upload_checkpoints and record.get("path"):
                self._put(Job("checkpoint", Path(record["path"]), step=record.get("step")))
            if c.upload_outputs and record.get("export"):
                self._put(Job("file", Path(record["export"]), Path(record["export"]).name))
        elif kind == "export" and c.upload_outputs and record.get("path"):
            self._put(Job("file", Path(record["path"]), Path(record["path"]).name))
        elif kind == "sample" and c.upload_samples:
            for p in record.get("paths") or []:
                self._put(Job("file", Path(p), self._relative(Path(p), default_dir=SAMPLES_DIR)))
        elif kind == "done" and c.upload_outputs:
            outputs = record.get("outputs") or []
            for p in (outputs.values() if isinstance(outputs, dict) else outputs):
                self._put(Job("file", Path(p), self._relative(Path(p))))

    def close(self) -> None:
        """Wait (bounded) for the queue, then upload the run's config/log/events snapshot."""
        self.deadline = time.monotonic() + self.cfg.cloud.final_wait_s
        # the run's files are worth a wait only where the bucket has been reachable in this run
        # (not after failing at the start, e.g. on an unreachable endpoint)
        if self.cfg.cloud.upload_outputs and (self.uploaded_any or self.pending):
            for name in RUN_FILES:
                if (self.run_dir / name).is_file():
                    self._put(Job("file", self.run_dir / name, name))
        with self._pending_lock:
            waiting = len(self.pending)
        if waiting:
            LOG.info("waiting up to %d s for %d upload(s) to %s", self.cfg.cloud.final_wait_s, waiting,
                     self.store.url())
        self.queue.put(None)
        self.thread.join(timeout=max(0.0, self.deadline - time.monotonic()) + 1.0)
        with self._pending_lock:
            left = list(self.pending)
        if left:
            names = ", ".join(str(j.path) for j in left[:5]) + (" …" if len(left) > 5 else "")
            message = (f"{len(left)} upload(s) to {self.store.url()} did not finish within cloud.final_wait_s="
                       f"{self.cfg.cloud.final_wait_s} s: {names}. The local copies are complete; the next run "
                       f"with this config uploads new checkpoints (copy these by hand if you need them).")
            LOG.error(message)
            self._emit(Event.UPLOAD, status="incomplete", pending=len(left), message=message)

    # ------------------------------------------------------------------ worker
    def _relative(self, path: Path, default_dir: str = "") -> str:
        try:
            return path.resolve().relative_to(self.run_dir.resolve()).as_posix()
        except ValueError:
            return f"{default_dir}/{path.name}" if default_dir else path.name

    def _put(self, job: Job) -> None:
        with self._pending_lock:
            self.pending.append(job)
        self.queue.put(job)

    def _work(self) -> None:
        while True:
            job = self.queue.get()
            if job is None:
                return
            try:
                self._run(job)
            except Exception:  # never let the uploader thread die silently
                LOG.exception("upload of %s failed unexpectedly", job.path)
            finally:
                with self._pending_lock:
                    if job in self.pending:
                        self.pending.remove(job)

    def _run(self, job: Job) -> None:
        attempt = 0
        started = time.monotonic()
        target = self.store.url(f"checkpoints/{job.path.name}/" if job.kind == "checkpoint" else job.rel)
        if job.path.exists():
            self._emit(Event.UPLOAD, status="started", what=job.kind, step=job.step, url=target,
                       bytes=_size(job.path), queued=len(self.pending))
        while True:
            if not job.path.exists():
                # pruned locally before its turn came (a newer checkpoint supersedes it)
                self._emit(Event.UPLOAD, status="skipped", what=job.kind, step=job.step, url=target,
                           message=f"{job.path} no longer exists locally")
                return
            try:
                if job.kind == "checkpoint":
                    sent = self.store.upload_checkpoint(job.path, job.done)
                elif job.path.is_dir():  # a full fine-tune's diffusers folder
                    sent = self.store.put_folder(job.path, job.rel, job.done)
                else:
                    sent = self.store.put_file(job.path, job.rel)
                self.uploaded_any = True
                self._emit(Event.UPLOAD, status="done", what=job.kind, step=job.step, url=target, bytes=sent,
                           seconds=round(time.monotonic() - started, 2), attempts=attempt + 1)
                if job.kind == "checkpoint":
                    self._retain()
                return
            except FileNotFoundError:
                continue  # the folder vanished mid-upload: the check above reports it
            except Exception as e:
                attempt += 1
                error = self.mask(f"{type(e).__name__}: {e}")
                now = time.monotonic()
                if self.deadline is not None and now >= self.deadline:
                    LOG.error("upload of %s to %s failed (%s); giving up: cloud.final_wait_s has passed",
                              job.path, target, error)
                    self._emit(Event.UPLOAD, status="failed", what=job.kind, step=job.step, url=target,
                               attempts=attempt, error=error)
                    return
                delay = min(MAX_BACKOFF_S, 2.0 ** (attempt - 1))
                if self.deadline is not None:
                    delay = min(delay, max(0.0, self.deadline - now))
                if attempt == 1:
                    LOG.warning("upload of %s to %s failed (%s); retrying with backoff", job.path, target, error)
                self._emit(Event.UPLOAD, status="retrying", what=job.kind, step=job.step, url=target,
                           attempts=attempt, retry_in_s=round(delay, 1), error=error)
                time.sleep(delay)

    def _retain(self) -> None:
        """Remote retention (the local policy with cloud.keep_last), then partial folders."""
        try:
            remote = self.store.checkpoints()
            keep = retained_steps([(c.step, c.metrics) for c in remote], self.policy)
            for c in remote:
                if c.step not in keep:
                    self.store.delete_checkpoint(c.step)
                    self._emit(Event.UPLOAD, status="pruned", what="checkpoint", step=c.step,
                               url=f"s3://{self.store.bucket}/{c.key}")
            # folders without a manifest: uploads cut short (this uploader is the only writer
            # and has just finished, so none of them is still in progress)
            for step in self.store.incomplete_steps():
                self.store.delete_checkpoint(step)
        except Exception as e:  # retention is retried after the next checkpoint
            LOG.warning("remote retention failed (%s); will retry after the next checkpoint",
                        self.mask(f"{type(e).__name__}: {e}"))


def _size(path: Path) -> int:
    try:
        return path.stat().st_size if path.is_file() else sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    except OSError:
        return 0
