"""Graceful stop and "save now" requests from signals or control files.

SIGTERM/SIGINT: finish the current optimizer step, save, exit STOPPED_SAVED. A second one
exits at once. SIGUSR1 or <run>/control/save_now: save a checkpoint and go on.
<run>/control/stop (written by the GUI before its SIGTERM) marks the stop as user-requested
("stopped") rather than a preemption ("preempted").
"""
from __future__ import annotations

import logging
import os
import signal
from pathlib import Path

import torch

LOG = logging.getLogger("trainer")


class StopSignals:
    def __init__(self, run_dir: Path):
        self.control = Path(run_dir) / "control"
        self.stop_requested = False
        self.save_requested = False
        self._previous = {}
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._previous[sig] = signal.signal(sig, self._on_stop)
        if hasattr(signal, "SIGUSR1"):
            self._previous[signal.SIGUSR1] = signal.signal(signal.SIGUSR1, self._on_save)

    def _on_stop(self, signum, frame):
        if self.stop_requested:
            LOG.error("second stop signal: exiting now without saving")
            os._exit(130)
        self.stop_requested = True
        LOG.warning("stop requested (signal %s): finishing this step and saving", signum)

    def _on_save(self, signum, frame):
        self.save_requested = True

    def take_save_request(self) -> bool:
        flag = self.control / "save_now"
        requested = self.save_requested or flag.exists()
        if flag.exists():
            flag.unlink(missing_ok=True)
        self.save_requested = False
        return requested

    def user_requested(self) -> bool:
        return (self.control / "stop").exists()

    def agree(self, accelerator, *flags: bool) -> list[bool]:
        """All ranks see the same flags (any rank's request counts), so they stop together."""
        if accelerator.num_processes == 1:
            return list(flags)
        t = torch.tensor([float(f) for f in flags], device=accelerator.device)
        t = accelerator.reduce(t, reduction="sum")
        return [bool(v > 0) for v in t.tolist()]

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
