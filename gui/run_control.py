"""Start, stop, resume and find runs. One run at a time per device set; everything is kept
in the run directory so a restarted GUI re-attaches (see run_state.py)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from trainer_backend.config import ConfigError, TrainConfig, from_dict, load_config, to_dict
from trainer_backend.run.contract import CONFIG_FILE, EVENTS_FILE
from trainer_backend.run.run_folder import delete_run, is_run_folder
from trainer_backend.run.run_lock import describe as describe_holder, holder as run_lock_holder

from gui import processes as procs
from gui.run_state import forget, run_status, snapshot


class StartRefused(Exception):
    """Start/Resume/Stop cannot be done now; the message tells the user why and what to do."""


def device_set(hardware: dict, gpu_count: int) -> set[str]:
    """The devices a run occupies: {'cpu'}, {'all'} or GPU ids."""
    if hardware.get("cpu") or gpu_count == 0:
        return {"cpu"}
    ids = str(hardware.get("gpu_ids", "all"))
    return {"all"} if ids == "all" else set(ids.split(","))


def devices_overlap(a: set[str], b: set[str]) -> bool:
    if "cpu" in a or "cpu" in b:
        return "cpu" in a and "cpu" in b
    return "all" in a or "all" in b or bool(a & b)


def is_run_dir(path: Path) -> bool:
    """A run's folder (its marker, or an older run's files and nothing else): run/run_folder.py."""
    return is_run_folder(path)


class RunManager:
    def __init__(self, runs_dir: str | Path, gpu_count: int = 0, python: str = sys.executable,
                 cwd: str | Path | None = None, stop_timeout_s: float = 120.0,
                 allowed_roots: list[str | Path] = ()):
        self.runs_dir = Path(runs_dir).resolve()
        # where runs started from the studio may write: the runs folder and the folders given with
        # --allow-output-dir (the CLI is not restricted)
        self.allowed_roots = [self.runs_dir, *(Path(r).expanduser().resolve() for r in allowed_roots)]
        self.gpu_count = gpu_count
        self.python = python
        self.cwd = Path(cwd or os.getcwd()).resolve()
        self.stop_timeout_s = stop_timeout_s
        self.children: dict[Path, subprocess.Popen] = {}
        self.extra_roots: set[Path] = set()
        self.lock = threading.RLock()  # start() holds it while checking live runs (reap locks too)
        self.current: Path | None = None   # the run the Run page follows
        self.pending: tuple[str, float] | None = None   # (run name, time) while Start is checking/launching
        self.queue = None   # the studio's JobQueue (trainer_backend/jobqueue): Start and Resume add jobs to it

    # ------------------------------------------------------------------ discovery
    def roots(self) -> list[Path]:
        return [self.runs_dir, *sorted(self.extra_roots - {self.runs_dir})]

    def run_dirs(self) -> list[Path]:
        """Every run directory under the roots, newest first."""
        found = []
        for root in self.roots():
            if root.is_dir():
                found += [p for p in root.iterdir() if is_run_dir(p)]
        return sorted(set(found), key=lambda p: _mtime(p), reverse=True)

    def reap(self) -> None:
        """Record the exit code of runs this GUI started (others are reaped by init)."""
        with self.lock:
            for run_dir, proc in list(self.children.items()):
                code = proc.poll()
                if code is not None:
                    del self.children[run_dir]
                    try:   # a deleted run has nowhere to record it; that must not break the next Start
                        procs.write_exit(run_dir, code)
                    except OSError:
                        pass

    def live_runs(self) -> list[Path]:
        self.reap()
        return [d for d in self.run_dirs() if procs.is_alive(procs.read_process_record(d))]

    def current_run(self) -> Path | None:
        """The run the Run page shows: the one picked last, else a live one, else the newest."""
        if self.current is not None and self.current.is_dir():
            return self.current
        live = self.live_runs()
        dirs = live or self.run_dirs()
        return dirs[0] if dirs else None

    # ------------------------------------------------------------------ starting
    def _conflict(self, cfg: TrainConfig, run_dir: Path) -> str:
        wanted = device_set(to_dict(cfg)["hardware"], self.gpu_count)
        for live in self.live_runs():
            try:
                hardware = load_config(live / CONFIG_FILE).hardware.model_dump()
            except Exception:
                hardware = {}
            if live.resolve() == run_dir.resolve() or devices_overlap(wanted, device_set(hardware, self.gpu_count)):
                where = "the CPU" if "cpu" in wanted else "these GPUs"
                other = ("" if "cpu" in wanted or self.gpu_count < 2 else
                         ", or choose other GPUs in hardware.gpu_ids")   # a CPU or one GPU has no other to choose
                return (f"run '{live.name}' is already using {where} (status: {run_status(live).text}). "
                        f"Stop it first{other}.")
        return ""

    def start(self, cfg: TrainConfig, resume: bool = False, secret_env: dict[str, str] | None = None,
              front: bool = True) -> Path:
        """Validate, write the run directory's config/command/process files and start the trainer.
        `secret_env` (secret name -> value, typed in the page) reaches the process environment
        only. Raises ConfigError (naming a field) or StartRefused. With the studio's job queue
        (`self.queue`) the run is a job: at the front (`front`), or at the end, and it starts when
        its GPUs are free."""
        self.pending = (cfg.output.name, time.time())   # the Run page shows it as starting at once
        try:
            if self.queue is not None:
                return self._enqueue(cfg, resume, secret_env, front)
            return self._start(cfg, resume, secret_env)
        finally:
            self.pending = None

    def _checked(self, cfg: TrainConfig, secret_env: dict[str, str] | None) -> tuple[TrainConfig, Path]:
        """A copy of cfg with output.dir made absolute, checked as a run (allowed roots, paths, secrets)."""
        from trainer_backend.config.checks import validate_for_run
        cfg = cfg.model_copy(deep=True)
        try:
            cfg.output.dir = str((self.cwd / cfg.output.dir).resolve())
        except (OSError, ValueError) as e:
            raise ConfigError(f"output.dir: {e}") from None
        self._check_allowed(cfg.run_dir)
        validate_for_run(cfg.model_copy(deep=True))  # path checks, errors name the key
        _check_secret_names(cfg, secret_env or {})
        return cfg, cfg.run_dir

    def _enqueue(self, cfg: TrainConfig, resume: bool, secret_env: dict[str, str] | None, front: bool) -> Path:
        cfg, run_dir = self._checked(cfg, secret_env)
        if not resume and is_run_dir(run_dir):
            self._refuse_existing(run_dir)
        # a second job for a folder a job already uses: ConfigError naming output.name (shown under it)
        self.queue.submit_config(cfg, front=front, secret_env=secret_env, resume=resume, submitted_by="page")
        if run_dir.parent != self.runs_dir:
            self.extra_roots.add(run_dir.parent)
        if front:
            self.current = run_dir
        return run_dir

    def queue_note(self) -> tuple[str, str] | None:
        """(run name, where it waits) when the run this page follows is a job still waiting."""
        if self.queue is None or self.current is None:
            return None
        job = self.queue.job_for(self.current)
        return (job.name, self.queue.place(job)) if job is not None and job.status == "waiting" else None

    def _start(self, cfg: TrainConfig, resume: bool, secret_env: dict[str, str] | None) -> Path:
        from trainer_backend.jobqueue.training_jobs import start_run

        cfg, run_dir = self._checked(cfg, secret_env)
        with self.lock:
            conflict = self._conflict(cfg, run_dir)
            if conflict:
                raise StartRefused(conflict)
            if not resume and is_run_dir(run_dir):
                self._refuse_existing(run_dir)
            # a new folder or a run's own (never the user's other files), held by no other trainer: refused
            # with one line naming the holder; the lock is taken before anything is written
            self.children[run_dir] = start_run(cfg, self.python, self.cwd, by="studio", who="the studio",
                                               resume=resume, secret_env=secret_env)
            if run_dir.parent != self.runs_dir:
                self.extra_roots.add(run_dir.parent)
            self.current = run_dir
        forget(run_dir)
        return run_dir

    @staticmethod
    def _refuse_existing(run_dir: Path) -> None:
        state = run_status(run_dir)
        if state.resumable or state.status == "done":
            what = "finished" if state.status == "done" else f"{state.status} ({state.text})"
            hint = ("press Resume to continue it" if state.resumable else "delete it on the Runs page")
            raise StartRefused(f"a run named '{run_dir.name}' already exists and is {what}: {hint}, "
                               f"or change output.name to start a new run.")

    def _check_allowed(self, run_dir: Path) -> None:
        """Runs started here write only inside the allowed roots (not /etc, not the user's home), with
        every link resolved: a link placed in the runs folder (runs/x -> /elsewhere) is refused."""
        def inside(path: Path) -> bool:
            return any(path == root or path.is_relative_to(root) for root in self.allowed_roots)

        roots = ", ".join(str(r) for r in self.allowed_roots)
        if inside(run_dir):
            try:
                real = run_dir.resolve()
            except (OSError, RuntimeError):  # a link loop
                real = None
            if real is not None and inside(real):
                return
            raise ConfigError(f"output.name: {run_dir} leads to {real or 'a link loop'} through a link, outside the "
                              f"folders this studio writes runs into ({roots}); remove the link or choose another "
                              "output.name")
        raise ConfigError(f"output.dir: {run_dir.parent} is outside the folders this studio writes runs into "
                          f"({roots}); choose one of them, or start the studio with --allow-output-dir "
                          f"{run_dir.parent}")

    def resume(self, run_dir: Path, secret_env: dict[str, str] | None = None) -> Path:
        """Start a stopped/interrupted run again from its own config (checkpoints.resume=auto)."""
        run_dir = Path(run_dir)
        state = run_status(run_dir)
        if state.alive:
            raise StartRefused(f"run '{run_dir.name}' is still running")
        if not (run_dir / CONFIG_FILE).is_file():
            raise StartRefused(f"run '{run_dir.name}' has no config.toml to resume from")
        data = to_dict(load_config(run_dir / CONFIG_FILE))
        if data["checkpoints"]["resume"] == "none":
            data["checkpoints"]["resume"] = "auto"
        return self.start(from_dict(data), resume=True, secret_env=secret_env)

    # ------------------------------------------------------------------ controlling
    def _live_record(self, run_dir: Path) -> dict:
        record = procs.read_process_record(run_dir)
        if not procs.is_alive(record):
            raise StartRefused(f"run '{Path(run_dir).name}' is not running")
        return record

    def stop(self, run_dir: Path) -> str:
        record = self._live_record(run_dir)
        already = procs.stop_requested_at(run_dir)
        if already:
            waited = time.time() - already
            return (f"already stopping for {waited:.0f} s; it is saving state. "
                    + ("Use Force kill if it hangs." if waited > self.stop_timeout_s else ""))
        sent = procs.request_stop(run_dir, record)
        return f"stopping, saving state… (signalled {sent} process{'es' if sent != 1 else ''})"

    def may_kill(self, run_dir: Path) -> bool:
        """Hard kill is offered only after a graceful stop had its time."""
        since = procs.stop_requested_at(run_dir)
        return since is not None and time.time() - since >= self.stop_timeout_s

    def kill(self, run_dir: Path) -> str:
        record = self._live_record(run_dir)
        if not self.may_kill(run_dir):
            raise StartRefused(f"press Stop first and wait {self.stop_timeout_s:.0f} s for the state to be saved")
        procs.hard_kill(record)
        return "killed; progress since the last checkpoint is lost"

    def save_now(self, run_dir: Path) -> str:
        self._live_record(run_dir)
        procs.touch_control(run_dir, procs.SAVE_MARK)
        return "checkpoint requested: it is saved after the current step"

    def sample_now(self, run_dir: Path) -> str:
        self._live_record(run_dir)
        procs.touch_control(run_dir, procs.SAMPLE_MARK)
        return "samples requested: they are rendered after the current step"

    def delete(self, run_dir: Path) -> str:
        run_dir = Path(run_dir).resolve()
        if not any(run_dir.parent == root for root in self.roots()) or not is_run_dir(run_dir):
            raise StartRefused(f"{run_dir} is not a run directory of this studio")
        if procs.is_alive(procs.read_process_record(run_dir)):
            raise StartRefused(f"run '{run_dir.name}' is running; stop it first")
        held = run_lock_holder(run_dir)   # a trainer this studio did not start (a command, another studio)
        if held is not None:
            raise StartRefused(f"run '{run_dir.name}' is being trained by {describe_holder(held)}; stop it first")
        with self.lock:
            proc = self.children.pop(run_dir, None)   # its exit is no longer recorded anywhere
            if proc is not None:
                proc.poll()
            try:
                kept = delete_run(run_dir)
            except ConfigError as e:
                raise StartRefused(str(e)) from None
        forget(run_dir)
        if self.current == run_dir:
            self.current = None
        if kept:
            return (f"deleted what the run wrote in {run_dir}; kept {len(kept)} item(s) it did not write: "
                    + ", ".join(kept[:5]))
        return f"deleted {run_dir}"


def _mtime(path: Path) -> float:
    times = [path.stat().st_mtime]
    for name in (EVENTS_FILE, procs.PROCESS_FILE, CONFIG_FILE):
        try:
            times.append((path / name).stat().st_mtime)
        except OSError:
            pass
    return max(times)


def run_started_at(run_dir: Path) -> float | None:
    """When the run's current process started (its record), else its first event."""
    record = procs.read_process_record(run_dir)
    if record and isinstance(record.get("started"), (int, float)):
        return float(record["started"])
    return snapshot(run_dir).first_time


def first_started_at(run_dir: Path, snap=None) -> float | None:
    """When the run first started: a resumed run's process record is the resume's, its first event is
    older."""
    times = [t for t in (run_started_at(run_dir), (snap or snapshot(run_dir)).first_time) if t]
    return min(times) if times else None


def exited_at(run_dir: Path) -> float | None:
    """When the studio saw the run's process exit (its exit record), None when it did not."""
    try:
        value = json.loads((Path(run_dir) / procs.EXIT_FILE).read_text(encoding="utf-8")).get("time")
    except (OSError, ValueError, AttributeError):
        return None
    return float(value) if isinstance(value, (int, float)) else None


def _check_secret_names(cfg: TrainConfig, secret_env: dict[str, str]) -> None:
    """Secrets typed in the page may only be the ones this config names (cloud keys, webhook tokens,
    the W&B key): never LD_PRELOAD, PYTHONPATH or any other variable that changes what runs."""
    from gui.secrets_panel import secret_names
    allowed = {name for _, name in secret_names(cfg)}
    unknown = sorted(set(secret_env) - allowed)
    if unknown:
        names = ", ".join(f"{k} = {n}" for k, n in secret_names(cfg)) or "none"
        raise StartRefused(f"secret {', '.join(unknown)}: not a secret this config refers to, so it is not passed "
                           f"to the trainer (the config's secrets: {names})")
