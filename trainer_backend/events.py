"""Run-directory outputs that describe a run as it goes: events.jsonl, train.log, TensorBoard.

Only the main process writes (the others get a disabled RunEvents), so a multi-process
run produces each line once. events.jsonl is flushed per line: the GUI tails it.
"""
from __future__ import annotations

import json
import logging
import math
import sys
import time
from pathlib import Path
from typing import Any

LOG = logging.getLogger("trainer")


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
        self._file = None
        self._tb = None
        if not enabled:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._file = open(self.run_dir / "events.jsonl", "a", encoding="utf-8")
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
                self._tb = SummaryWriter(str(self.run_dir / "tb"))
            except ImportError:  # tensorboard is a dependency; keep training if it is broken
                LOG.warning("TensorBoard is not available; scalars go to events.jsonl only")

    def emit(self, event: str, **fields: Any) -> None:
        if not self.enabled:
            return
        record = {"event": event, "time": round(time.time(), 3), **_jsonable(fields)}
        self._file.write(json.dumps(record, ensure_ascii=False) + "\n")
        self._file.flush()

    def scalars(self, step: int, **values: float) -> None:
        if self._tb is not None:
            for name, value in values.items():
                self._tb.add_scalar(name, value, step)

    def image(self, tag: str, image_hwc, step: int) -> None:
        """An RGB image (H, W, 3 uint8 array) to TensorBoard, e.g. sample images."""
        if self._tb is not None:
            self._tb.add_image(tag, image_hwc, step, dataformats="HWC")

    def close(self) -> None:
        if self._tb is not None:
            self._tb.flush()
            self._tb.close()
            self._tb = None
        if self._file is not None:
            self._file.close()
            self._file = None


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
    if main_process and run_dir is not None:
        run_dir.mkdir(parents=True, exist_ok=True)
        file_handler = logging.FileHandler(run_dir / "train.log", encoding="utf-8")
        file_handler.setFormatter(fmt)
        root.addHandler(file_handler)
    for noisy in ("PIL", "urllib3", "filelock", "matplotlib", "h5py"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
