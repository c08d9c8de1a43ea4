"""scan_clips: a folder of clips -> the training windows, their frame buckets and a summary.

Each clip is probed (header only), its frames counted on the target fps's timeline, cut into windows
of the family's frame count (`k * frame_step + 1`, at most max_frames), and given a frame bucket:
frames x the aspect bucket of its size (data/buckets.py, the same arithmetic as images). Images are
1-frame clips. A clip that cannot be read, or is shorter than one frame-count step allows, is skipped
with one warning line naming it; the summary counts it.
"""
from __future__ import annotations

import hashlib
import logging
import random
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from .buckets import BucketSpec, Size, assign_bucket, make_buckets
from .captions import read_caption
from .video import CLIP_MODES, BadClip, ClipInfo, frame_bucket_name, frame_count_for, frames_at_fps, \
    is_clip_path, probe_clip, source_indices, window_starts

LOG = logging.getLogger(__name__)


@dataclass(frozen=True)
class VideoOptions:
    frame_step: int = 4          # the family's rule: counts are k * frame_step + 1 (Wan 4, LTX-2 8)
    fps: float = 16.0            # the target frame rate frames are sampled at (0: the clip's own)
    max_frames: int = 81         # the longest window (rounded down to the family's rule)
    min_frames: int = 1          # clips with fewer usable frames are skipped (1 keeps images)
    clip_mode: str = "head"      # head | uniform | random (data/video.py window_starts)
    max_windows: int = 0         # uniform: at most this many windows per clip (0: about one per window length)
    sequence_fps: float = 16.0   # the frame rate of an image-sequence folder (<name>.frames/)
    caption_extension: str = ".txt"
    seed: int = 0                # random windows: drawn from (seed, epoch, clip)
    frame_buckets: tuple[int, ...] = ()  # the frame counts windows may have (empty: any the rule allows)
    audio: bool = False          # the clips' audio tracks train too (dataset.video_audio, a model with an audio stream)

    def __post_init__(self):
        if self.clip_mode not in CLIP_MODES:
            raise ValueError(f"clip_mode: must be one of {', '.join(CLIP_MODES)}, got {self.clip_mode!r}")
        if self.frame_step < 1:
            raise ValueError(f"frame_step: must be >= 1, got {self.frame_step}")


@dataclass(frozen=True)
class ClipWindow:
    """One training sample: `frames` target frames of a clip from target frame `start` on."""
    path: Path
    caption: str
    info: ClipInfo
    start: int                   # on the target fps's timeline (random mode: drawn again per epoch)
    frames: int
    bucket: Size                 # (width, height)
    random_start: bool = False
    audio: bool = False          # its audio track trains with it (data/audio.py); False: video only

    @property
    def frame_bucket(self) -> str:
        return frame_bucket_name(self.frames, self.bucket)

    def indices(self, target_fps: float, epoch: int = 0, seed: int = 0) -> list[int]:
        """The source frame indices to decode for this window (random windows: a new start per epoch)."""
        start = self.start
        if self.random_start:
            available = frames_at_fps(self.info.frames, self.info.fps, target_fps)
            rand01 = random.Random(f"{seed}:{epoch}:{self.path}").random()
            start = window_starts(available, self.frames, "random", rand01=rand01)[0]
        return source_indices(self.info.frames, self.info.fps, target_fps, start, self.frames)


@dataclass
class ClipScan:
    windows: list[ClipWindow]
    summary: dict
    warnings: list[str] = field(default_factory=list)


def clip_files(folder: Path) -> list[Path]:
    """Clips in a folder and its subfolders (an `<name>.frames` folder is one clip), sorted."""
    out: list[Path] = []
    for entry in sorted(folder.iterdir()):
        if entry.name.startswith("."):
            continue
        if is_clip_path(entry):
            out.append(entry)
        elif entry.is_dir():
            out.extend(clip_files(entry))
    return out


def _windows_of(path: Path, info: ClipInfo, caption: str, opts: VideoOptions, spec: BucketSpec,
                buckets: list[Size]) -> list[ClipWindow]:
    available = frames_at_fps(info.frames, info.fps, opts.fps)
    frames = frame_count_for(available, opts.frame_step, opts.max_frames)
    if opts.frame_buckets:  # the largest frame bucket the clip is long enough for
        frames = max((b for b in opts.frame_buckets if b <= available), default=0)
    if frames < max(1, opts.min_frames):
        return []
    bucket = assign_bucket(info.width, info.height, spec, buckets)
    audio = opts.audio and info.has_audio
    if opts.clip_mode == "random" and available > frames:
        return [ClipWindow(path, caption, info, 0, frames, bucket, random_start=True, audio=audio)]
    return [ClipWindow(path, caption, info, start, frames, bucket, audio=audio)
            for start in window_starts(available, frames, opts.clip_mode, opts.max_windows)]


def scan_clips(folder: Path, opts: VideoOptions, spec: BucketSpec) -> ClipScan:
    """Every usable window of the clips under `folder`, with a summary: clip counts by kind, total
    and mean duration, windows, frame buckets, audio tracks, and the skipped files with their reasons."""
    buckets = make_buckets(spec)
    windows: list[ClipWindow] = []
    warnings: list[str] = []
    skipped: list[dict] = []
    kinds: Counter = Counter()
    duration = 0.0
    with_audio = 0
    for path in clip_files(folder):
        try:
            info = probe_clip(path, opts.sequence_fps)
        except BadClip as e:
            skipped.append({"file": str(path), "reason": str(e)})
            warnings.append(f"{path}: {e} (skipped)")
            continue
        caption = read_caption(path, opts.caption_extension).text or ""
        got = _windows_of(path, info, caption, opts, spec, buckets)
        if not got:
            need = max(opts.min_frames, 1)
            reason = f"{info.frames} frames at {info.fps:g} fps give fewer than {need} at {opts.fps:g} fps"
            skipped.append({"file": str(path), "reason": reason})
            warnings.append(f"{path}: {reason} (skipped)")
            continue
        kinds[info.kind] += 1
        duration += info.duration
        with_audio += info.has_audio
        windows.extend(got)
    for line in warnings:
        LOG.warning(line)
    clips = sum(kinds.values())
    summary = {
        "clips": clips, "videos": kinds["video"], "image_sequences": kinds["frames"], "images": kinds["image"],
        "with_audio": with_audio, "duration_s": round(duration, 2),
        "mean_duration_s": round(duration / max(1, clips - kinds["image"]), 2),
        "windows": len(windows), "clip_mode": opts.clip_mode, "fps": opts.fps,
        "frame_rule": f"{opts.frame_step}k+1" if opts.frame_step > 1 else "any",
        "frame_buckets": dict(sorted(Counter(w.frame_bucket for w in windows).items())),
        "skipped": skipped,
    }
    return ClipScan(windows, summary, warnings)


def summary_lines(summary: dict) -> list[str]:
    """The summary as the plan prints it."""
    lines = [f"clips: {summary['clips']} ({summary['videos']} videos, {summary['image_sequences']} image sequences, "
             f"{summary['images']} images), {summary['duration_s']:g} s in all, "
             f"{summary['with_audio']} with an audio track",
             f"windows: {summary['windows']} ({summary['clip_mode']}, {summary['frame_rule']} frames at "
             f"{summary['fps']:g} fps)"]
    lines += [f"  bucket {name}: {count}" for name, count in summary["frame_buckets"].items()]
    if summary["skipped"]:
        lines.append(f"skipped: {len(summary['skipped'])}")
    return lines


def clip_latent_key(fingerprint: str, window: ClipWindow, target_fps: float, indices: list[int], vae_id: str,
                    flipped: bool = False) -> str:
    """The latent cache key of one window: the clip's file identity, which source frames, the bucket,
    the VAE. An image sequence's fingerprint should cover its frame files (`sequence_fingerprint`)."""
    parts = ["clip1", fingerprint, str(window.path.resolve()), f"fps={target_fps:g}",
             ",".join(map(str, indices)), frame_bucket_name(window.frames, window.bucket),
             f"flip={int(flipped)}", f"vae={vae_id}"]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()


def sequence_fingerprint(folder: Path) -> str:
    """Identity of an image-sequence folder: its frame files' names, sizes and mtimes."""
    h = hashlib.blake2b(digest_size=16)
    for p in sorted(folder.iterdir()):
        st = p.stat()
        h.update(f"{p.name}:{st.st_size}:{st.st_mtime_ns};".encode())
    return h.hexdigest()
