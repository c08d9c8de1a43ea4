"""What a run directory says about its run: events.jsonl folded into a snapshot, plus the
process record, gives the status. Everything the Run and Runs pages show comes from here,
so a refreshed browser or a restarted GUI sees the same thing."""
from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from trainer_backend.run import exitcodes

from gui import processes as procs

from trainer_backend.run.contract import (CHECKPOINTS_DIR, EVENTS_FILE, MANIFEST_FILE, SAVED_STOPS, TERMINAL,
                                          Event)

RESUMABLE = ("stopped", "preempted", "interrupted")
EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)\b(:|$)")
HEAD_BYTES = 128   # the file's first bytes identify it (a rewritten file is read from the start)


@dataclass
class Snapshot:
    """The fold of a run's events (pure data; see `fold_events`)."""
    plan: dict = field(default_factory=dict)
    steps: list[dict] = field(default_factory=list)      # step events, in order
    epochs: list[dict] = field(default_factory=list)
    checkpoints: list[dict] = field(default_factory=list)
    samples: list[dict] = field(default_factory=list)
    uploads: list[dict] = field(default_factory=list)
    validations: list[dict] = field(default_factory=list)  # validation loss events
    starts: list[dict] = field(default_factory=list)       # start events (fresh or resumed)
    resumes: list[dict] = field(default_factory=list)      # resumed events: from which checkpoint
    exports: list[dict] = field(default_factory=list)      # intermediate output files
    class_images: dict = field(default_factory=dict)       # DreamBooth class images, once ready
    warnings: list[dict] = field(default_factory=list)     # the trainer's warnings (a LoRA with no effect, …)
    adapter_effect: dict = field(default_factory=dict)     # the end's with/without-adapter measure
    download: dict = field(default_factory=dict)          # the last hub download event (bytes, speed, ETA, file)
    compile: dict = field(default_factory=dict)            # speed.compile: the last compile event
    terminal: dict | None = None                          # the last done/stopped/preempted/error
    outputs: list[str] = field(default_factory=list)
    first_time: float | None = None
    last_time: float | None = None
    sessions: int = 0                                     # plan events = starts (first run + resumes)
    session_start: float | None = None                    # the current session's first event
    earlier_s: float = 0.0                                # the earlier sessions' run time (resumed runs)
    earlier_end: float = 0.0                              # when the last earlier session ended

    @property
    def last_step(self) -> dict:
        return self.steps[-1] if self.steps else {}


def fold_events(events: list[dict], snap: Snapshot | None = None) -> Snapshot:
    """Apply events (in file order) to a snapshot. A new `plan` event means the run was started
    again (resume): the previous ending no longer applies."""
    snap = snap or Snapshot()
    for ev in events:
        kind, t = ev.get("event"), ev.get("time")
        if isinstance(t, (int, float)):
            if kind == Event.PLAN and snap.sessions and snap.session_start is not None:
                # a resume: the session before ended with its terminal event (else its last event)
                ended = (snap.terminal or {}).get("time")
                ended = ended if isinstance(ended, (int, float)) else snap.last_time
                snap.earlier_s += max(0.0, ended - snap.session_start)
                snap.earlier_end, snap.session_start = ended, t
            snap.session_start = snap.session_start if snap.session_start is not None else t
            snap.first_time = snap.first_time if snap.first_time is not None else t
            snap.last_time = t
        fold = FOLDS.get(kind)
        if fold is not None:  # kinds from a newer trainer are kept out of the snapshot, not an error
            fold(snap, ev)
    return snap


def _plan(snap: Snapshot, ev: dict) -> None:
    snap.plan = {k: v for k, v in ev.items() if k not in ("event", "time")}
    snap.terminal = None
    snap.sessions += 1


def _step(snap: Snapshot, ev: dict) -> None:
    if snap.steps and isinstance(ev.get("step"), int) and ev["step"] <= snap.steps[-1].get("step", -1):
        # resumed from an earlier checkpoint: the chart continues from the resumed step
        snap.steps = [s for s in snap.steps if s.get("step", -1) < ev["step"]]
    snap.steps.append(ev)


def _appended_to(name: str):
    return lambda snap, ev: getattr(snap, name).append(ev)


def _class_images(snap: Snapshot, ev: dict) -> None:
    snap.class_images = ev


def _download(snap: Snapshot, ev: dict) -> None:
    snap.download = ev


def _terminal(snap: Snapshot, ev: dict) -> None:
    snap.terminal = ev
    if ev.get("event") == Event.DONE:
        outputs = ev.get("outputs") or []
        snap.outputs = [str(o) for o in (outputs.values() if isinstance(outputs, dict) else outputs)]


# How each event kind of the run contract (trainer_backend/run/contract.py) changes the snapshot;
# a test makes this cover every kind the trainer can write.
FOLDS = {
    Event.PLAN: _plan, Event.STEP: _step, Event.EPOCH: _appended_to("epochs"),
    Event.CHECKPOINT: _appended_to("checkpoints"), Event.SAMPLE: _appended_to("samples"),
    Event.UPLOAD: _appended_to("uploads"), Event.VALIDATION: _appended_to("validations"),
    Event.START: _appended_to("starts"), Event.RESUMED: _appended_to("resumes"),
    Event.EXPORT: _appended_to("exports"), Event.CLASS_IMAGES: _class_images,
    Event.WARNING: _appended_to("warnings"),
    Event.ADAPTER_EFFECT: lambda snap, ev: setattr(snap, "adapter_effect", ev),
    Event.DOWNLOAD: _download,
    Event.COMPILE: lambda snap, ev: setattr(snap, "compile", ev),
    **{kind: _terminal for kind in TERMINAL},
}


class EventTail:
    """Reads events.jsonl incrementally (only new complete lines each call)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.offset = 0
        self.inode = None
        self.head = b""
        self.snapshot = Snapshot()
        self.lock = threading.Lock()

    def refresh(self) -> Snapshot:
        with self.lock:
            try:
                stat = self.path.stat()
            except OSError:
                return self.snapshot
            if stat.st_size == self.offset and stat.st_ino == self.inode:
                return self.snapshot
            with open(self.path, "rb") as fh:
                head = fh.read(HEAD_BYTES)
                common = min(len(head), len(self.head))
                if stat.st_ino != self.inode or stat.st_size < self.offset or head[:common] != self.head[:common]:
                    # replaced, truncated or rewritten: read it again from the start
                    self.inode, self.offset, self.snapshot = stat.st_ino, 0, Snapshot()
                self.head = head
                fh.seek(self.offset)
                chunk = fh.read()
            end = chunk.rfind(b"\n") + 1  # a half-written last line waits for the next call
            events = []
            for line in chunk[:end].splitlines():
                try:
                    ev = json.loads(line)
                except ValueError:
                    continue
                if isinstance(ev, dict):
                    events.append(ev)
            self.offset += end
            fold_events(events, self.snapshot)
            return self.snapshot


_TAILS: dict[Path, EventTail] = {}
_TAILS_LOCK = threading.Lock()


def snapshot(run_dir: Path) -> Snapshot:
    """The current snapshot of a run (shared, incrementally updated readers)."""
    path = (Path(run_dir) / EVENTS_FILE).resolve()
    with _TAILS_LOCK:
        tail = _TAILS.setdefault(path, EventTail(path))
    return tail.refresh()


def forget(run_dir: Path) -> None:
    with _TAILS_LOCK:
        _TAILS.pop((Path(run_dir) / EVENTS_FILE).resolve(), None)


def has_checkpoint(run_dir: Path) -> bool | int:
    """The step of the newest complete checkpoint (manifest.json is written last), True when its
    step is not in its name, False when there is none."""
    steps = [m.parent.name for m in (Path(run_dir) / CHECKPOINTS_DIR).glob(f"*/{MANIFEST_FILE}")]
    numbers = [int(n.rsplit("-", 1)[1]) for n in steps if n.rsplit("-", 1)[-1].isdigit()]
    return max(numbers) if numbers else bool(steps)


def killed_by_sigkill(run_dir: Path) -> bool:
    """The launcher reported a rank killed by SIGKILL (the OOM killer picks a rank, not the launcher)."""
    path = Path(run_dir) / procs.CONSOLE_LOG
    try:
        with open(path, "rb") as fh:
            fh.seek(max(0, path.stat().st_size - 16384))
            return b"Signals.SIGKILL" in fh.read()
    except OSError:
        return False


@dataclass
class RunStatus:
    status: str          # starting|running|stopping|done|stopped|preempted|error|interrupted|new|elsewhere
    text: str            # one line for people
    alive: bool
    resumable: bool


KILLED_CODES = (-9, 137)   # SIGKILL seen by Popen, or by a shell/launcher (128 + 9)


def derive_status(snap: Snapshot, alive: bool, exit_code: int | None, stop_pressed_at: float | None,
                  checkpoint: bool | int, elsewhere: bool = False, error_line: str = "",
                  killed: bool = False) -> RunStatus:
    """Pure: the status of a run from its events, its process and its files. `checkpoint`: whether
    a complete checkpoint exists, or its step; `killed`: the process died of SIGKILL (OOM killer,
    Force kill), which never leaves an event: interrupted, resumable, like a lost machine."""
    if alive:
        if snap.terminal is not None and snap.terminal["event"] in SAVED_STOPS:
            return RunStatus("stopping", f"{snap.terminal['event']} — state saved, process exiting…", True, False)
        if stop_pressed_at:
            waited = int(time.time() - stop_pressed_at)
            return RunStatus("stopping", f"stopping, saving state… ({waited} s)", True, False)
        if not snap.steps:
            return RunStatus("starting", "starting (loading model and data)…", True, False)
        return RunStatus("running", "running", True, False)
    if elsewhere and snap.terminal is None:
        return RunStatus("elsewhere", "started on another machine; no end recorded yet", False, False)
    end = snap.terminal
    if end is not None:
        kind = end["event"]
        if kind == Event.DONE:
            return RunStatus("done", "done", False, False)
        if kind == Event.STOPPED:
            return RunStatus("stopped", f"stopped — state saved at step {end.get('step', snap.last_step.get('step', '?'))}"
                                        " (resumable)", False, True)
        if kind == Event.PREEMPTED:
            return RunStatus("preempted", "preempted — state saved (resumable)", False, True)
        message = end.get("message") or error_line or "see the log"
        return RunStatus("error", f"error: {message}", False, bool(checkpoint))
    if killed or exit_code in KILLED_CODES:
        return _interrupted(checkpoint, "killed by SIGKILL, e.g. the OOM killer")
    if exit_code == exitcodes.STOPPED_SAVED:
        return RunStatus("stopped", "stopped — state saved (resumable)", False, True)
    if exit_code == exitcodes.BAD_CONFIG:
        return RunStatus("error", f"bad config or input: {error_line or 'see the log'}", False, bool(checkpoint))
    if exit_code is not None and exit_code != 0:
        return RunStatus("error", f"error (exit {exit_code}): {error_line or 'see the log'}", False,
                         bool(checkpoint))
    if snap.first_time is None and exit_code is None and not error_line:
        return RunStatus("new", "not started", False, False)
    return _interrupted(checkpoint, "")


def _interrupted(checkpoint: bool | int, why: str) -> RunStatus:
    how = f"{why}; " if why else ""
    if checkpoint is True:
        text = f"interrupted ({how}resumable from the last checkpoint)"
    elif checkpoint:
        text = f"interrupted ({how}resumable: resume continues from step {checkpoint})"
    else:
        text = f"interrupted ({how}resumable; no checkpoint yet: resuming starts over)"
    return RunStatus("interrupted", text, False, True)


def last_error_line(run_dir: Path) -> str:
    """The last 'error:' line the trainer printed (bad config exits before any event)."""
    path = Path(run_dir) / procs.CONSOLE_LOG
    try:
        with open(path, "rb") as fh:
            fh.seek(max(0, path.stat().st_size - 16384))
            lines = fh.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return ""
    for line in reversed(lines):
        if line.startswith("error:"):
            return line[len("error:"):].strip()
    # a crash before the trainer could report it: the exception line of the traceback
    # (the launcher's own CalledProcessError only says that the trainer failed)
    for line in reversed(lines):
        if EXCEPTION_LINE.match(line) and not line.startswith("subprocess.CalledProcessError"):
            return line.strip()
    return ""


def run_status(run_dir: Path, snap: Snapshot | None = None) -> RunStatus:
    run_dir = Path(run_dir)
    snap = snap or snapshot(run_dir)
    record = procs.read_process_record(run_dir)
    alive = procs.is_alive(record)
    exit_code = procs.read_exit(run_dir)
    error_line = last_error_line(run_dir) if not alive and (exit_code or snap.terminal is None) else ""
    killed = not alive and snap.terminal is None and exit_code not in (None, 0) and killed_by_sigkill(run_dir)
    return derive_status(snap, alive, exit_code, procs.stop_requested_at(run_dir) if alive else None,
                         has_checkpoint(run_dir), procs.on_other_host(record), error_line, killed)
