"""Clips in the workbench: a dataset folder's video files and `<name>.frames` image sequences beside
its images, their index records (kind, frames, fps, duration, audio, a thumbnail of the first frame),
and what a video family's trainer takes from them.

Everything about frames is data/video.py's and data/video_scan.py's: a clip is probed with
`probe_clip` (a clip the scan skips is flagged `unreadable` with the scan's own reason), its training
windows and frame bucket come from the scan's `_windows_of`, and `windows_summary` builds the dict
`scan_clips` prints (`summary_lines`) from the index's records instead of probing every clip again.
The training settings' video options are the [dataset] section's, read through data/video_items.py's
`video_options`, with the frame rule of the family model.arch / model.path names.
"""
from __future__ import annotations

import hashlib
import os
import stat
from collections import Counter
from pathlib import Path
from typing import Callable

import numpy as np

from ..data.buckets import BucketSpec, make_buckets
from ..data.video import FRAMES_FOLDER_SUFFIX, VIDEO_EXTENSIONS, BadClip, ClipInfo, decode_frames, frame_strip, \
    probe_clip, write_clip
from ..data.video_items import video_options
from ..data.video_scan import ClipWindow, VideoOptions, _windows_of, sequence_fingerprint
from .thumbs import write_thumbnail

STRIP_FRAMES = 8          # frames shown per window in a strip
STRIP_WINDOWS = 4         # windows shown at most (the info text counts them all)
PREVIEW_SIDE = 384        # the preview mp4's longer side at most


def is_clip(path: Path) -> bool:
    """A video file or an `<name>.frames` folder (images are not clips here: the image walk has them)."""
    if path.suffix.lower() == FRAMES_FOLDER_SUFFIX:
        return path.is_dir()
    return path.suffix.lower() in VIDEO_EXTENSIONS and path.is_file()


def is_clip_name(rel: str) -> bool:
    """A clip's path by its name alone (an index record's, a file not indexed yet)."""
    suffix = Path(rel).suffix.lower()
    return suffix in VIDEO_EXTENSIONS or suffix == FRAMES_FOLDER_SUFFIX


def list_clips(folder: Path) -> list[Path]:
    """The clips under a folder (dot entries skipped, symbolic links followed but never around a
    loop), in the walk's order."""
    out: list[Path] = []
    seen: set[tuple[int, int]] = set()

    def visit(current: Path) -> None:
        try:
            st = current.stat()
            if (st.st_dev, st.st_ino) in seen:
                return
            seen.add((st.st_dev, st.st_ino))
            entries = sorted(os.scandir(current), key=lambda e: e.name)
        except OSError:
            return   # the image walk reports unreadable folders
        for entry in entries:   # names first: a folder of images costs a string test per file
            if entry.name.startswith("."):
                continue
            suffix = os.path.splitext(entry.name)[1].lower()
            if suffix in VIDEO_EXTENSIONS and entry.is_file():
                out.append(Path(entry.path))
            elif entry.is_dir():
                if suffix == FRAMES_FOLDER_SUFFIX:
                    out.append(Path(entry.path))
                else:
                    visit(Path(entry.path))
    visit(Path(folder))
    return out


def clip_stat(path: Path) -> tuple[int, int]:
    """(bytes, mtime_ns) that change when a clip changes: a file's own; a frames folder's: its frames'
    total size and newest mtime (a frame added, removed or rewritten)."""
    st = path.stat()
    if not stat.S_ISDIR(st.st_mode):   # one stat per image: the page checks every file at each rebuild
        return st.st_size, st.st_mtime_ns
    size, newest = 0, st.st_mtime_ns
    for entry in os.scandir(path):
        if entry.is_file():
            s = entry.stat()
            size, newest = size + s.st_size, max(newest, s.st_mtime_ns)
    return size, newest


def content_id(path: Path) -> str:
    """The clip's identity for its thumbnail's name: a file's sha256; a frames folder's fingerprint of
    its frame files (the latent cache's own, data/video_scan.py)."""
    if path.is_dir():
        return "seq-" + sequence_fingerprint(path)
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def inspect_clip(path: Path, folder: Path, thumb_of: Callable[[str], Path] | None = None,
                 sequence_fps: float = 16.0) -> dict:
    """One clip's index record: `clip` {kind, frames, fps, duration_s, audio}, its size, and `flags`
    {"unreadable": the scan's reason} for a clip the trainer would skip. Writes the thumbnail (the
    first frame) to `thumb_of(content id)` (index.py: the cache's) unless it exists."""
    size, mtime = clip_stat(path)
    record: dict = {"path": path.relative_to(folder).as_posix(), "bytes": size, "mtime_ns": mtime, "flags": {}}
    try:
        record["sha256"] = content_id(path)
    except OSError as e:
        record["flags"]["unreadable"] = f"unreadable ({e.strerror or e})"
        return record
    try:
        info = probe_clip(path, sequence_fps)
    except BadClip as e:
        record["flags"]["unreadable"] = str(e)
        return record
    record["width"], record["height"] = info.width, info.height
    record["clip"] = {"kind": info.kind, "frames": info.frames, "fps": round(info.fps, 3),
                      "duration_s": round(info.duration, 3), "audio": info.has_audio}
    target = thumb_of(record["sha256"]) if thumb_of is not None else None
    if target is not None and not target.exists():
        from PIL import Image
        try:
            first = decode_frames(path, [0])[0]
        except BadClip as e:   # the header reads, the frames do not: training would skip it too
            record["flags"]["unreadable"] = str(e)
            return record
        write_thumbnail(Image.fromarray(first), target)
    return record


def clip_info(record: dict, sequence_fps: float = 0.0) -> ClipInfo | None:
    """The ClipInfo an index record holds (an image's: a 1-frame clip; an image sequence's read at
    `sequence_fps` when given); None when not indexed or unreadable."""
    if "width" not in record or "unreadable" in record.get("flags", {}):
        return None
    c = record.get("clip")
    if c is None:
        return ClipInfo(1, 0.0, record["width"], record["height"], False, "image")
    fps = sequence_fps if c["kind"] == "frames" and sequence_fps > 0 else c["fps"]
    return ClipInfo(c["frames"], fps, record["width"], record["height"], bool(c["audio"]), c["kind"])


def clip_label(name: str, record: dict) -> str:
    """'walk.mp4 ▶ 2.4 s, 38 f' (the grid's label of a clip; ' ♪' when it has an audio track)."""
    c = record.get("clip")
    if not c:
        return name
    if c["kind"] == "frames":
        return f"{name} ▶ {c['frames']} f at {c['fps']:g} fps"
    return f"{name} ▶ {c['duration_s']:.1f} s, {c['frames']} f" + (" ♪" if c.get("audio") else "")


# ---- the training settings ------------------------------------------------------------------------------

def family_of(values: dict) -> tuple[str, int]:
    """(family name or "auto", its frame step; 0: an image family or not known) of the Training form's
    model.arch / model.path (launch/model_size.arch_of: no model is loaded)."""
    from ..families.registry import FAMILY_NAMES, entry
    from ..launch.model_size import arch_of
    arch = arch_of(values.get("model.arch") or "auto", values.get("model.path") or "")
    return arch, (entry(arch).frame_step if arch in FAMILY_NAMES else 0)


def options_of(values: dict, frame_step: int, seed: int = 0) -> VideoOptions:
    """The video options the trainer would use: the [dataset] video_* values given (`dataset.` prefixed
    or not), the schema's defaults for the rest. A value the schema refuses raises ValueError naming it."""
    from pydantic import ValidationError

    from ..config import TrainConfig
    defaults = TrainConfig().dataset
    ds = defaults.model_dump()
    for key in list(ds):
        for name in (key, f"dataset.{key}"):
            if values.get(name) is not None:
                ds[key] = values[name]
    try:
        checked = type(defaults).model_validate(ds)
    except ValidationError as e:
        first = e.errors()[0]
        raise ValueError(f"dataset.{'.'.join(map(str, first['loc']))}: {first['msg']}") from None
    return video_options(checked, frame_step, seed)


def windows_of(folder: Path, record: dict, opts: VideoOptions, spec: BucketSpec) -> list[ClipWindow]:
    """The windows a video family's trainer takes from one indexed clip (or image): the scan's own."""
    info = clip_info(record, opts.sequence_fps)
    if info is None:
        return []
    return _windows_of(Path(folder) / record["path"], info, "", opts, spec, make_buckets(spec))


def windows_summary(folder: Path, records: list[dict], opts: VideoOptions, spec: BucketSpec) -> dict:
    """data/video_scan.scan_clips's summary (clip counts by kind, seconds, audio tracks, windows, frame
    buckets, the skipped files and why) of the indexed records; records not indexed yet are left out."""
    buckets = make_buckets(spec)
    kinds: Counter = Counter()
    duration, with_audio, windows, skipped = 0.0, 0, [], []
    for record in records:
        path = Path(folder) / record["path"]
        if "unreadable" in record.get("flags", {}):
            skipped.append({"file": str(path), "reason": record["flags"]["unreadable"]})
            continue
        info = clip_info(record, opts.sequence_fps)
        if info is None:
            continue
        got = _windows_of(path, info, "", opts, spec, buckets)
        if not got:
            need = max(opts.min_frames, 1)
            skipped.append({"file": str(path), "reason": f"{info.frames} frames at {info.fps:g} fps give fewer "
                                                         f"than {need} at {opts.fps:g} fps"})
            continue
        kinds[info.kind] += 1
        duration += info.duration
        with_audio += info.has_audio
        windows.extend(got)
    clips = sum(kinds.values())
    return {"clips": clips, "videos": kinds["video"], "image_sequences": kinds["frames"], "images": kinds["image"],
            "with_audio": with_audio, "duration_s": round(duration, 2),
            "mean_duration_s": round(duration / max(1, clips - kinds["image"]), 2),
            "windows": len(windows), "clip_mode": opts.clip_mode, "fps": opts.fps,
            "frame_rule": f"{opts.frame_step}k+1" if opts.frame_step > 1 else "any",
            "frame_buckets": dict(sorted(Counter(w.frame_bucket for w in windows).items())),
            "skipped": skipped}


# ---- pictures of one clip -------------------------------------------------------------------------------

def _strip_picks(frames: int) -> list[int]:
    return sorted({round(i * (frames - 1) / max(1, STRIP_FRAMES - 1)) for i in range(min(STRIP_FRAMES, frames))})


def windows_strip(path: Path, windows: list[ClipWindow], fps: float, height: int = 96):
    """The windows the trainer takes, one frame strip per window (its first, last and evenly spaced
    frames, at the target fps's source indices), stacked; at most STRIP_WINDOWS. Raises BadClip."""
    from PIL import Image
    picks = []
    for window in windows[:STRIP_WINDOWS]:
        indices = window.indices(fps)
        picks.append([indices[i] for i in _strip_picks(len(indices))])
    wanted = sorted({i for row in picks for i in row})
    decoded = dict(zip(wanted, decode_frames(path, wanted)))   # one pass over the clip for every window
    rows = [frame_strip(np.stack([decoded[i] for i in row]), count=len(row), height=height) for row in picks]
    out = Image.new("RGB", (max(r.width for r in rows), sum(r.height for r in rows) + 4 * (len(rows) - 1)),
                    (255, 255, 255))
    y = 0
    for row in rows:
        out.paste(row, (0, y))
        y += row.height + 4
    return out


def preview_clip(path: Path, window: ClipWindow, fps: float, cache: Path, key: str) -> Path:
    """The first window as the trainer samples it (its source frames at the target fps), as a small
    H.264 mp4 in the cache (`previews/`, never in the dataset), made once per clip and settings."""
    from PIL import Image
    target = Path(cache) / "previews" / f"{hashlib.sha1(key.encode()).hexdigest()[:20]}.mp4"
    if target.exists():
        return target
    frames = decode_frames(path, window.indices(fps))
    h, w = frames.shape[1:3]
    scale = min(1.0, PREVIEW_SIDE / max(h, w))
    if scale < 1:
        size = (max(2, round(w * scale)), max(2, round(h * scale)))
        frames = np.stack([np.asarray(Image.fromarray(f).resize(size, Image.Resampling.BILINEAR))
                  for f in frames])
    rate = fps if fps > 0 else (window.info.fps or 16)
    tmp = target.with_name(f".{target.stem}.{os.getpid()}.tmp.mp4")
    write_clip(tmp, frames, fps=max(1, round(rate)))
    os.replace(tmp, target)
    return target
