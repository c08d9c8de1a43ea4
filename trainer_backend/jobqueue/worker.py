"""The queue's worker: starts waiting jobs on free slots, follows the running ones, and after a
studio restart re-adopts the jobs whose process still runs.

A job is re-adopted only when its run folder's own records name the pid the queue stored: the
process record (process.json: pid, the process's start time, the host) with that process alive
and started at that time, and the folder's lock (run/run_lock.py) held, by that pid. A reused pid
is not the run. A job whose process ended while the studio was away takes the
ending its events.jsonl wrote (done, stopped, error), else it is `interrupted` (resumable from
its last checkpoint with Retry)."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from trainer_backend.config import ConfigError
from trainer_backend.run import exitcodes
from trainer_backend.run.contract import CONSOLE_LOG
from trainer_backend.run.run_lock import holder as run_lock_holder

from . import processes as procs
from . import slots as slot_rules
from .progress import ending_status, run_progress
from .store import DONE, ERROR, INTERRUPTED, LIVE, RUNNING, STARTING, STOPPED, STOPPING, Job, QueueStore

PROJECT_ROOT = Path(__file__).resolve().parents[2]   # the folder holding trainer_backend/


class Worker:
    def __init__(self, store: QueueStore, gpu_slots: list[str], python: str = sys.executable,
                 cwd: str | Path | None = None, stop_timeout_s: float = 120.0, poll_s: float = 1.0):
        self.store = store
        self.gpu_slots = list(gpu_slots)
        self.python = python
        self.cwd = Path(cwd or os.getcwd()).resolve()
        self.stop_timeout_s = stop_timeout_s
        self.poll_s = poll_s
        self.children: dict[int, subprocess.Popen] = {}
        self.secrets: dict[int, dict[str, str]] = {}   # typed in the page: kept in memory, never in the file
        self.lock = threading.RLock()
        self._wake = threading.Event()
        self._halt = threading.Event()
        self._thread: threading.Thread | None = None
        self.adopted: list[int] = []

    # ------------------------------------------------------------------ the thread
    def start(self) -> "Worker":
        self.adopt()
        self._thread = threading.Thread(target=self._loop, name="queue-worker", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self._halt.set()
        self._wake.set()
        if self._thread:
            self._thread.join(timeout=10)

    def wake(self) -> None:
        """Something changed (a submit, a stop): look now rather than at the next poll."""
        self._wake.set()

    def _loop(self) -> None:
        while not self._halt.is_set():
            try:
                self.tick()
            except Exception as e:   # the worker must outlive one bad job; the job shows the message
                print(f"queue worker: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
            self._wake.wait(self.poll_s)
            self._wake.clear()

    # ------------------------------------------------------------------ re-adoption
    def adopt(self) -> None:
        """After a restart: keep the live jobs whose own process still runs, end the others."""
        with self.lock:
            for job in self.store.live():
                if job.id in self.children:
                    continue
                if self._same_process(job):
                    self.adopted.append(job.id)
                    if job.status == STARTING:
                        self.store.update(job.id, status=RUNNING)
                else:
                    self._finish_from_folder(job, "the studio restarted and the job's process was gone")

    @staticmethod
    def _same_process(job: Job) -> bool:
        """The job's own process still runs: the run folder's process record names the stored pid
        with a live process started at that time, and the folder's lock is held by that pid."""
        run_dir = Path(job.run_dir)
        record = procs.read_process_record(run_dir)
        if not record or record["pid"] != job.pid or not procs.is_alive(record):
            return False
        held = run_lock_holder(run_dir)
        return held is not None and held.get("pid") == job.pid

    # ------------------------------------------------------------------ each tick
    def tick(self) -> None:
        with self.lock:
            self._follow_live()
            if not self.store.paused:
                self._start_waiting()

    def _follow_live(self) -> None:
        for job in self.store.live():
            child = self.children.get(job.id)
            if child is not None:
                code = child.poll()
                if code is None:
                    self._maybe_force(job)
                    continue
                del self.children[job.id]
                self.secrets.pop(job.id, None)
                try:
                    procs.write_exit(Path(job.run_dir), code)
                except OSError:
                    pass
                self._finish(job, code)
            elif job.status != STARTING:
                if self._same_process(job):
                    self._maybe_force(job)
                else:
                    self._finish_from_folder(job, "its process ended while this studio was not watching it")

    def _maybe_force(self, job: Job) -> None:
        """A graceful stop that outlasts --stop-timeout ends with a kill of the job's process group."""
        since = procs.stop_requested_at(Path(job.run_dir))
        if job.status == STOPPING and since and time.time() - since > self.stop_timeout_s:
            record = procs.read_process_record(Path(job.run_dir))
            if record:
                procs.hard_kill(record)

    def _finish(self, job: Job, code: int) -> None:
        ending = ending_status(run_progress(job.run_dir)["ending"]) if job.kind == "train" else None
        if code == exitcodes.OK:
            status = ending or DONE
        elif code == exitcodes.STOPPED_SAVED or (job.status == STOPPING and code < 0):
            status = STOPPED
        else:
            status = ERROR
        message = "" if status in (DONE, STOPPED) else (run_progress(job.run_dir).get("message")
                                                         or _last_line(Path(job.run_dir) / CONSOLE_LOG))
        self.store.update(job.id, status=status, exit_code=code, ended=time.time(), message=message[:500])

    def _finish_from_folder(self, job: Job, why: str) -> None:
        prog = run_progress(job.run_dir)
        ending = ending_status(prog["ending"])
        code = procs.read_exit(Path(job.run_dir))
        if ending is None and code is not None and job.kind == "command":
            ending = DONE if code == 0 else ERROR
        self.store.update(job.id, status=ending or INTERRUPTED, exit_code=code, ended=time.time(),
                          message="" if ending in (DONE, STOPPED) else (prog.get("message") or why)[:500])

    def _start_waiting(self) -> None:
        busy = [s for job in self.store.live() for s in job.gpus]
        waiting = self.store.waiting()
        for job in waiting:
            why = slot_rules.impossible(self.gpu_slots, job.gpus_wanted) if job.gpus_wanted else ""
            if why:
                self.store.update(job.id, status=ERROR, position=None, message=why, ended=time.time())
        waiting = [j for j in waiting if not (j.gpus_wanted and j.gpus_wanted > len(self.gpu_slots))]
        for job_id, slots in slot_rules.assign(self.gpu_slots, busy, [(j.id, j.gpus_wanted) for j in waiting]):
            job = self.store.claim(job_id, slots)
            if job is None:
                continue
            try:
                self._launch(job, slots)
            except (ConfigError, OSError, ValueError) as e:
                self.store.update(job.id, status=ERROR, message=str(e)[:500], ended=time.time())

    def _launch(self, job: Job, slots: list[str]) -> None:
        from .training_jobs import on_slots, start_command, start_run, training_config
        run_dir = Path(job.run_dir)
        if job.kind == "train":
            # a training job resolves relative paths from the studio's folder
            child = start_run(on_slots(training_config(job.config_toml), slots), self.python, self.cwd, by="queue",
                              who=f"the queue (job {job.id}, {_where(slots)})", secret_env=self.secrets.get(job.id))
        else:
            # `python -m trainer_backend …` commands find this copy of the project from their own folder
            env = {**os.environ, "PYTHONUNBUFFERED": "1",
                   "PYTHONPATH": os.pathsep.join(p for p in (str(PROJECT_ROOT), os.environ.get("PYTHONPATH", "")) if p)}
            gpus = [s for s in slots if s != slot_rules.CPU]
            if gpus:
                env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
            child = start_command(job.argv, env, run_dir)
        self.children[job.id] = child
        record = procs.read_process_record(run_dir) or {}
        self.store.update(job.id, status=RUNNING, pid=child.pid, pid_started=record.get("started"))

    # ------------------------------------------------------------------ control
    def stop(self, job_id: int) -> Job:
        """Save state, then stop (the trainer finishes its step, saves a checkpoint and exits)."""
        with self.lock:
            job = self.store.get(job_id)
            if job.status not in LIVE:
                raise ConfigError(f"job {job_id} is {job.status}: only a running job can be stopped "
                                  f"(delete a waiting one)")
            record = procs.read_process_record(Path(job.run_dir))
            if record and procs.is_alive(record):
                procs.request_stop(Path(job.run_dir), record)
            job = self.store.update(job_id, status=STOPPING)
        self.wake()
        return job

    def checkpoint(self, job_id: int) -> Job:
        job = self.store.get(job_id)
        if job.status != RUNNING or job.kind != "train":
            raise ConfigError(f"job {job_id} is {job.status}: a checkpoint is saved by a running training job")
        procs.touch_control(Path(job.run_dir), procs.SAVE_MARK)
        return job

    def wait(self, job_id: int, timeout: float = 600.0) -> Job:
        """Tick until the job has finished (for scripts and tests running the worker in-process)."""
        end = time.monotonic() + timeout
        while True:
            job = self.store.get(job_id)
            if job.status not in (*LIVE, "waiting") or time.monotonic() > end:
                return job
            time.sleep(0.2)


def _where(slots: list[str]) -> str:
    return "the CPU" if slots == [slot_rules.CPU] else f"GPU {','.join(slots)}"


def _last_line(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 4096))
            lines = [ln for ln in f.read().decode("utf-8", "replace").splitlines() if ln.strip()]
        return lines[-1].strip() if lines else ""
    except OSError:
        return ""
