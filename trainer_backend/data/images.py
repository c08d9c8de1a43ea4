"""Opening one image safely.

Every way a file can be bad becomes a `BadImage` with a short reason; everything that can be
repaired (CMYK, 16-bit, palette, alpha, EXIF rotation) is converted to 8-bit RGB and described
by a note, so the scan can warn once per file and the run goes on.
"""
from __future__ import annotations

import re
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from ..config.input_checks import IMAGE_EXTENSIONS  # noqa: F401 (one definition; the config checks use it too)

BACKGROUNDS = {"white": (255, 255, 255), "black": (0, 0, 0), "gray": (128, 128, 128)}
_ROTATING_ORIENTATIONS = {5, 6, 7, 8}  # EXIF orientations that swap width and height
_EXIF_ORIENTATION = 0x0112


class BadImage(Exception):
    """The file cannot be used; str() is the reason (without the path), `kind` its category for
    the summary: not_image, unreadable, corrupt, enormous, too_small."""

    def __init__(self, reason: str, kind: str = "corrupt"):
        super().__init__(reason)
        self.kind = kind


@dataclass(frozen=True)
class ImageInfo:
    width: int            # after EXIF rotation
    height: int
    notes: tuple[str, ...]  # repairs that loading applies, e.g. "CMYK converted to RGB"


def is_image_name(path: Path) -> bool:
    return path.suffix.lower() in IMAGE_EXTENSIONS


def _allow_pixels(max_pixels: int) -> None:
    # PIL refuses images above 2 × MAX_IMAGE_PIXELS on its own; our limit is checked from the
    # header, so only ever raise PIL's to keep a user's larger limit usable.
    if Image.MAX_IMAGE_PIXELS is not None and max_pixels > Image.MAX_IMAGE_PIXELS:
        Image.MAX_IMAGE_PIXELS = max_pixels


def _open(path: Path, max_pixels: int) -> Image.Image:
    _allow_pixels(max_pixels)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            img = Image.open(path)
    except Image.DecompressionBombError as e:
        found = re.search(r"\((\d+) pixels\)", str(e))
        size = f"{int(found.group(1)) / 1e6:.0f} megapixels" if found else "over PIL's limit"
        raise BadImage(f"image is enormous ({size}, limit {max_pixels / 1e6:.0f}; decompression-bomb guard)",
                       "enormous")
    except UnidentifiedImageError:
        raise BadImage("not an image (unrecognised content despite the extension)", "not_image")
    except OSError as e:
        raise BadImage(f"unreadable ({e.strerror or e})", "unreadable")
    except Exception as e:  # PIL plugins raise a zoo of errors on hostile headers
        raise BadImage(f"cannot be opened ({type(e).__name__}: {e})")
    w, h = img.size
    if w <= 0 or h <= 0:
        img.close()
        raise BadImage("has zero width or height", "corrupt")
    if w * h > max_pixels:
        img.close()
        raise BadImage(f"image is enormous ({w}×{h} = {w * h / 1e6:.0f} megapixels, limit "
                       f"{max_pixels / 1e6:.0f}; decompression-bomb guard)", "enormous")
    return img


def _orientation(img: Image.Image) -> int:
    try:
        return int(img.getexif().get(_EXIF_ORIENTATION, 1) or 1)
    except Exception:
        return 1


def _raw_is_16bit(img: Image.Image) -> bool:
    if img.mode in ("I;16", "I;16B", "I;16L", "I;16N", "I"):
        return True
    try:
        raw = img.tile[0].args[0] if img.tile else ""
        raw = raw if isinstance(raw, str) else raw[0]
    except Exception:
        return False
    return ";16" in str(raw)


def _notes(img: Image.Image, background: str) -> tuple[str, ...]:
    notes = []
    orientation = _orientation(img)
    if orientation not in (0, 1):
        notes.append(f"rotated upright by its EXIF orientation ({orientation})")
    if img.mode == "CMYK":
        notes.append("CMYK converted to RGB")
    if _raw_is_16bit(img):
        notes.append("16-bit image reduced to 8-bit")
    if img.mode in ("P", "PA"):
        notes.append("palette image converted to RGB")
    if _has_alpha(img):
        notes.append(f"transparency composited on a {background} background")
    return tuple(notes)


def _has_alpha(img: Image.Image) -> bool:
    return img.mode in ("RGBA", "LA", "PA", "RGBa", "La") or (img.mode in ("P", "L", "RGB") and
                                                               "transparency" in img.info)


def probe(path: Path, max_pixels: int, background: str = "white") -> ImageInfo:
    """Read the header only: size after EXIF rotation and the repairs loading will make."""
    img = _open(path, max_pixels)
    try:
        w, h = img.size
        if _orientation(img) in _ROTATING_ORIENTATIONS:
            w, h = h, w
        return ImageInfo(w, h, _notes(img, background))
    finally:
        img.close()


def _sixteen_to_eight(img: Image.Image) -> Image.Image:
    arr = np.asarray(img)
    if arr.dtype != np.uint8:
        top = 65535 if arr.max(initial=0) > 255 or img.mode.startswith("I;16") else 255
        arr = np.clip(arr.astype(np.float64) * (255.0 / top), 0, 255).round().astype(np.uint8)
    return Image.fromarray(arr, "L")


def to_rgb(img: Image.Image, background: str = "white") -> Image.Image:
    """Any PIL image -> 8-bit RGB: EXIF rotation applied, palette expanded, alpha composited."""
    img = ImageOps.exif_transpose(img)
    if img.mode in ("I;16", "I;16B", "I;16L", "I;16N", "I"):
        img = _sixteen_to_eight(img)
    if img.mode == "F":
        img = img.convert("L")
    if img.mode in ("P", "PA"):
        img = img.convert("RGBA" if _has_alpha(img) else "RGB")
    if _has_alpha(img):
        rgba = img.convert("RGBA")
        canvas = Image.new("RGBA", rgba.size, BACKGROUNDS[background] + (255,))
        img = Image.alpha_composite(canvas, rgba)
    return img if img.mode == "RGB" else img.convert("RGB")


def load_rgb(path: Path, max_pixels: int, background: str = "white", draft: tuple[int, int] | None = None
             ) -> Image.Image:
    """Fully decode an image to RGB. `draft` (w, h) lets JPEG decode at a reduced size that is
    still at least that large (much faster for verification). Raises BadImage."""
    img = _open(path, max_pixels)
    try:
        if draft is not None and img.format == "JPEG":
            img.draft("RGB", draft)
        img.load()
        return to_rgb(img, background)
    except BadImage:
        raise
    except MemoryError:
        raise BadImage("too large to decode in memory", "enormous")
    except Exception as e:
        reason = str(e) or type(e).__name__
        if "truncated" in reason.lower():
            raise BadImage(f"truncated or corrupt ({reason})")
        raise BadImage(f"corrupt ({type(e).__name__}: {reason})")
    finally:
        img.close()
