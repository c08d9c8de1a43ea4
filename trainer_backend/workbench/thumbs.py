"""Thumbnails of the Datasets page: named by the file's content hash under the cache's thumbs/ folder,
written atomically, for images (index.py) and clips' first frames (clips.py)."""
from __future__ import annotations

import io
import os
from pathlib import Path

THUMB_SIDE = 256


def thumb_name(sha256: str) -> str:
    """A thumbnail's name under the cache's thumbs/ folder (it is named by the image's content)."""
    return f"{sha256[:2]}/{sha256}.jpg"


def thumb_path(cache: Path, sha256: str) -> Path:
    return Path(cache) / "thumbs" / thumb_name(sha256)


def write_thumbnail(img, target: Path) -> None:
    """A JPEG thumbnail of the PIL image (shrunk in place) at `target`, atomically (a reader never sees half)."""
    img.thumbnail((THUMB_SIDE, THUMB_SIDE))
    buffer = io.BytesIO()
    img.save(buffer, "JPEG", quality=82)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.write_bytes(buffer.getvalue())
    os.replace(tmp, target)
