"""Which folder a run may write into, and what deleting a run may remove.

A run folder (<output.dir>/<output.name>) is new, or already a run: the first start writes
`MARKER` into it and later starts find it. A folder that holds anything else (the user's
documents, another program's output) is refused with one line naming output.name, so neither
the trainer nor the studio's Delete ever touches files a run did not create. A run made before
the marker existed is adopted when everything in it has a run's file names and it holds
config.toml and events.jsonl, or only this trainer's checkpoints.

Deleting a run (`delete_run`) needs the marker and removes only entries with the names a run
writes (run/contract.py's files, checkpoints, samples, outputs named after output.name…); the
folder itself goes only when nothing else is left in it.

Pure (no torch): the trainer, the CLI and the studio all call it.
"""
from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

from . import contract
from ..config.base import ConfigError

MARKER = contract.RUN_MARKER
SYSTEM_ROOTS = ("/proc", "/sys", "/dev")
_FILES = {contract.CONFIG_FILE, contract.COMMAND_FILE, contract.EVENTS_FILE, contract.LOG_FILE, contract.PROCESS_FILE,
          contract.EXIT_FILE, contract.CONSOLE_LOG, contract.TENSORBOARD_LOG, MARKER, contract.LOCK_FILE,
          "accelerate_config.json", "deepspeed.json"}
_FOLDERS = {contract.TENSORBOARD_DIR, contract.CONTROL_DIR, contract.CHECKPOINTS_DIR, contract.SAMPLES_DIR,
            "class_images", "wandb", ".cache"}


class RunFolderError(ConfigError):
    """The run folder cannot be used (the message names the option): exit 2, like any bad config."""


def written_by_a_run(entry: Path, name: str) -> bool:
    """Whether a run folder's entry has a name that a run writes (its outputs start with output.name)."""
    n = entry.name
    if n.endswith(".tmp"):
        n = n[:-4]
    return (n in _FILES or n in _FOLDERS or n.startswith(f"{contract.CHECKPOINTS_DIR}-replaced-")
            or (bool(name) and n.startswith(name)))


def has_marker(run_dir: Path) -> bool:
    try:
        return json.loads((Path(run_dir) / MARKER).read_text(encoding="utf-8")).get("kind") == contract.RUN_KIND
    except (OSError, ValueError, AttributeError):
        return False


def is_run_folder(run_dir: Path) -> bool:
    """A run's folder: it has the marker, or (made before markers) config.toml and events.jsonl and
    nothing but what runs write."""
    run_dir = Path(run_dir)
    try:
        if not run_dir.is_dir():
            return False
        if has_marker(run_dir):
            return True
        entries = list(run_dir.iterdir())
    except (OSError, ValueError):
        return False
    names = {e.name for e in entries}
    if not entries or not all(written_by_a_run(e, run_dir.name) for e in entries):
        return False
    return {contract.CONFIG_FILE, contract.EVENTS_FILE} <= names or _only_our_checkpoints(run_dir)


def _only_our_checkpoints(run_dir: Path) -> bool:
    """checkpoints/ holding nothing but step-… folders with this trainer's manifest (a run folder
    rebuilt from a copied or downloaded checkpoint)."""
    from .checkpoint_files import PREFIX, read_manifest
    folder = run_dir / contract.CHECKPOINTS_DIR
    try:
        steps = list(folder.iterdir()) if folder.is_dir() else []
    except OSError:
        return False
    return bool(steps) and all(p.name.startswith(PREFIX) and "format" in (read_manifest(p) or {}) for p in steps)


def _nearest_existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def run_folder_problem(run_dir: Path | str) -> str:
    """'' when a run may write into run_dir; else one line naming the option to change."""
    raw = str(run_dir)
    if "\0" in raw:
        return "output.dir: contains a NUL byte; no file name can hold one"
    run_dir = Path(raw).expanduser().absolute()
    for root in SYSTEM_ROOTS:
        if run_dir.is_relative_to(root):
            return f"output.dir: {run_dir.parent} is inside {root}, a system folder; choose a folder of yours"
    try:
        if run_dir.exists() and not run_dir.is_dir():
            return f"output.name: {run_dir} is a file, not a folder; choose another output.name or output.dir"
        existing = _nearest_existing(run_dir.parent)
        if not existing.is_dir():
            return f"output.dir: {existing} is a file, not a folder"
        if not run_dir.exists() and not os.access(existing, os.W_OK | os.X_OK):
            return f"output.dir: {existing} is not writable (permissions or a read-only disk)"
        if run_dir.is_dir():
            if not os.access(run_dir, os.W_OK | os.X_OK):
                return f"output.name: the run folder {run_dir} is not writable (permissions or a read-only disk)"
            if is_run_folder(run_dir):
                return ""
            # only what runs and their launcher write (control files, strategy files, a copied
            # checkpoint): nothing of the user's is at risk
            others = sorted(e.name for e in run_dir.iterdir() if not written_by_a_run(e, run_dir.name))
            if others:
                shown = ", ".join(others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3 else "")
                return (f"output.name: {run_dir} already exists and is not a run folder (it holds {shown}); "
                        f"a run writes only into a new folder or its own: choose another output.name or output.dir")
    except OSError as e:
        return f"output.dir: {run_dir} cannot be used ({e.strerror or e})"
    return ""


def claim(run_dir: Path | str, name: str = "") -> Path:
    """Create the run folder (or check the existing one is a run) and write the marker once.
    Raises RunFolderError with one line naming the option."""
    problem = run_folder_problem(run_dir)
    if problem:
        raise RunFolderError(problem)
    run_dir = Path(run_dir)
    created = not run_dir.exists()
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        if not has_marker(run_dir):
            tmp = run_dir / (MARKER + ".tmp")
            tmp.write_text(json.dumps({"kind": contract.RUN_KIND, "name": name or run_dir.name,
                                       "created": round(time.time(), 3), "new_folder": created}), encoding="utf-8")
            os.replace(tmp, run_dir / MARKER)
    except OSError as e:
        raise RunFolderError(f"output.dir: cannot create the run folder {run_dir} ({e.strerror or e})") from None
    return run_dir


def delete_run(run_dir: Path) -> list[str]:
    """Remove what the run wrote, the marker last; returns the names of entries left in place (not
    written by a run). The folder itself is removed when it ends up empty. Raises RunFolderError
    without the marker."""
    run_dir = Path(run_dir)
    if not has_marker(run_dir):
        raise RunFolderError(f"{run_dir} has no run marker ({MARKER}): it was not created by a run of this "
                             "version, so nothing in it is deleted; remove it by hand if you are sure")
    kept = []
    for entry in sorted(run_dir.iterdir()):
        if entry.name == MARKER:
            continue
        if not written_by_a_run(entry, run_dir.name):
            kept.append(entry.name)
        elif entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    (run_dir / MARKER).unlink()   # what is left (if anything) is no longer a run's
    if not kept:
        run_dir.rmdir()
    return kept
