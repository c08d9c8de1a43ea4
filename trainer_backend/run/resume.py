"""Resuming: which checkpoint (local, remote or explicit), whether the current config may
continue it, and carrying safe option changes (a new LR…) into the loaded optimizer.

Safe changes (more epochs, a new LR, new sample prompts, …) are allowed and logged. Unsafe
ones are refused with a ConfigError naming the option: the loaded weights or optimizer state
would not fit (rank, network type, optimizer), the run would silently become another one (base
model, dataset contents) or "continue with the same next batch" would lose its meaning (batch
size, seed, bucketing, number of processes).
"""
from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .checkpoint_files import TrainState, is_valid, list_checkpoints, step_of
from ..config import ConfigError, TrainConfig, field_info, sections, strip_secrets, to_dict
from ..config.base import RESUME_REASONS

LOG = logging.getLogger("trainer")

# What changing each option means for a resumed run is declared on the option itself (config/base.py's
# F(resume=...)): safe, ignored (where things live or are reported), unsafe with a reason, or unsafe
# only where bucketing groups the batches.


def resume_rule(key: str) -> tuple[str, str]:
    """(kind, reason) of a dotted option: kind safe | ignored | unsafe | unsafe_if_bucketing."""
    section, _, name = key.partition(".")
    if section == "version":
        return "ignored", ""
    sections_ = sections()
    if section not in sections_ or name not in sections_[section].model_fields:
        return "safe", ""
    kind, _, reason = field_info(section, name)["resume"].partition(":")
    return kind, RESUME_REASONS.get(reason, "")


OPTIMIZER_HPARAMS = ("weight_decay", "betas", "eps", "momentum")


@dataclass
class ResumeSource:
    kind: str                 # "local" | "remote"
    step: int
    path: Path | None = None  # local folder
    url: str = ""             # remote folder, s3://…/step-XXXXXXXX/


def dataset_fingerprint(scan) -> str:
    """'<images>:<sha256>' over each image's folder, name, size, caption, repeats and class
    flag (and a paired image's control image: its name and size), in dataset order (the order the
    sampler's indices refer to). Folder locations are left out so a moved dataset (or control folder)
    still matches; bucket shapes are config (resolution, bucket_*)."""
    h = hashlib.sha256()
    groups = getattr(scan, "groups", [])
    for item in scan.items:
        group = groups[item.group] if item.group < len(groups) else None
        size = _size(item.path)
        h.update(repr((_relative(item.path, group), size, item.caption, getattr(group, "repeats", 1),
                       item.is_class)).encode())
        control = getattr(item, "control", None)
        if control is not None:  # a paired image: its control images are part of what is trained
            root = getattr(getattr(group, "spec", None), "control_root", None)
            h.update(repr(("control", _relative(control, None, root), _size(control))).encode())
            for extra in getattr(item, "extra_controls", ()):  # further references (none: the hash as before)
                h.update(repr(("control", _relative(extra, None, root), _size(extra))).encode())
    h.update(repr(getattr(scan, "class_samples", 0)).encode())
    return f"{len(scan.items)}:{h.hexdigest()[:32]}"


def _size(path) -> int:
    try:
        return Path(path).stat().st_size
    except OSError:
        return -1


def _relative(path, group, root=None) -> str:
    """The image's path inside its subset (so N_concept folder names count, the root's does not), or
    inside `root` when given (a control image in its control folder)."""
    root = root or getattr(getattr(group, "spec", None), "root", None)
    try:
        return Path(path).relative_to(root).as_posix() if root else Path(path).name
    except ValueError:
        return Path(path).name


def _flatten(data: dict, prefix: str = "") -> dict[str, Any]:
    out = {}
    for k, v in data.items():
        if isinstance(v, dict) and not prefix:
            out.update(_flatten(v, f"{k}."))
        else:
            out[prefix + k] = v
    return out


def changed_options(saved: dict, current: dict) -> list[tuple[str, Any, Any]]:
    """(dotted key, old, new) for every option that differs (keys known to both)."""
    old, new = _flatten(saved), _flatten(current)
    return [(k, old[k], new[k]) for k in sorted(old.keys() & new.keys()) if old[k] != new[k]]


def check_compatible(state: TrainState, cfg: TrainConfig, fingerprint: str, num_processes: int,
                     where: str) -> list[str]:
    """Raise ConfigError naming the option when the checkpoint cannot be continued with cfg;
    otherwise return the safe changes as readable lines."""
    hint = (f"; to start a new run instead, change output.name or set checkpoints.resume=\"none\" "
            f"(checkpoint: {where})")
    if state.num_processes and state.num_processes != num_processes:
        raise ConfigError(f"hardware.num_processes: the checkpoint was written by {state.num_processes} "
                          f"process(es), this run has {num_processes}: each process's data position and random "
                          f"state cannot be carried over{hint}")
    if state.dataset_fingerprint and fingerprint and state.dataset_fingerprint != fingerprint:
        then, now = state.dataset_fingerprint.split(":")[0], fingerprint.split(":")[0]
        what = f"{then} images then, {now} now" if then != now else "the same number of images, but files, " \
                                                                   "captions or control images differ"
        raise ConfigError(f"dataset.path: the dataset's contents changed since the checkpoint ({what}){hint}")
    if not state.config:
        LOG.warning("the checkpoint does not record its config: option changes cannot be checked")
        return []
    from ..config.caching import with_auto_caching
    current = strip_secrets(to_dict(with_auto_caching(cfg)))  # as the trainer resolves it (dataset.cache_auto)
    old_model, new_model = state.config.get("model", {}).get("path", ""), cfg.model.path
    if old_model and Path(old_model).name != Path(new_model).name:
        raise ConfigError(f"model.path: the checkpoint was trained on {Path(old_model).name}, this config uses "
                          f"{Path(new_model).name}{hint}")
    safe = []
    for key, old, new in changed_options(state.config, current):
        if key == "precision.mixed" and "fp16" in (old, new):
            raise ConfigError(f"precision.mixed: changed from {old} to {new}; fp16's gradient-scaler state "
                              f"cannot be carried over (bf16 <-> no is fine){hint}")
        kind, reason = resume_rule(key)
        bucketing = state.config.get("dataset", {}).get("bucketing") or cfg.dataset.bucketing
        if kind == "unsafe_if_bucketing" and not bucketing:
            kind = "safe"  # without buckets every image is cropped alike
        if kind.startswith("unsafe"):
            raise ConfigError(f"{key}: changed from {old!r} to {new!r} since the checkpoint: {reason}{hint}")
        if kind == "safe":
            safe.append(f"{key}: {old!r} -> {new!r}")
    if old_model and old_model != new_model:
        safe.append(f"model.path: {old_model} -> {new_model} (same file name)")
    return safe


def find_local(run_dir: Path) -> Path | None:
    """The newest local checkpoint whose files match their manifest's sha256 (a corrupt one is
    reported and skipped)."""
    for path in reversed(list_checkpoints(run_dir)):
        if is_valid(path, verify_hashes=True):
            return path
        LOG.warning("checkpoint %s does not match its manifest (sha256); skipping it", path)
    return None


def explicit_local(resume: str) -> ResumeSource:
    path = Path(resume).expanduser()
    if not path.is_dir() or not is_valid(path, verify_hashes=True):
        raise ConfigError(f"checkpoints.resume: {path} is not a complete checkpoint (no valid manifest.json, or "
                          "files that do not match it)")
    return ResumeSource("local", step_of(path) if path.name[5:].isdigit() else -1, path=path)


# ----------------------------------------------------------------------------- optimizer settings

def capture_hparams(optimizer, lr_scheduler) -> dict:
    """The freshly built (current config's) LR bases and optimizer settings, before a load."""
    return {"base_lrs": list(getattr(lr_scheduler, "base_lrs", [])),
            "groups": [{k: g[k] for k in OPTIMIZER_HPARAMS if k in g} for g in optimizer.param_groups]}


def restore_hparams(optimizer, lr_scheduler, fresh: dict) -> list[str]:
    """Loading a checkpoint restores the old LR and optimizer settings with the optimizer's
    state; put the current config's back where they differ, keeping the schedule's position
    (the LR is rescaled by new base / old base). Returns what changed, for the log."""
    changes = []
    bases = getattr(lr_scheduler, "base_lrs", None)
    if bases is not None and fresh["base_lrs"] and list(bases) != fresh["base_lrs"]:
        for i, (group, old, new) in enumerate(zip(optimizer.param_groups, list(bases), fresh["base_lrs"])):
            if old == new:
                continue
            group["lr"] = group["lr"] * (new / old) if old else new
            group["initial_lr"] = new
            changes.append(f"param group {group.get('name', i)}: base lr {old:g} -> {new:g}")
        lr_scheduler.base_lrs = list(fresh["base_lrs"])
        lr_scheduler._last_lr = [g["lr"] for g in optimizer.param_groups]
    for group, values in zip(optimizer.param_groups, fresh["groups"]):
        for k, v in values.items():
            if group.get(k) != v and not (isinstance(v, tuple) and tuple(group.get(k, ())) == v):
                changes.append(f"param group {group.get('name', '?')}: {k} {group.get(k)} -> {v}")
                group[k] = v
    return changes
