"""Generated clip datasets for the video tests: small mp4 clips of a coloured square moving over a plain
background, with same-named .txt captions (the image datasets' make_dataset, for clips)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

WORDS = ["red", "green", "blue", "yellow", "purple", "orange", "white", "black"]


def moving_square(frames: int, size: int, seed: int) -> np.ndarray:
    """(frames, size, size, 3) uint8: a square of one colour sliding right over a flat background."""
    rng = np.random.default_rng(seed)
    background, colour = rng.integers(0, 255, size=3), rng.integers(0, 255, size=3)
    out = np.tile(background, (frames, size, size, 1)).astype(np.uint8)
    side, y = size // 3, int(rng.integers(0, size // 2))
    for f in range(frames):
        x = (f * size // max(frames, 1)) % (size - side)
        out[f, y:y + side, x:x + side] = colour
    return out


def sine_tone(seconds: float, hz: float, rate: int = 16000, channels: int = 1) -> np.ndarray:
    """(channels, samples) float32: a sine tone at 0.3 of full scale."""
    t = np.arange(round(seconds * rate)) / rate
    return np.repeat((0.3 * np.sin(2 * np.pi * hz * t)).astype(np.float32)[None], channels, axis=0)


def clip_with_audio(path: Path, frames: int = 9, size: int = 32, fps: int = 16, rate: int = 16000,
                    seed: int = 4) -> Path:
    """An mp4 of a moving square with a 440 Hz mono AAC track as long as the clip."""
    from trainer_backend.data.video import write_clip
    write_clip(path, moving_square(frames, size, seed=seed), fps=fps, audio=(sine_tone(frames / fps, 440.0, rate), rate))
    return path


def make_clip_dataset(folder: Path, n: int = 3, size: int = 32, frames: int = 9, fps: int = 16,
                      audio: int = 0, rate: int = 16000) -> Path:
    """n mp4 clips (`clip000.mp4`, …) with captions 'a <colour> square on a plain background'; the first
    `audio` of them with a mono AAC track: a sine tone (220 Hz, 330 Hz, ...) as long as the clip."""
    from trainer_backend.data.video import write_clip
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        tone = (sine_tone(frames / fps, 220.0 * (i + 2) / 2, rate), rate) if i < audio else None
        write_clip(folder / f"clip{i:03d}.mp4", moving_square(frames, size, seed=i), fps=fps, audio=tone)
        (folder / f"clip{i:03d}.txt").write_text(f"a {WORDS[i % len(WORDS)]} square on a plain background")
    return folder
