"""Run-directory outputs that describe a run as it goes: events.jsonl, train.log, TensorBoard.

Only the main process writes (the others get a disabled RunEvents), so a multi-process
run produces each line once. events.jsonl is flushed per line: the GUI tails it.
"""
from __future__ import annotations

import json
import logging
import math
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, Protocol

from .contract import EVENTS_FILE, LOG_FILE, TENSORBOARD_DIR, Event
from . import library_noise

LOG = logging.getLogger("trainer")


class EventSink(Protocol):
    """Receives every event record of a run (cloud uploads, webhooks). `handle` must not block;
    `close` may wait up to its own bounded time (it runs when the run's RunEvents closes)."""
    def handle(self, record: dict) -> None: ...
    def close(self) -> None: ...


_SINKS: dict[Path, list[EventSink]] = {}
_SINKS_LOCK = threading.Lock()


def attach_sink(run_dir: Path, sink: EventSink) -> None:
    """Route the events of the run in run_dir to sink too (main process; in order of attachment)."""
    with _SINKS_LOCK:
        _SINKS.setdefault(Path(run_dir).resolve(), []).append(sink)


def close_sinks(run_dir: Path) -> None:
    """Close and detach the run's sinks, in the order they were attached."""
    with _SINKS_LOCK:
        sinks = _SINKS.pop(Path(run_dir).resolve(), [])
    for sink in sinks:
        try:
            sink.close()
        except Exception:  # a broken sink must not hide the run's own outcome
            LOG.exception("closing %s failed", type(sink).__name__)


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no NaN/inf; keep it visible as text
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


class RunEvents:
    """Appends events to <run>/events.jsonl and scalars to <run>/tb (main process only)."""

    def __init__(self, run_dir: Path, enabled: bool = True, tensorboard: bool = True):
        self.enabled = enabled
        self.run_dir = Path(run_dir)
        self._fd: int | None = None
        self._write_error = ""
        self._lock = threading.Lock()  # background uploaders emit too
        self._sink_key = self.run_dir.resolve()
        self._tb = None
        if not enabled:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.run_dir / EVENTS_FILE, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
                self._tb = SummaryWriter(str(self.run_dir / TENSORBOARD_DIR))
            except ImportError:  # tensorboard is a dependency; keep training if it is broken
                LOG.warning("TensorBoard is not available; scalars go to events.jsonl only")

    def emit(self, event: Event | str, **fields: Any) -> None:
        """One events.jsonl line; `event` must be a kind of run/contract.py (ValueError otherwise)."""
        kind = Event(event).value
        if not self.enabled:
            return
        record = {"event": kind, "time": round(time.time(), 3), **_jsonable(fields)}
        with self._lock:
            if self._fd is not None:
                self._append((json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8"))
        with _SINKS_LOCK:
            sinks = list(_SINKS.get(self._sink_key, []))
        for sink in sinks:
            try:
                sink.handle(record)
            except Exception:
                LOG.exception("event sink %s failed", type(sink).__name__)

    def _append(self, line: bytes) -> None:
        """One whole line or nothing: a single write of the full line; a short write (disk full, a
        file-size limit) is cut back to where the line began, so readers never see half a line."""
        size = os.fstat(self._fd).st_size
        try:
            written = os.write(self._fd, line)
            if written == len(line):
                return
            error = f"only {written} of {len(line)} bytes written"
        except OSError as e:
            error = e.strerror or str(e)
        try:
            os.ftruncate(self._fd, size)
        except OSError:
            pass
        if not self._write_error:  # once: the console and train.log say it, the run goes on
            self._write_error = error
            LOG.warning("%s: cannot append events (%s); later events are lost until there is room",
                        self.run_dir / EVENTS_FILE, error)

    def scalars(self, step: int, **values: float) -> None:
        if self._tb is not None:
            for name, value in values.items():
                self._tb.add_scalar(name, value, step)

    def image(self, tag: str, image_hwc, step: int) -> None:
        """An RGB image (H, W, 3 uint8 array) to TensorBoard, e.g. sample images."""
        if self._tb is not None:
            self._tb.add_image(tag, image_hwc, step, dataformats="HWC")

    def close(self) -> None:
        """Close the sinks first (they may still emit, e.g. the last `upload` events), then the files."""
        if self.enabled:
            close_sinks(self.run_dir)
        if self._tb is not None:
            self._tb.flush()
            self._tb.close()
            self._tb = None
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


def setup_logging(run_dir: Path | None, main_process: bool) -> None:
    """Console logging everywhere; <run>/train.log on the main process."""
    root = logging.getLogger()
    root.setLevel(logging.INFO)
    for handler in list(root.handlers):
        root.removeHandler(handler)
    fmt = logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%H:%M:%S")
    console = logging.StreamHandler(sys.stderr)
    console.setFormatter(fmt)
    console.setLevel(logging.INFO if main_process else logging.WARNING)
    root.addHandler(console)
    file_handler = None
    if main_process and run_dir is not None:
        run_dir.mkdir(parents=True, exist_ok=True)
        file_handler = _LogFile(run_dir / LOG_FILE, encoding="utf-8")
        file_handler.setFormatter(fmt)
        root.addHandler(file_handler)
    library_noise.install(console, file_handler)   # known-harmless library warnings: train.log's DEBUG only
    for noisy in ("PIL", "urllib3", "filelock", "matplotlib", "h5py"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


class _LogFile(logging.FileHandler):
    """train.log. A record it cannot write (disk full) is one line on stderr, once, not logging's
    traceback for every record; the console keeps the log."""
    failed = False

    def handleError(self, record: logging.LogRecord) -> None:
        if not self.failed:
            self.failed = True
            error = sys.exc_info()[1]
            reason = getattr(error, "strerror", None) or error or "unknown error"
            print(f"warning: {self.baseFilename}: cannot write the log ({reason}); it continues on this console only",
                  file=sys.stderr)
