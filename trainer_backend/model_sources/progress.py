"""Download progress: huggingface_hub's progress-bar hook turned into records (bytes, speed, ETA, file),
and the two places they go: a progress line in the CLI/log, and `download` events in a run folder."""
from __future__ import annotations

import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, TextIO


@dataclass
class DownloadStatus:
    """One moment of a download, as the studio and the log show it (the `download` event's fields)."""
    repo: str
    status: str                  # planned | waiting | downloading | done
    file: str = ""
    bytes: int = 0               # downloaded so far in this download (files already cached not counted)
    total: int = 0               # to download in this download
    file_bytes: int = 0
    file_total: int = 0
    files_done: int = 0
    files_total: int = 0
    speed: float = 0.0           # bytes per second, over the last few seconds
    eta_s: float | None = None
    free_bytes: int | None = None   # planned: free space on the cache's disk
    cached_bytes: int = 0           # planned: bytes of the chosen files already in the cache

    def to_dict(self) -> dict:
        return asdict(self)


Progress = Callable[[DownloadStatus], None]


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


@dataclass
class Meter:
    """Bytes over time for one download: the speed over a sliding window and the ETA (pure arithmetic
    on the times it is given)."""
    total: int
    window_s: float = 5.0
    done: int = 0
    samples: list[tuple[float, int]] = field(default_factory=list)

    def add(self, n: int, now: float) -> None:
        self.done += n
        self.samples.append((now, self.done))
        while len(self.samples) > 2 and now - self.samples[0][0] > self.window_s:
            self.samples.pop(0)

    def speed(self) -> float:
        if len(self.samples) < 2:
            return 0.0
        (t0, b0), (t1, b1) = self.samples[0], self.samples[-1]
        return (b1 - b0) / (t1 - t0) if t1 > t0 else 0.0

    def eta_s(self) -> float | None:
        speed = self.speed()
        return max(0.0, (self.total - self.done) / speed) if speed > 0 else None


def bar_class(on_bytes: Callable[[int], None]) -> type:
    """A class huggingface_hub accepts as `tqdm_class` for one file: it reports each chunk to `on_bytes`
    and draws nothing (the reporters below draw)."""

    class ReportingBar:
        def __init__(self, *args, total=None, initial=0, **kwargs):
            self.total, self.n = total, initial

        def update(self, n=1):
            if n:
                self.n += n
                on_bytes(int(n))

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def close(self, *args, **kwargs):
            pass

        def __getattr__(self, name):  # refresh, set_description, set_postfix_str, ...: nothing to draw
            return lambda *args, **kwargs: None

    return ReportingBar


SilentBar = bar_class(lambda n: None)


class Throttled:
    """Passes a status on at most every `every_s` seconds, and always when the status or file changes."""

    def __init__(self, sink: Progress, every_s: float = 1.0, clock: Callable[[], float] = time.monotonic):
        self.sink, self.every_s, self.clock = sink, every_s, clock
        self._last = (-1e18, "", "")
        self._lock = threading.Lock()

    def __call__(self, status: DownloadStatus) -> None:
        now = self.clock()
        with self._lock:
            changed = (status.status, status.file) != self._last[1:]
            if not changed and now - self._last[0] < self.every_s:
                return
            self._last = (now, status.status, status.file)
        self.sink(status)


def status_line(s: DownloadStatus, width: int = 24) -> str:
    """`org/name  [#######.....]  1.2 GB / 3.4 GB  45.0 MB/s  ETA 48 s  (unet/model.safetensors, 3/7)`"""
    if s.status == "planned":
        return (f"{s.repo}: {human_bytes(s.total)} to download in {s.files_total} files, {human_bytes(s.cached_bytes)} "
                f"already cached; {human_bytes(s.free_bytes or 0)} free on the cache's disk")
    if s.status == "waiting":
        return f"{s.repo}: waiting for another process that is downloading it"
    if s.status == "done":
        return f"{s.repo}: downloaded {human_bytes(s.bytes)} ({s.files_total} files)"
    fraction = s.bytes / s.total if s.total else 0.0
    filled = int(round(fraction * width))
    eta = f"ETA {s.eta_s:.0f} s" if s.eta_s is not None else "ETA ?"
    return (f"{s.repo}  [{'#' * filled}{'.' * (width - filled)}]  {human_bytes(s.bytes)} / {human_bytes(s.total)}  "
            f"{human_bytes(s.speed)}/s  {eta}  ({s.file}, {s.files_done + 1}/{s.files_total})")


def printer(stream: TextIO | None = None, every_s: float = 2.0) -> Progress:
    """Progress lines for a terminal or a log file (one line each, so train.log stays readable)."""
    def show(status: DownloadStatus) -> None:
        out = stream or sys.stderr
        print(status_line(status), file=out, flush=True)
    return Throttled(show, every_s)


def logged(logger, every_s: float = 5.0) -> Progress:
    """Progress lines through a logger (the trainer's console and train.log)."""
    return Throttled(lambda status: logger.info("download: %s", status_line(status)), every_s)


def to_events(emit: Callable[..., None], every_s: float = 1.0) -> Progress:
    """`download` events (the DownloadStatus fields) through a run's `emit(kind, **fields)`."""
    from ..run.contract import Event
    return Throttled(lambda status: emit(Event.DOWNLOAD, **status.to_dict()), every_s)


def both(*sinks: Progress | None) -> Progress:
    live = [s for s in sinks if s is not None]
    return lambda status: [sink(status) for sink in live] and None
