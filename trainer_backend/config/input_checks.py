"""Cheap looks at the inputs a config names, run with the other file checks (config/checks.py) by the
form, Start, `validate` and the trainer alike: a dataset folder with no image in it, a model file whose
header is not a safetensors header. Both are bounded (a few thousand folder entries, one header read) so
the form can run them on every edit. Pure of torch and of the data package (which imports torch)."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterator

from .base import Problem

# the image files the scan reads (trainer_backend/data/images.py imports this set: one definition)
IMAGE_EXTENSIONS = frozenset({".png", ".jpg", ".jpeg", ".webp", ".bmp", ".tif", ".tiff"})
WALK_LIMIT = 20_000               # folder entries looked at before a folder counts as "has images"
HEADER_LIMIT = 100_000_000        # safetensors' own limit on a header (bytes)
SAFETENSORS_SUFFIXES = (".safetensors", ".sft")


# video clips a video family trains on (data/video.py reads them; model.arch auto or a video family)
CLIP_EXTENSIONS = frozenset({".mp4", ".webm", ".mov", ".mkv", ".m4v"})


def has_image(root: Path, limit: int = WALK_LIMIT, suffixes: frozenset = IMAGE_EXTENSIONS) -> bool:
    """Is there an image file anywhere under `root` (hidden entries skipped, as the scan skips them)?
    True as soon as one is found, or when `limit` entries were looked at without an answer (a huge
    folder is the scan's to judge, not a cheap check's)."""
    seen = 0
    stack = [root]
    visited: set[tuple[int, int]] = set()
    while stack:
        folder = stack.pop()
        try:
            st = folder.stat()
            if (st.st_dev, st.st_ino) in visited:
                continue
            visited.add((st.st_dev, st.st_ino))
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            seen += 1
            if seen > limit:
                return True
            if entry.name.startswith("."):
                continue
            try:
                if entry.is_dir(follow_symlinks=True):
                    stack.append(Path(entry.path))
                elif Path(entry.name).suffix.lower() in suffixes:
                    return True
            except OSError:
                continue
    return False


def dataset_images(cfg) -> Iterator[Problem]:
    """A dataset folder (or subset folder) that holds no image file at all: the scan would refuse it
    when the run starts ("no images found"); say it now, under the field. Metadata mode lists its
    images in a JSON file: left to the scan."""
    ds = cfg.dataset
    folders = [] if ds.source == "metadata" else [("dataset.path", ds.path)]
    folders += [(f"dataset.subsets[{i}].path", s.path) for i, s in enumerate(ds.subsets)
                if (s.source if s.source != "inherit" else ds.source) != "metadata"]
    from ..families.registry import VIDEO_FAMILIES  # pure
    clips = cfg.model.arch in ("auto", *VIDEO_FAMILIES)
    suffixes = IMAGE_EXTENSIONS | CLIP_EXTENSIONS if clips else IMAGE_EXTENSIONS
    for key, value in folders:
        if not value or str(value).startswith("builtin:"):
            continue
        folder = Path(value).expanduser()
        if folder.is_dir() and not has_image(folder, suffixes=suffixes):
            kinds = ", ".join(sorted(e.lstrip(".") for e in IMAGE_EXTENSIONS))
            yield Problem(key, f"no images found in {folder} (looked for {kinds} files, subfolders included)")


def safetensors_header_problem(path: Path, limit: int = HEADER_LIMIT) -> str:
    """Why `path` is not a readable safetensors file, from its header alone (8 bytes of little-endian
    length, then that many bytes of JSON naming each tensor's dtype, shape and offsets); "" when the
    header is sound. Reads at most `limit` + 8 bytes; never the tensors."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                return f"{size} bytes: too short for a safetensors file"
            length = int.from_bytes(head, "little")
            if not 2 <= length <= min(limit, size - 8):
                return (f"not a safetensors file (its first 8 bytes give a header of {length} bytes; "
                        f"the file has {size})")
            raw = f.read(length)
    except OSError as e:
        return f"cannot be read ({e.strerror or e})"
    try:
        header = json.loads(raw.decode("utf-8").rstrip(" "))
    except (UnicodeDecodeError, ValueError):
        return "not a safetensors file (its header is not JSON)"
    if not isinstance(header, dict):
        return "not a safetensors file (its header is not a table of tensors)"
    tensors = {k: v for k, v in header.items() if k != "__metadata__"}
    if not tensors:
        return "a safetensors file with no tensors in it"
    body = size - 8 - length
    for name, info in tensors.items():
        offsets = info.get("data_offsets") if isinstance(info, dict) else None
        if (not isinstance(offsets, list) or len(offsets) != 2 or not all(isinstance(o, int) for o in offsets)
                or not 0 <= offsets[0] <= offsets[1] <= body or not isinstance(info.get("shape"), list)):
            return f"a damaged safetensors file (tensor {name!r} lies outside the file or has no shape)"
    return ""


def model_files(cfg) -> Iterator[Problem]:
    """model.path and model.vae, when they are single .safetensors files: the header must be one
    (a renamed download page, a truncated copy or a random file is refused here, not 25 s into a run);
    a model.path folder must be a diffusers folder (its model_index.json)."""
    for key in ("model.path", "model.vae"):
        value = getattr(cfg.model, key.split(".")[1], "")
        if not value or str(value).startswith("builtin:"):
            continue
        path = Path(value).expanduser()
        if key == "model.path" and path.is_dir() and not (path / "model_index.json").is_file():
            # what families.detect_family refuses when the run starts
            yield Problem(key, f"{path} is not a diffusers model folder (no model_index.json)")
        elif path.is_file() and path.suffix.lower() in SAFETENSORS_SUFFIXES:
            problem = safetensors_header_problem(path)
            if problem:
                yield Problem(key, f"{path}: {problem}")
