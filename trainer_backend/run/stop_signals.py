"""Graceful stop and "save now" requests from signals or control files.

SIGTERM/SIGINT: finish the current optimizer step, save, exit STOPPED_SAVED (75). A second
one while the step is still running exits at once (exit 130) — but repeats within
`REPEAT_WINDOW_S` of the first count as the same request: a launcher that forwards the signal it
got (torchrun/accelerate forward SIGTERM/SIGINT to every rank) or a shutdown that signals every
process would otherwise turn one request into "exit without saving". Once the stop checkpoint is
being written (`protect`), further signals are only acknowledged: the rest of the stop sequence
(save, the bounded wait for uploads, cloud.final_wait_s) runs to its end and exits 75.
Before the loop installs these handlers (imports, model loading, caching) and after it removed
them, `stop_outside_the_loop` turns SIGTERM/SIGINT into `StartupStop`: the CLI writes a
`stopped`/`preempted` event and exits 75 (nothing was in progress; the last checkpoint stands).
SIGUSR1 or <run>/control/save_now: save a checkpoint and go on.
<run>/control/stop (written by the GUI before its SIGTERM) marks the stop as user-requested
("stopped") rather than a preemption ("preempted").

Multi-process runs: each rank has its own flags (a signal may reach one rank only, or reach
them at different steps); `agree` sums them over all ranks after every optimizer step, so all
ranks stop or save at the same step. Control files are read by the main process only.
"""
from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from pathlib import Path

from .contract import CONTROL_DIR, EVENTS_FILE, SAVED_STOPS, TERMINAL, Control
from .exitcodes import STOPPED_SAVED

LOG = logging.getLogger("trainer")
REPEAT_WINDOW_S = 1.0
EXIT_IMMEDIATE = 130


class StopSignals:
    def __init__(self, run_dir: Path, is_main: bool = True):
        self.control = Path(run_dir) / CONTROL_DIR
        self.is_main = is_main
        self.stop_requested = False
        self.save_requested = False
        self.protected = False
        self._first_signal_at = 0.0
        self._previous = {}
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._previous[sig] = signal.signal(sig, self._on_stop)
        if hasattr(signal, "SIGUSR1"):
            self._previous[signal.SIGUSR1] = signal.signal(signal.SIGUSR1, self._on_save)

    def _on_stop(self, signum, frame):
        now = time.monotonic()
        if self.protected:
            os.write(2, b"already stopping: the stop checkpoint is being saved (and uploaded); exiting after that\n")
            return
        if self.stop_requested:
            if now - self._first_signal_at < REPEAT_WINDOW_S:
                return  # the same request arriving twice (forwarded by a launcher)
            os.write(2, b"second stop signal: exiting now without saving\n")
            os._exit(EXIT_IMMEDIATE)
        self.stop_requested = True
        self._first_signal_at = now
        # logging from a signal handler can deadlock on the handler's lock: write directly
        os.write(2, f"stop requested (signal {signum}): finishing this step and saving\n".encode())

    def protect(self) -> None:
        """The stop checkpoint is being written: from now on a repeated signal cannot cut the stop
        sequence short (its wait for uploads is bounded by cloud.final_wait_s)."""
        self.protected = True

    def _on_save(self, signum, frame):
        self.save_requested = True

    def take_save_request(self) -> bool:
        """A pending save request (signal, or the control file on the main process), consumed."""
        requested, self.save_requested = self.save_requested, False
        if self.is_main:
            flag = self.control / Control.SAVE_NOW.value
            if flag.exists():
                flag.unlink(missing_ok=True)
                requested = True
        return requested

    def user_requested(self) -> bool:
        return (self.control / Control.STOP.value).exists()

    def agree(self, accelerator, *flags: bool) -> list[bool]:
        """All ranks see the same flags (any rank's request counts), so they act together."""
        if accelerator.num_processes == 1:
            return list(flags)
        import torch
        t = torch.tensor([float(f) for f in flags], device=accelerator.device)
        t = accelerator.reduce(t, reduction="sum")
        return [bool(v > 0) for v in t.tolist()]

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}


class StartupStop(BaseException):
    """SIGTERM/SIGINT outside the training loop (start-up: imports, model loading, caching).
    A BaseException, like KeyboardInterrupt, so no `except Exception` swallows it."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def stop_outside_the_loop():
    """SIGTERM/SIGINT raise StartupStop while this is active and the loop's StopSignals is not
    (StopSignals takes the signals over and gives them back)."""
    def on_signal(signum, frame):
        raise StartupStop(signum)
    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _events(run_dir: Path) -> list[str]:
    try:
        return (Path(run_dir) / EVENTS_FILE).read_text(encoding="utf-8").splitlines()
    except OSError:
        return []


def event_line_count(run_dir: Path) -> int:
    """Lines in the run's events.jsonl now (a launch looks only at what it adds)."""
    return len(_events(run_dir))


def launched_exit_code(code: int, run_dir: Path, events_before: int) -> int:
    """`accelerate launch` (and torchrun) exit 1 whenever a rank exits non-zero, so a rank's
    "stopped, state saved" (75) arrives as 1: restore it when this launch's events end with
    `stopped` or `preempted`."""
    if code in (0, STOPPED_SAVED):
        return code
    import json
    for line in reversed(_events(run_dir)[events_before:]):
        try:
            kind = json.loads(line).get("event")
        except ValueError:
            continue
        if kind in SAVED_STOPS:
            return STOPPED_SAVED
        if kind in TERMINAL:
            break
    return code
