"""The caption job as the studio sees it: start it as its own process, read its progress, stop it
(standard library only: the studio imports this, never torch).

    job = start_caption_job(CaptionOptions(dataset="data/dogs", model="builtin:tiny-caption-florence2"))
    caption_progress(job)      # CaptionProgress(state="running", done=3, total=12, eta_s=4.1, …)
    stop_caption_job(job)      # control/stop + SIGTERM: the batch in hand is written, then it exits 75

The job folder is a run folder (run/contract.py's events.jsonl, process.json, console.log,
control/stop), so the studio's run machinery (gui/processes.py, gui/run_state.py) works on it too."""
from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..run.contract import CONSOLE_LOG, CONTROL_DIR, EVENTS_FILE, PROCESS_FILE, Control
from .options import CaptionOptions, to_argv

PROJECT_ROOT = Path(__file__).resolve().parents[2]
LEDGER = "captioned.jsonl"   # worklist.LEDGER (that module imports the data package, hence torch)


def caption_argv(options: CaptionOptions, python: str = "") -> list[str]:
    return [python or sys.executable, "-m", "trainer_backend", "caption", *to_argv(options)]


def absolute(options: CaptionOptions) -> CaptionOptions:
    """The options with absolute dataset and job folder (the job's working directory does not matter then)."""
    return dataclasses.replace(options, dataset=str(Path(options.dataset).expanduser().resolve()),
                               job_dir=str(options.resolved_job_dir().resolve()))


def queue_caption_job(queue, options: CaptionOptions, gpus: int = 1, priority: int = 0, front: bool = False):
    """The job as a job of the studio's queue (trainer_backend.jobqueue.JobQueue): it waits for a free slot,
    runs under that slot's CUDA_VISIBLE_DEVICES and the folder's lock, Stop and progress as any queue job."""
    options = absolute(options)
    job_dir = Path(options.job_dir)
    return queue.submit_command(job_dir.name, caption_argv(options), gpus=gpus, priority=priority, front=front,
                                run_dir=job_dir)


def start_caption_job(options: CaptionOptions, env: dict[str, str] | None = None, python: str = "") -> Path:
    """Start the job in its own session (a studio restart leaves it running); returns its folder."""
    options = absolute(options)
    job_dir = Path(options.job_dir)
    job_dir.mkdir(parents=True, exist_ok=True)
    (job_dir / CONTROL_DIR / Control.STOP.value).unlink(missing_ok=True)
    argv = caption_argv(options, python)
    child_env = dict(os.environ if env is None else env)
    child_env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PROJECT_ROOT), child_env.get("PYTHONPATH", "")) if p)
    with open(job_dir / CONSOLE_LOG, "ab") as console:
        proc = subprocess.Popen(argv, env=child_env, cwd=str(PROJECT_ROOT), stdin=subprocess.DEVNULL, stdout=console,
                                stderr=subprocess.STDOUT, start_new_session=True)
    record = {"pid": proc.pid, "pgid": proc.pid, "started": time.time(), "argv": argv}
    (job_dir / PROCESS_FILE).write_text(json.dumps(record, indent=1), encoding="utf-8")
    return job_dir


@dataclass
class CaptionProgress:
    state: str = "not started"   # not started, running, done, stopped, error, ended (exited without a word)
    done: int = 0                # images finished (this start and earlier ones)
    total: int = 0
    images_per_s: float = 0.0
    eta_s: float | None = None
    message: str = ""            # the error's one line, or the model's download while it downloads
    recent: list[dict] = field(default_factory=list)   # the last captions written: {"image", "caption"}

    @property
    def fraction(self) -> float:
        return self.done / self.total if self.total else 0.0


def _download_line(event: dict) -> str:
    from ..model_sources.progress import DownloadStatus, status_line
    fields = {k: event[k] for k in DownloadStatus.__dataclass_fields__ if k in event}
    try:
        line = status_line(DownloadStatus(**fields))
        return line if event.get("status") == "done" else "downloading " + line
    except TypeError:
        return f"downloading {event.get('repo', 'the model')}"


def _process(job_dir: Path) -> dict:
    try:
        record = json.loads((job_dir / PROCESS_FILE).read_text(encoding="utf-8"))
        return record if isinstance(record, dict) else {}
    except (OSError, ValueError):
        return {}


def _alive(job_dir: Path) -> bool:
    try:
        pid = _process(job_dir)["pid"]
        os.kill(int(pid), 0)
    except (OSError, ValueError, KeyError, TypeError):
        return False
    try:   # a zombie (exited, not yet reaped by the studio that started it) is not running
        with open(f"/proc/{int(pid)}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def caption_progress(job_dir: Path, recent: int = 5) -> CaptionProgress:
    job_dir = Path(job_dir)
    progress = CaptionProgress()
    ended_at = 0.0   # the time of the last done/stopped/error event
    try:
        lines = (job_dir / EVENTS_FILE).read_text(encoding="utf-8").splitlines()
    except OSError:
        lines = []
    for line in lines:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        kind = event.get("event")
        if kind in ("start", "step"):
            progress.state = "running"
            progress.done, progress.total = event.get("step", 0), event.get("total_steps", 0)
            progress.images_per_s = event.get("it_per_s", 0.0) if kind == "step" else 0.0
            progress.eta_s = event.get("eta_s") if kind == "step" else None
            progress.message = ""
        if kind == "download":   # the captioner's model coming from the hub (model_sources)
            progress.state = "running"
            progress.message = _download_line(event)
        if kind in ("done", "stopped", "preempted", "error"):
            ended_at = event.get("time", 0.0)
        if kind == "done":
            progress.state, progress.done, progress.eta_s = "done", event.get("step", progress.done), 0.0
        elif kind in ("stopped", "preempted"):
            progress.state, progress.eta_s = "stopped", None
        elif kind == "error":
            progress.state, progress.message = "error", event.get("message", "")
    alive = _alive(job_dir)
    if progress.state == "running" and not alive:
        progress.state = "ended"
    elif progress.state != "running" and alive and ended_at < _process(job_dir).get("started", 0.0):
        progress.state, progress.eta_s, progress.message = "running", None, ""   # a new start, loading the model
    try:
        tail = (job_dir / LEDGER).read_text(encoding="utf-8").splitlines()[-recent:]
        progress.recent = [json.loads(line) for line in tail if line.strip()]
    except (OSError, ValueError):
        pass
    return progress


def stop_caption_job(job_dir: Path) -> bool:
    """Ask the job to stop after the batch in hand (control/stop, then SIGTERM); False when it is not running."""
    job_dir = Path(job_dir)
    stop = job_dir / CONTROL_DIR / Control.STOP.value
    stop.parent.mkdir(parents=True, exist_ok=True)
    stop.write_text(str(time.time()), encoding="utf-8")
    if not _alive(job_dir):
        return False
    try:
        os.kill(int(_process(job_dir)["pid"]), signal.SIGTERM)
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return True
