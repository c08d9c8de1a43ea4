"""Checkpoint folders on disk: the trainer state, atomic writes, manifests, listing and pruning.

A checkpoint is written into `checkpoints/.tmp-step-XXXXXXXX`, fsynced, completed by
`manifest.json` (files, sizes, sha256, step, metrics) written last, then renamed to
`checkpoints/step-XXXXXXXX`. A folder without a valid manifest is never resumed from and is
removed by `clean_incomplete`. Pruning renames a folder away before deleting it, so a
half-deleted checkpoint is never mistaken for a complete one.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from .contract import CHECKPOINT_PREFIX, CHECKPOINTS_DIR, MANIFEST_FILE
from .file_modes import respect_umask

LOG = logging.getLogger("trainer")
MANIFEST = MANIFEST_FILE
STATE_FILE = "trainer_state.json"
FORMAT = 1
PREFIX = CHECKPOINT_PREFIX
TRANSIENT = (".tmp-", ".deleting-", ".old-", ".download-")


@dataclass
class TrainState:
    """Where the run is: enough to continue with the same next batch, plus what resume checks."""
    global_step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0        # batches of this process already consumed in `epoch`
    samples_seen: int = 0
    run_id: str = ""               # stable across resumes (webhook payloads, remote layout checks)
    num_processes: int = 1
    config: dict = field(default_factory=dict)      # the run's config (secrets stripped) when saved
    dataset_fingerprint: str = ""  # see resume.dataset_fingerprint
    plan: dict = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def from_dict(cls, data: dict) -> "TrainState":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


class CheckpointWriteError(RuntimeError):
    """A checkpoint could not be written (disk full, permissions…); the previous one is intact."""


def checkpoint_name(step: int) -> str:
    return f"{PREFIX}{step:08d}"


def step_of(path: Path | str) -> int:
    return int(Path(path).name[len(PREFIX):])


def checkpoints_dir(run_dir: Path) -> Path:
    return Path(run_dir) / CHECKPOINTS_DIR


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(folder: Path) -> None:
    """Every file, then every folder deepest first (their entries), then folder itself: after a
    power loss nothing the manifest will list can be missing or short."""
    paths = sorted(folder.rglob("*"))
    for path in paths:
        if path.is_file():
            _fsync_path(path)
    for path in sorted((p for p in paths if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        _fsync_path(path)
    _fsync_path(folder)


def write_manifest(folder: Path, step: int, metrics: dict | None = None, trigger: str = "") -> dict:
    """List every file with its size and sha256, then write manifest.json (fsynced) last."""
    files = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file() and path.name != MANIFEST:
            files[path.relative_to(folder).as_posix()] = {"size": path.stat().st_size, "sha256": sha256_file(path)}
    manifest = {"format": FORMAT, "step": step, "created": round(time.time(), 3), "trigger": trigger,
                "metrics": metrics or {}, "files": files}
    tmp = folder / (MANIFEST + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(json.dumps(manifest, indent=1))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, folder / MANIFEST)
    _fsync_path(folder)
    return manifest


def read_manifest(folder: Path) -> dict | None:
    try:
        manifest = json.loads((Path(folder) / MANIFEST).read_text(encoding="utf-8"))
        return manifest if isinstance(manifest, dict) and isinstance(manifest.get("files"), dict) else None
    except (OSError, ValueError):
        return None


def is_valid(folder: Path, verify_hashes: bool = False) -> bool:
    """Complete when the manifest exists and every listed file has its size (and hash)."""
    manifest = read_manifest(folder)
    if manifest is None:
        return False
    name = Path(folder).name
    if name.startswith(PREFIX) and name[len(PREFIX):].isdigit() and manifest.get("step") != step_of(folder):
        return False
    try:
        for rel, meta in manifest["files"].items():
            path = Path(folder) / rel
            if path.stat().st_size != meta["size"]:
                return False
            if verify_hashes and sha256_file(path) != meta["sha256"]:
                return False
        return True
    except (OSError, KeyError, TypeError):
        return False


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Valid checkpoints, oldest first."""
    root = checkpoints_dir(run_dir)
    if not root.is_dir():
        return []
    found = [p for p in root.glob(f"{PREFIX}*") if p.is_dir() and p.name[len(PREFIX):].isdigit() and is_valid(p)]
    return sorted(found, key=step_of)


def clean_incomplete(run_dir: Path) -> list[Path]:
    """Remove temporary folders and checkpoints without a valid manifest (after a crash)."""
    root = checkpoints_dir(run_dir)
    removed = []
    if not root.is_dir():
        return removed
    for p in sorted(root.iterdir()):
        if not p.is_dir():
            continue
        if p.name.startswith(TRANSIENT) or (p.name.startswith(PREFIX) and not is_valid(p)):
            LOG.warning("removing incomplete checkpoint folder %s", p)
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p)
    return removed


def delete_checkpoint(path: Path) -> None:
    """Rename away first: a folder is either complete under its name or gone."""
    doomed = path.parent / f".deleting-{path.name}"
    try:
        os.replace(path, doomed)
    except OSError:
        return
    shutil.rmtree(doomed, ignore_errors=True)


def prune(run_dir: Path, keep_steps: set[int]) -> list[int]:
    """Delete the valid checkpoints whose step is not in keep_steps; returns the deleted steps."""
    deleted = []
    for path in list_checkpoints(run_dir):
        if step_of(path) not in keep_steps:
            delete_checkpoint(path)
            deleted.append(step_of(path))
    return deleted


def checkpoint_infos(run_dir: Path, with_paths: bool = False) -> list[tuple]:
    """(step, metrics) of each complete checkpoint (sizes checked, not hashes), for the retention
    policy; (step, path, metrics) with_paths."""
    out = []
    for path in list_checkpoints(run_dir):
        metrics = (read_manifest(path) or {}).get("metrics") or {}
        out.append((step_of(path), path, metrics) if with_paths else (step_of(path), metrics))
    return out


def _any_rank_failed(accelerator, failed: bool) -> bool:
    if accelerator.num_processes == 1:
        return failed
    import torch
    flag = torch.tensor([1.0 if failed else 0.0], device=accelerator.device)
    return bool(accelerator.reduce(flag, reduction="sum").item() > 0)


def save_checkpoint(accelerator, run_dir: Path, state: TrainState, metrics: dict | None = None,
                    trigger: str = "") -> Path:
    """Every process calls this (accelerate saves each rank's RNG state); the main process
    finalises the folder. On an OSError (disk full…) on any rank, the temporary folder is
    removed and every rank raises CheckpointWriteError: the previous checkpoint stays valid."""
    root = checkpoints_dir(run_dir)
    name = checkpoint_name(state.global_step)
    final, tmp = root / name, root / f".tmp-{name}"
    error: BaseException | None = None
    # Three phases, each followed by the same all-reduce on every rank, so a failure on any
    # rank takes every rank down the same branch (no rank left waiting in a barrier).
    if accelerator.is_main_process:
        try:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        except OSError as e:
            error = e
    failed = _any_rank_failed(accelerator, error is not None)
    if not failed:
        try:
            accelerator.save_state(str(tmp))
        except Exception as e:  # torch.save/safetensors report a full disk as RuntimeError & co
            error = e
        failed = _any_rank_failed(accelerator, error is not None)
    if not failed:
        if accelerator.is_main_process:
            try:
                _finalise(tmp, final, state, metrics, trigger)
            except Exception as e:
                error = e
        failed = _any_rank_failed(accelerator, error is not None)
    if failed:
        if accelerator.is_main_process:
            shutil.rmtree(tmp, ignore_errors=True)
        previous = [p for p in list_checkpoints(run_dir) if p != final]
        kept = f"the previous checkpoint {previous[-1]} is intact" if previous else "no earlier checkpoint exists"
        reason = f"{type(error).__name__}: {error}" if error else "another process failed to write its part"
        raise CheckpointWriteError(f"could not write checkpoint {final} ({reason}; {_free_space(root)}); {kept}. "
                                   "Free disk space (or fix the folder's permissions) and start the run again "
                                   "to resume.")
    return final


def _free_space(folder: Path) -> str:
    """'N MB free on the disk' (write errors from torch.save do not say that the disk is full)."""
    try:
        return f"{shutil.disk_usage(folder).free / 1e6:,.0f} MB free on that disk"
    except OSError:
        return "free space unknown"


def _finalise(tmp: Path, final: Path, state: TrainState, metrics: dict | None, trigger: str) -> None:
    """Trainer state, fsync, manifest last, then the rename that makes the checkpoint exist."""
    (tmp / STATE_FILE).write_text(state.to_json(), encoding="utf-8")
    _fsync_tree(tmp)
    write_manifest(tmp, state.global_step, metrics, trigger)
    respect_umask(tmp)   # safetensors/accelerate write 0600
    old = final.parent / f".old-{final.name}"
    if final.exists():  # only after a crash between two saves of one step
        os.replace(final, old)
    os.replace(tmp, final)
    _fsync_path(final.parent)         # the rename itself
    _fsync_path(final.parent.parent)  # checkpoints/ in the run folder (new at the first save)
    shutil.rmtree(old, ignore_errors=True)


def load_state(path: Path) -> TrainState:
    """The checkpoint's trainer_state.json, each field of the type TrainState declares (a damaged
    or hand-edited file is refused naming it and the field, as a damaged manifest is)."""
    from ..errors import ConfigError
    file = Path(path) / STATE_FILE
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ConfigError(f"{file}: not readable JSON ({e}); this checkpoint cannot be resumed") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{file}: not a trainer state (a JSON object); this checkpoint cannot be resumed")
    for f in fields(TrainState):
        if f.name not in data:
            continue
        value, kind = data[f.name], _KINDS[str(f.type)]
        if kind is int:
            ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2 ** 63
        else:
            ok = isinstance(value, kind)
        if not ok:
            what = "a whole number ≥ 0" if kind is int else "text" if kind is str else "a JSON object"
            raise ConfigError(f"{file}: {f.name} must be {what}, got {value!r:.60}; this checkpoint cannot be "
                              "resumed (choose another in checkpoints.resume, or \"none\")")
    return TrainState.from_dict(data)


_KINDS = {"int": int, "str": str, "dict": dict}  # TrainState's field annotations (strings, see __future__)
