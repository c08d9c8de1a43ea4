"""Files the trainer writes get the modes the umask gives any other file.

safetensors (and everything that saves through it: diffusers, transformers, accelerate)
creates files with mode 0600, so a webui or ComfyUI running as another user could not read
a LoRA or a checkpoint. `respect_umask` gives files 0666 and folders 0777, minus the umask."""
from __future__ import annotations

import os
import threading
from pathlib import Path

_LOCK = threading.Lock()


def current_umask() -> int:
    try:  # Linux: read it without changing it
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    with _LOCK:
        mask = os.umask(0o022)
        os.umask(mask)
    return mask


def respect_umask(path: str | Path) -> None:
    """chmod a file, or a folder and everything in it, to the umask's default modes. Files that
    are executable for their owner keep their x bits (within the umask)."""
    mask = current_umask()
    path = Path(path)
    if not path.exists() or path.is_symlink():
        return
    items = [path, *path.rglob("*")] if path.is_dir() else [path]
    for item in items:
        if item.is_symlink():
            continue
        try:
            if item.is_dir() or item.stat().st_mode & 0o100:
                os.chmod(item, 0o777 & ~mask)
            else:
                os.chmod(item, 0o666 & ~mask)
        except OSError:
            pass  # not ours to change (a shared folder): leave it
