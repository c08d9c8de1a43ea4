"""Helpers shared by the dataset tests: tiny generated images and configs (no tests here)."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from PIL import Image

from trainer_backend.config import from_dict


def write_image(path: Path, width: int = 64, height: int = 64, seed: int = 0, mode: str = "RGB",
                fmt: str | None = None, **save_kwargs) -> Path:
    """A small image with a random colour block on a random background (distinct per seed)."""
    rng = np.random.default_rng(seed)
    arr = np.empty((height, width, 3), np.uint8)
    arr[:] = rng.integers(0, 255, 3)
    arr[height // 4: height // 2, width // 4: width // 2] = rng.integers(0, 255, 3)
    path.parent.mkdir(parents=True, exist_ok=True)
    img = Image.fromarray(arr)
    if mode != "RGB":
        img = img.convert(mode)
    img.save(path, format=fmt, **save_kwargs)
    return path


def left_right_image(path: Path, size: int = 64) -> Path:
    """Left half red, right half blue: a flip is visible in the first pixel column."""
    arr = np.zeros((size, size, 3), np.uint8)
    arr[:, : size // 2] = (255, 0, 0)
    arr[:, size // 2:] = (0, 0, 255)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(arr).save(path)
    return path


def caption(image: Path, text: str, ext: str = ".txt") -> None:
    image.with_suffix(ext).write_text(text, encoding="utf-8")


def config(dataset: dict, **sections):
    """A config with resolution 64 and the given [dataset] keys (plus other sections)."""
    data = {"dataset": {"resolution": 64, **dataset}, "schedule": {"seed": 1}}
    for name, values in sections.items():
        data.setdefault(name, {}).update(values)
    return from_dict(data)


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file below folder with its size and mtime: proof that nothing was written."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = p.lstat()
            out[str(p.relative_to(folder))] = (st.st_size, st.st_mtime_ns)
    return out
