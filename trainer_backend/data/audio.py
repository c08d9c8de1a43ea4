"""A clip window's audio track: the same time span as the window's frames, decoded with PyAV and resampled
(libswresample) to the rate and channel count the model's audio encoder takes (a sample mp4's audio track is
written by data/video.write_clip).

Families with an audio stream (Family.audio_stream: LTX-2) train a window's audio when its clip has an audio
track and dataset.video_audio is on (VideoOptions.audio; ClipWindow.audio). The family turns the waveform into
its own features (LTX-2: a log-mel spectrogram through its audio VAE: families/ltx2/audio.py); this module knows
nothing of mel spectrograms.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from .video import BadClip, ClipInfo


@dataclass(frozen=True)
class AudioEncoding:
    """What a run's audio encoder takes and does: `encode(waveform (1, channels, samples) float tensor at
    `rate` Hz) -> (1, L, D)` tokens. `identity` names the encoder in the latent cache key."""
    rate: int
    channels: int
    encode: Callable
    identity: str = ""


def effective_fps(info: ClipInfo, target_fps: float) -> float:
    """The rate a window's frames are sampled at: the target rate, or the clip's own when the target is 0 or
    faster than the clip (data/video.source_indices)."""
    return target_fps if 0 < target_fps < info.fps else info.fps


def window_span(info: ClipInfo, target_fps: float, indices: list[int]) -> tuple[float, float]:
    """(start, duration) in seconds of the window whose source frames are `indices`: from its first frame's
    time, as long as its frames last at the rate they are sampled at (LTX2Pipeline: num_frames / frame_rate)."""
    fps = effective_fps(info, target_fps)
    return indices[0] / info.fps, len(indices) / fps


# later windows seek (an AAC track decoded from 0 takes ~0.4 s per 2 minutes): to a packet this much before the
# window, where the decoder's overlap settles; the samples then agree with a decode from 0 to within one output
# sample (exactly where the rates divide: 48 -> 16 kHz). A window always takes the same path: deterministic.
SEEK_AFTER_S = 30.0
SEEK_MARGIN_S = 1.0


def decode_audio(path: Path, start: float, duration: float, rate: int, channels: int) -> np.ndarray:
    """The clip's first audio track from `start` for `duration` seconds, as float32 (channels, samples) at
    `rate` Hz (mono becomes stereo and stereo mono as libswresample mixes them); padded with silence where the
    track ends early. Raises BadClip when the file has no audio track or it cannot be decoded."""
    import av
    first, count = round(start * rate), max(1, round(duration * rate))
    resampler = av.AudioResampler(format="fltp", layout="mono" if channels == 1 else "stereo", rate=rate)
    chunks: list[np.ndarray] = []
    got = 0
    try:
        with av.open(str(path)) as container:
            if not container.streams.audio:
                raise BadClip("no audio track")
            stream = container.streams.audio[0]
            seeking = start > SEEK_AFTER_S  # a late window of a long clip: seek near it instead of decoding from 0
            if seeking:
                container.seek(int((start - SEEK_MARGIN_S) / stream.time_base), stream=stream)
            for frame in container.decode(stream):
                if seeking:  # the samples count from the first decoded frame's time
                    seeking = False
                    if frame.pts is not None:
                        first = round((start - float(frame.pts * stream.time_base)) * rate)
                for out in resampler.resample(frame):
                    chunks.append(out.to_ndarray())
                    got += out.samples
                if got >= first + count:
                    break
            for out in resampler.resample(None):
                chunks.append(out.to_ndarray())
    except BadClip:
        raise
    except (av.FFmpegError, OSError, ValueError) as e:
        raise BadClip(f"cannot decode the audio track ({type(e).__name__}: {str(e).splitlines()[0][:120]})") from None
    audio = np.concatenate(chunks, axis=1) if chunks else np.zeros((channels, 0), np.float32)
    audio = audio.reshape(channels, -1)[:, first:first + count]
    if audio.shape[1] < count:
        audio = np.pad(audio, ((0, 0), (0, count - audio.shape[1])))
    return np.ascontiguousarray(audio, dtype=np.float32)


def window_audio(window, target_fps: float, indices: list[int], rate: int, channels: int) -> np.ndarray:
    """The audio of a clip window (data/video_scan.ClipWindow) whose source frames are `indices`."""
    start, duration = window_span(window.info, target_fps, indices)
    return decode_audio(window.path, start, duration, rate, channels)


def stack_cropped(tensors: list, dim: int):
    """Stack per-sample audio of a batch, cropped to the shortest along `dim` (clips sampled at their own
    frame rates may differ by a token or a few samples)."""
    import torch
    shortest = min(t.shape[dim] for t in tensors)
    return torch.stack([t.narrow(dim, 0, shortest) for t in tensors])
