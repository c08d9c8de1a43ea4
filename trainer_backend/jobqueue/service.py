"""The queue as the page, the API and the headless server use it: submit (checked as Start checks),
list with progress, stop, checkpoint, delete, retry, reorder, pause. One per studio process."""
from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from trainer_backend.config import ConfigError
from trainer_backend.config.base import Problem

from . import training_jobs
from .progress import run_progress
from .store import LIVE, QUEUE_FILE, STATUSES, Job, QueueStore
from .worker import Worker

STATE_DIR_NAME = ".studio-state"   # under --runs-dir unless --state-dir says otherwise


class ConfigProblems(ConfigError):
    """A submitted config's problems, every one (the API answers them as 422 [{key, message}])."""

    def __init__(self, problems: list[Problem]):
        self.problems = problems
        super().__init__("; ".join(str(p) for p in problems))


@dataclass
class QueueSettings:
    runs_dir: Path
    state_dir: Path | None = None
    allowed_output_dirs: list[Path] = field(default_factory=list)
    gpu_slots: list[str] = field(default_factory=list)
    python: str = sys.executable
    cwd: Path | None = None
    stop_timeout_s: float = 120.0
    poll_s: float = 1.0

    @property
    def queue_file(self) -> Path:
        return Path(self.state_dir or Path(self.runs_dir) / STATE_DIR_NAME) / QUEUE_FILE


class JobQueue:
    def __init__(self, settings: QueueSettings):
        self.settings = settings
        self.runs_dir = Path(settings.runs_dir).expanduser().resolve()
        self.cwd = Path(settings.cwd or os.getcwd()).resolve()
        self.allowed_roots = [self.runs_dir, *(Path(d).expanduser().resolve() for d in settings.allowed_output_dirs)]
        self.store = QueueStore(settings.queue_file)
        self.worker = Worker(self.store, settings.gpu_slots, python=settings.python, cwd=self.cwd,
                             stop_timeout_s=settings.stop_timeout_s, poll_s=settings.poll_s)

    def start(self) -> "JobQueue":
        self.worker.start()
        return self

    def close(self) -> None:
        self.worker.close()

    # ------------------------------------------------------------------ submitting
    def base(self) -> dict:
        """Sparse values under every submitted config: runs go to --runs-dir."""
        return {"output": {"dir": str(self.runs_dir)}}

    def check(self, config_toml: str) -> list[Problem]:
        return training_jobs.check_config(config_toml, self.base(), self.allowed_roots, self.cwd)[1]

    def submit(self, config_toml: str, priority: int = 0, front: bool = False, submitted_by: str = "",
               secret_env: dict[str, str] | None = None) -> Job:
        """A training job from TOML text over the studio's defaults; raises ConfigProblems with every
        problem (the checks Start and `validate` run) or ConfigError (a clash in the queue)."""
        cfg, problems = training_jobs.check_config(config_toml, self.base(), self.allowed_roots, self.cwd)
        if problems:
            raise ConfigProblems(problems)
        return self.submit_config(cfg, priority=priority, front=front, submitted_by=submitted_by,
                                  secret_env=secret_env)

    def submit_config(self, cfg, priority: int = 0, front: bool = False, submitted_by: str = "",
                      secret_env: dict[str, str] | None = None, resume: bool = False) -> Job:
        """A checked config (output.dir absolute) as a waiting job. A new job may not reuse a folder
        that holds a run; `resume` (the Run page's Resume) continues the run in it."""
        clash = "" if resume else _finished_run(cfg.run_dir)
        if clash:
            raise ConfigProblems([Problem("output.name", clash)])
        job = self.store.add("train", cfg.output.name, str(cfg.run_dir), config_toml=training_jobs.stored_toml(cfg),
                             priority=priority, front=front, submitted_by=submitted_by,
                             gpus_wanted=training_jobs.gpus_wanted(cfg, self.worker.gpu_slots))
        if secret_env:
            self.worker.secrets[job.id] = dict(secret_env)
        self.worker.wake()
        return job

    def job_for(self, run_dir: str | Path) -> Job | None:
        """The newest job of a run folder."""
        return self.store.latest_for(str(run_dir))

    def place(self, job: Job) -> str:
        """Where a waiting job stands, in words: 'waiting in the queue: 2nd of 5'."""
        ids = [j.id for j in self.store.waiting()]
        paused = " (the queue is paused)" if self.store.paused else ""
        if job.id not in ids:
            return job.status
        return f"waiting in the queue: {_ordinal(ids.index(job.id) + 1)} of {len(ids)}{paused}"

    def submit_command(self, name: str, argv: list[str], gpus: int = 1, priority: int = 0, front: bool = False,
                       run_dir: str | Path | None = None) -> Job:
        """A job that runs a prepared command (a caption job, a LoRA tool) in its own folder under
        --runs-dir; it gets CUDA_VISIBLE_DEVICES for its slots like a training job."""
        if not re.fullmatch(r"[\w.-]+", name):
            raise ConfigError(f"name: {name!r} may hold only letters, digits, '.', '_' and '-'")
        folder = Path(run_dir) if run_dir else self.runs_dir / name
        wanted = 0 if not self.worker.gpu_slots else gpus
        job = self.store.add("command", name, str(folder), argv=[str(a) for a in argv], priority=priority,
                             front=front, gpus_wanted=wanted)
        self.worker.wake()
        return job

    # ------------------------------------------------------------------ reading
    def describe(self, job: Job) -> dict:
        """The job as the API shows it: its row plus progress from its run folder."""
        out = job.to_dict()
        if job.status != "waiting":   # a training job's events, or a command's that writes them (captions)
            prog = run_progress(job.run_dir)
            out.update({k: prog[k] for k in ("step", "total", "loss", "it_per_s", "eta_s")})
        else:
            out.update(step=0, total=None, loss=None, it_per_s=None, eta_s=None)
        return out

    def jobs(self, statuses: tuple[str, ...] | None = None, limit: int | None = None) -> list[dict]:
        jobs = self.store.jobs(statuses or STATUSES, limit, with_config=False)
        return [self.describe(j) for j in jobs]

    def get(self, job_id: int) -> Job:
        try:
            return self.store.get(job_id)
        except KeyError:
            raise LookupError(f"no job {job_id}") from None

    # ------------------------------------------------------------------ control
    def stop(self, job_id: int) -> Job:
        self.get(job_id)
        return self.worker.stop(job_id)

    def checkpoint(self, job_id: int) -> Job:
        self.get(job_id)
        return self.worker.checkpoint(job_id)

    def delete(self, job_id: int) -> Job:
        self.get(job_id)
        return self.store.cancel(job_id)

    def retry(self, job_id: int) -> Job:
        self.get(job_id)
        job = self.store.retry(job_id)
        self.worker.wake()
        return job

    def move(self, job_id: int, where: str) -> Job:
        self.get(job_id)
        return self.store.move(job_id, where)

    def set_paused(self, paused: bool) -> None:
        self.store.set_paused(paused)
        self.worker.wake()

    def live_jobs(self) -> list[Job]:
        return self.store.jobs(LIVE)


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def _finished_run(run_dir: Path) -> str:
    """A run folder that already holds a finished or resumable run is not started over by a new job."""
    from trainer_backend.run.contract import EVENTS_FILE
    if (run_dir / EVENTS_FILE).is_file():
        return (f"a run named '{run_dir.name}' already exists in {run_dir.parent}: retry its job or resume it from "
                f"the Runs page, or change output.name to start a new run")
    return ""
