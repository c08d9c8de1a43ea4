"""Per-image (and per-clip) facts of a dataset folder, made once per file content and kept on disk.

`inspect_file` opens one image the way the trainer does (data/images.py: EXIF rotation, CMYK,
alpha, 16-bit, the megapixel guard), decodes it (a truncated file fails here), and from that one
decode takes a perceptual hash (imagehash) and a thumbnail. Facts that depend on the training
settings (bucket, crop, too small) and on the captions are derived later (checks.py), so the
index never goes stale when the form changes.

The index of a folder is a JSON-lines file in the cache (`<cache>/index/<folder key>.jsonl`), one
record per file, appended as files are done, so a page can show the first thumbnails while the
rest are still being made. A record is reused while the file's size and mtime are unchanged;
thumbnails are named by the content's sha256, so a renamed or copied file costs nothing.
`build_index` runs in a pool of processes; `python -m trainer_backend dataset index FOLDER` is
the background process the studio starts. Clips (video files, `<name>.frames` folders) are indexed
beside the images by clips.py's `inspect_clip` (PyAV: duration, frames, a first-frame thumbnail).
"""
from __future__ import annotations

import hashlib
import json
import os
import warnings
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Callable, Iterable

from ..data.images import BadImage, load_rgb, probe
from ..data.subsets import walk_images
from .thumbs import THUMB_SIDE, thumb_name, thumb_path, write_thumbnail  # noqa: F401  (thumb_name: index's public face)

DEFAULT_MAX_PIXELS = 100_000_000     # data.max_image_megapixels' default (the trainer's guard)
_CONVERSIONS = {"CMYK": "cmyk", "16-bit": "sixteen_bit", "transparency": "alpha", "palette": "palette",
                "EXIF": "exif_rotated"}


def folder_key(folder: Path) -> str:
    return hashlib.sha1(os.path.realpath(folder).encode("utf-8")).hexdigest()[:16]


def index_path(cache: Path, folder: Path) -> Path:
    return Path(cache) / "index" / f"{folder_key(folder)}.jsonl"


def list_images(folder: Path) -> list[Path]:
    """The dataset's image files (recursively, dot folders skipped, sorted): the trainer's own walk."""
    return walk_images(Path(folder), [])


def list_media(folder: Path) -> list[Path]:
    """The dataset's images and clips, in the walk's order (a folder's entries by name)."""
    from .clips import list_clips
    folder = Path(folder)
    images, clips = list_images(folder), list_clips(folder)
    if not clips:
        return images
    return sorted([*images, *clips], key=lambda p: p.relative_to(folder).parts)


def _sha256(path: Path) -> tuple[str, int]:
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def _frames(path: Path) -> int:
    from PIL import Image
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with Image.open(path) as img:
                return int(getattr(img, "n_frames", 1) or 1)
    except Exception:
        return 1


def inspect_file(path: Path, folder: Path, cache: Path | None, max_pixels: int = DEFAULT_MAX_PIXELS) -> dict:
    """One image's record: content hash, size after EXIF rotation, conversions, frames, perceptual
    hash, and `flags` {kind: message} for what is wrong regardless of settings. Writes the thumbnail
    into the cache (when given) unless one for this content exists."""
    import imagehash
    st = path.stat()
    record: dict = {"path": path.relative_to(folder).as_posix(), "bytes": st.st_size, "mtime_ns": st.st_mtime_ns,
                    "flags": {}}
    try:
        record["sha256"], _ = _sha256(path)
    except OSError as e:
        record["flags"]["unreadable"] = f"unreadable ({e.strerror or e})"
        return record
    try:
        info = probe(path, max_pixels)
        record["width"], record["height"] = info.width, info.height
        for note in info.notes:
            kind = next((k for word, k in _CONVERSIONS.items() if word in note), "converted")
            record["flags"][kind] = note
        frames = _frames(path)
        if frames > 1:
            record["flags"]["animated"] = f"animated ({frames} frames): only the first frame is trained"
        img = load_rgb(path, max_pixels, draft=(THUMB_SIDE, THUMB_SIDE))
    except BadImage as e:
        record["flags"]["unreadable"] = str(e)
        return record
    with img:
        record["phash"] = str(imagehash.phash(img))
        if cache is not None:
            target = thumb_path(cache, record["sha256"])
            if not target.exists():
                write_thumbnail(img, target)
    return record



def read_index(cache: Path, folder: Path) -> dict[str, dict]:
    """path -> newest record (lines cut off by a crash are skipped)."""
    out: dict[str, dict] = {}
    try:
        with open(index_path(cache, folder), encoding="utf-8") as f:
            for line in f:
                try:
                    record = json.loads(line)
                    out[record["path"]] = record
                except (ValueError, KeyError, TypeError):
                    continue
    except OSError:
        pass
    return out


def is_current(record: dict | None, path: Path) -> bool:
    from .clips import clip_stat
    try:
        size, mtime = clip_stat(path)
    except OSError:
        return False
    return bool(record) and record.get("bytes") == size and record.get("mtime_ns") == mtime


def _inspect_job(args: tuple) -> dict:
    path, folder, cache, max_pixels = args
    from .clips import inspect_clip, is_clip
    try:
        if is_clip(path):
            return inspect_clip(path, folder, (lambda sha: thumb_path(cache, sha)) if cache is not None else None)
        return inspect_file(path, folder, cache, max_pixels)
    except OSError as e:  # vanished or unreadable between the walk and the read
        return {"path": path.relative_to(folder).as_posix(), "flags": {"unreadable": f"unreadable ({e})"}}


def build_index(folder: Path, cache: Path | None, *, workers: int | None = None, max_pixels: int = DEFAULT_MAX_PIXELS,
                progress: Callable[[int, int], None] | None = None, paths: Iterable[Path] | None = None
                ) -> list[dict]:
    """Records for every image and clip of the folder, in the walk's order: the cached ones reused, the
    rest made in a pool of processes (and appended to the cache's index as they come)."""
    folder = Path(folder)
    images = list(paths) if paths is not None else list_media(folder)
    known = read_index(cache, folder) if cache is not None else {}
    records: dict[str, dict] = {}
    todo = []
    for path in images:
        rel = path.relative_to(folder).as_posix()
        if is_current(known.get(rel), path):
            records[rel] = known[rel]
        else:
            todo.append((path, folder, cache, max_pixels))
    done = len(records)
    if progress:
        progress(done, len(images))
    sink = None
    if cache is not None and todo:
        index_path(cache, folder).parent.mkdir(parents=True, exist_ok=True)
        sink = open(index_path(cache, folder), "a", encoding="utf-8")
    workers = workers or min(len(todo), os.cpu_count() or 1) or 1
    pool = ProcessPoolExecutor(workers) if workers > 1 and len(todo) >= 8 else None
    try:
        results = pool.map(_inspect_job, todo, chunksize=8) if pool else map(_inspect_job, todo)
        for record in results:
            records[record["path"]] = record
            if sink:
                sink.write(json.dumps(record) + "\n")
                sink.flush()
            done += 1
            if progress:
                progress(done, len(images))
    finally:
        if pool:
            pool.shutdown(cancel_futures=True)
        if sink:
            sink.close()
    ordered = [records[rel] for rel in (p.relative_to(folder).as_posix() for p in images) if rel in records]
    if sink and len(known) + len(todo) > len(ordered):   # drop replaced and vanished files' lines
        _rewrite_index(cache, folder, ordered)
    return ordered


def _rewrite_index(cache: Path, folder: Path, records: list[dict]) -> None:
    target = index_path(cache, folder)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    os.replace(tmp, target)
