"""Video clips: probing and decoding with PyAV, and the pure arithmetic of frames.

A clip is a video file (.mp4, .webm, .mov, .mkv), a folder of numbered frames named `<name>.frames`
(its caption beside it as `<name>.txt`), or an image (a 1-frame clip). A family states its frame-count
rule as a step: counts are `k * step + 1` (Wan 4k+1, LTX-2 8k+1; images use k = 0). Frames are sampled
on the target fps's timeline; a clip longer than the window is cut into windows (head / uniform / random,
as diffusion-pipe's `video_clip_mode`). Every way a clip can be bad becomes a `BadClip` with a one-line
reason, so a scan skips it and goes on.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from .images import BadImage, is_image_name, load_rgb, probe

VIDEO_EXTENSIONS = frozenset({".mp4", ".webm", ".mov", ".mkv", ".m4v"})
FRAMES_FOLDER_SUFFIX = ".frames"
CLIP_MODES = ("head", "uniform", "random")


class BadClip(ValueError):
    """The clip cannot be used; str() is the reason (without the path)."""


@dataclass(frozen=True)
class ClipInfo:
    frames: int           # source frames (1 for an image)
    fps: float            # source frame rate (0 for an image; an image sequence: the fps it is read at)
    width: int
    height: int
    has_audio: bool = False
    kind: str = "video"   # "video" | "frames" (image sequence) | "image"

    @property
    def duration(self) -> float:
        """Seconds (0 for an image)."""
        return self.frames / self.fps if self.fps > 0 else 0.0


def is_clip_path(path: Path) -> bool:
    suffix = path.suffix.lower()
    if path.is_dir():
        return suffix == FRAMES_FOLDER_SUFFIX
    return suffix in VIDEO_EXTENSIONS or is_image_name(path)


# ---- pure arithmetic ------------------------------------------------------------------------------------

def frame_count_for(available: int, step: int, max_frames: int = 0) -> int:
    """The largest count `k * step + 1` that is <= available (and <= max_frames when given); 0 when
    not even one frame is available. step 1 allows every count."""
    if step < 1:
        raise ValueError(f"frame step must be >= 1, got {step}")
    limit = min(available, max_frames) if max_frames > 0 else available
    if limit < 1:
        return 0
    return (limit - 1) // step * step + 1


def frames_at_fps(source_frames: int, source_fps: float, target_fps: float) -> int:
    """How many frames the clip holds on the target fps's timeline (target_fps 0 or >= the source's
    rate: every source frame)."""
    if source_frames <= 0:
        return 0
    if target_fps <= 0 or source_fps <= 0 or target_fps >= source_fps:
        return source_frames
    return int(math.floor((source_frames - 1) * target_fps / source_fps + 1e-9)) + 1


def source_indices(source_frames: int, source_fps: float, target_fps: float, start: int, count: int) -> list[int]:
    """The source frame index of each of `count` target frames from target frame `start` on."""
    if target_fps <= 0 or source_fps <= 0 or target_fps >= source_fps:
        ratio = 1.0
    else:
        ratio = source_fps / target_fps
    return [min(source_frames - 1, int(round((start + j) * ratio))) for j in range(count)]


def window_starts(available: int, length: int, mode: str, max_windows: int = 0, rand01: float = 0.0) -> list[int]:
    """Start frames (on the target timeline) of the windows taken from a clip of `available` frames.
    head: the first window; uniform: windows spread evenly over the clip, about one per `length`
    frames (at most max_windows when > 0); random: one window at `rand01` of the free span (the dataset
    draws rand01 per epoch from its seed)."""
    if mode not in CLIP_MODES:
        raise ValueError(f"clip mode must be one of {', '.join(CLIP_MODES)}, got {mode!r}")
    if length <= 0 or available < length:
        return []
    free = available - length
    if mode == "head" or free == 0:
        return [0]
    if mode == "random":
        return [min(free, int(rand01 * (free + 1)))]
    count = max(1, round(available / length))
    if max_windows > 0:
        count = min(count, max_windows)
    if count == 1:
        return [0]
    return sorted({round(i * free / (count - 1)) for i in range(count)})


def frame_bucket_name(frames: int, size: tuple[int, int]) -> str:
    """'33x832x480': frames x width x height."""
    return f"{frames}x{size[0]}x{size[1]}"


# ---- probing and decoding -------------------------------------------------------------------------------

def _frame_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_file() and is_image_name(p))


def probe_clip(path: Path, sequence_fps: float = 16.0) -> ClipInfo:
    """Frame count, fps, size and audio of a clip, read from its header (a video whose header has no
    frame count is counted by demuxing, without decoding). Raises BadClip."""
    if path.is_dir():
        files = _frame_files(path)
        if not files:
            raise BadClip("image-sequence folder holds no images")
        try:
            info = probe(files[0], max_pixels=1 << 30)
        except BadImage as e:
            raise BadClip(f"first frame {files[0].name}: {e}") from None
        return ClipInfo(len(files), sequence_fps, info.width, info.height, False, "frames")
    if is_image_name(path):
        try:
            info = probe(path, max_pixels=1 << 30)
        except BadImage as e:
            raise BadClip(str(e)) from None
        return ClipInfo(1, 0.0, info.width, info.height, False, "image")
    import av
    try:
        with av.open(str(path)) as container:
            if not container.streams.video:
                raise BadClip("no video stream")
            stream = container.streams.video[0]
            fps = float(stream.average_rate or stream.guessed_rate or 0)
            frames = stream.frames
            if frames <= 0:
                frames = sum(1 for packet in container.demux(stream) if packet.size)
            width, height = stream.codec_context.width, stream.codec_context.height
            has_audio = bool(container.streams.audio)
    except BadClip:
        raise
    except (av.FFmpegError, OSError, ValueError) as e:
        raise BadClip(f"cannot read the video ({type(e).__name__}: {str(e).splitlines()[0][:120]})") from None
    if frames <= 0 or width <= 0 or height <= 0:
        raise BadClip("the video has no frames")
    return ClipInfo(frames, fps or 1.0, width, height, has_audio, "video")


def decode_frames(path: Path, indices: list[int]) -> np.ndarray:
    """The given source frames as uint8 RGB, shape (len(indices), H, W, 3). Decodes sequentially and
    stops after the last one needed. Raises BadClip."""
    if not indices:
        raise ValueError("no frames requested")
    wanted = sorted(set(indices))
    if path.is_dir():
        files = _frame_files(path)
        try:
            got = {i: np.asarray(load_rgb(files[i], max_pixels=1 << 30)) for i in wanted}
        except (BadImage, IndexError) as e:
            raise BadClip(f"frame {e}") from None
        return np.stack([got[i] for i in indices])
    if is_image_name(path):
        try:
            image = np.asarray(load_rgb(path, max_pixels=1 << 30))
        except BadImage as e:
            raise BadClip(str(e)) from None
        return np.stack([image for _ in indices])
    import av
    got: dict[int, np.ndarray] = {}
    last = wanted[-1]
    try:
        with av.open(str(path)) as container:
            stream = container.streams.video[0]
            stream.thread_type = "AUTO"
            for n, frame in enumerate(container.decode(stream)):
                if n in wanted:
                    got[n] = frame.to_ndarray(format="rgb24")
                if n >= last:
                    break
    except (av.FFmpegError, OSError, ValueError, IndexError) as e:
        raise BadClip(f"cannot decode the video ({type(e).__name__}: {str(e).splitlines()[0][:120]})") from None
    missing = [i for i in wanted if i not in got]
    if missing:
        raise BadClip(f"the video ends before frame {missing[0]} (decoded {len(got)})")
    return np.stack([got[i] for i in indices])


def write_clip(path: Path, frames: np.ndarray, fps: int = 16, codec: str = "libx264",
               audio: tuple[np.ndarray, int] | None = None) -> Path:
    """Writes uint8 RGB frames (F, H, W, 3) as a video file (mp4/h264 by default; the sample clips
    and the tests' generated datasets use it). Odd sizes are padded by one pixel for yuv420p.
    audio: (float (channels, samples) in [-1, 1], rate): an AAC track beside the frames (data/audio.py)."""
    import av
    frames = np.asarray(frames, dtype=np.uint8)
    _, h, w, _ = frames.shape
    if h % 2 or w % 2:
        frames = np.pad(frames, ((0, 0), (0, h % 2), (0, w % 2), (0, 0)), mode="edge")
        h, w = h + h % 2, w + w % 2
    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), mode="w") as container:
        stream = container.add_stream(codec, rate=fps)
        stream.width, stream.height = w, h
        stream.pix_fmt = "yuv420p"
        write_audio = None
        if audio is not None:  # every stream exists before the first packet is muxed
            write_audio = audio_track(container, *audio)
        for image in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
        if write_audio is not None:
            write_audio()
    return path


def audio_track(container, audio: np.ndarray, rate: int) -> Callable[[], None]:
    """Adds an AAC track for float (channels, samples) audio in [-1, 1] to an open output container (before
    anything is muxed); returns the call that encodes and muxes it."""
    import av
    audio = np.ascontiguousarray(np.clip(np.asarray(audio, dtype=np.float32), -1.0, 1.0)[:2])
    layout = "mono" if audio.shape[0] == 1 else "stereo"
    stream = container.add_stream("aac", rate=rate)
    stream.codec_context.layout = layout

    def write() -> None:
        frame = av.AudioFrame.from_ndarray(audio, format="fltp", layout=layout)
        frame.sample_rate, frame.pts = rate, 0
        for packet in stream.encode(frame):
            container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return write


def frame_strip(frames: np.ndarray, count: int = 8, height: int = 96):
    """A clip's frames side by side (at most `count`, evenly spaced, first and last included) as one
    PIL image `height` pixels tall: the picture shown beside a sample clip."""
    from PIL import Image
    frames = np.asarray(frames)
    total = len(frames)
    picks = sorted({round(i * (total - 1) / max(1, count - 1)) for i in range(min(count, total))})
    _, h, w, _ = frames.shape
    width = max(1, round(w * height / h))
    strip = Image.new("RGB", (width * len(picks), height))
    for n, i in enumerate(picks):
        strip.paste(Image.fromarray(frames[i].astype(np.uint8)).resize((width, height)), (n * width, 0))
    return strip


def clip_strip(path: Path, count: int = 8, height: int = 96):
    """The frame strip of a clip file (PIL image). Raises BadClip."""
    info = probe_clip(path)
    picks = sorted({round(i * (info.frames - 1) / max(1, count - 1)) for i in range(min(count, info.frames))})
    return frame_strip(decode_frames(path, picks), count=count, height=height)


def write_sample(stem: Path, frames: np.ndarray, fps: int = 16,
                 audio: tuple[np.ndarray, int] | None = None) -> list[Path]:
    """A video sample: `<stem>.mp4` (with the generated audio track when `audio` is given) and its frame strip
    `<stem>.strip.png` (uint8 RGB frames (F, H, W, 3)); both paths go in the sample event, so the Run page
    plays the clip and shows the strip."""
    clip = write_clip(stem.with_name(stem.name + ".mp4"), frames, fps=fps, audio=audio)
    strip = stem.with_name(stem.name + ".strip.png")
    frame_strip(frames).save(strip)
    return [clip, strip]
