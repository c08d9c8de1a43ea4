"""Generated images for the workbench's tests and bench: each a distinct smooth pattern (random
low-resolution noise scaled up), so perceptual hashes differ between images and survive resizing."""
from __future__ import annotations

import numpy as np
from PIL import Image


def pattern(seed: int, size: tuple[int, int] = (96, 96)) -> Image.Image:
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, (6, 6, 3), dtype=np.uint8)
    return Image.fromarray(small, "RGB").resize(size, Image.Resampling.BICUBIC)


def write_dataset(folder, count: int, size=(96, 96), caption: bool = True, start: int = 0) -> list:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(start, start + count):
        path = folder / f"img_{i:05d}.png"
        pattern(i, size).save(path)
        if caption:
            path.with_suffix(".txt").write_text(f"a photo, pattern {i}", encoding="utf-8")
        paths.append(path)
    return paths
