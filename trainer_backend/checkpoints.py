"""Atomic checkpoints of the complete training state, retention, and finding one to resume.

A checkpoint is written into `checkpoints/.tmp-step-XXXXXXXX`, fsynced, completed by
`manifest.json` (files, sizes, sha256, step) written last, then renamed to
`checkpoints/step-XXXXXXXX`. A folder without a valid manifest is never resumed from.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path

LOG = logging.getLogger("trainer")
MANIFEST = "manifest.json"
STATE_FILE = "trainer_state.json"


@dataclass
class TrainState:
    """Where the run is: enough to continue with the same next batch."""
    global_step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0        # batches of this process already consumed in `epoch`
    samples_seen: int = 0
    config_hash: str = ""
    safe_options: dict = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)


def checkpoint_name(step: int) -> str:
    return f"step-{step:08d}"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _fsync_tree(folder: Path) -> None:
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            with open(path, "rb") as f:
                os.fsync(f.fileno())
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_manifest(folder: Path, step: int) -> dict:
    files = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file() and path.name != MANIFEST:
            rel = path.relative_to(folder).as_posix()
            files[rel] = {"size": path.stat().st_size, "sha256": _sha256(path)}
    manifest = {"step": step, "files": files}
    tmp = folder / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=1))
    os.replace(tmp, folder / MANIFEST)
    return manifest


def is_valid(folder: Path, verify_hashes: bool = False) -> bool:
    """Complete when the manifest exists and every listed file has its size (and hash)."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
        for rel, meta in manifest["files"].items():
            path = folder / rel
            if path.stat().st_size != meta["size"]:
                return False
            if verify_hashes and _sha256(path) != meta["sha256"]:
                return False
        return True
    except (OSError, ValueError, KeyError, TypeError):
        return False


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Valid checkpoints, oldest first."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found = [p for p in root.glob("step-*") if p.is_dir() and is_valid(p)]
    return sorted(found, key=lambda p: p.name)


def clean_incomplete(run_dir: Path) -> None:
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return
    for p in root.iterdir():
        if p.is_dir() and (p.name.startswith(".tmp-") or not is_valid(p)):
            LOG.warning("removing incomplete checkpoint %s", p)
            shutil.rmtree(p, ignore_errors=True)


def save_checkpoint(accelerator, run_dir: Path, state: TrainState, keep_last: int) -> Path:
    """Every process calls this (accelerate saves each rank's RNG state); the main process
    finalises the folder and prunes old ones."""
    root = Path(run_dir) / "checkpoints"
    final = root / checkpoint_name(state.global_step)
    tmp = root / f".tmp-{checkpoint_name(state.global_step)}"
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        (tmp / STATE_FILE).write_text(state.to_json())
        _fsync_tree(tmp)
        write_manifest(tmp, state.global_step)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        prune(run_dir, keep_last)
    accelerator.wait_for_everyone()
    return final


def prune(run_dir: Path, keep_last: int) -> None:
    for old in list_checkpoints(run_dir)[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)


def find_resume(run_dir: Path, resume: str) -> Path | None:
    """`auto`: the latest valid local checkpoint (or None); `none`; or an explicit folder."""
    if resume == "none":
        return None
    if resume == "auto":
        found = list_checkpoints(run_dir)
        return found[-1] if found else None
    path = Path(resume)
    if not is_valid(path):
        from .config import ConfigError
        raise ConfigError(f"checkpoints.resume: {path} is not a complete checkpoint (no valid manifest.json)")
    return path


def load_state(path: Path) -> TrainState:
    return TrainState(**json.loads((Path(path) / STATE_FILE).read_text()))
