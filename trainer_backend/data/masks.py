"""Loss masks (loss.masked): where each training image's mask comes from and how it is rendered.

A subset's mask folder (dataset.mask_path, dataset.subsets[].mask_path) holds one image per
training image with the same file name stem (kohya's conditioning masks): white = train, black =
ignore, grey in between (its luminance is the weight). Without a folder the image's own alpha
channel is the mask. An image with no mask (no file of its stem, or no alpha channel) trains with
full weight, as in kohya's sd-scripts; the folders with missing masks are named once.

The mask goes through the image's own resize, crop and flip, so it stays on the pixels it
describes; the loss resizes it to the latent grid by area (diffusion/loss.py).
"""
from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageOps

from ..errors import ConfigError
from .buckets import resize_size
from .images import BadImage, _has_alpha, _open, is_image_name

LOG = logging.getLogger(__name__)
ALPHA = "alpha"   # the mask source of an image masked by its own alpha channel


def mask_key(spec) -> str:
    """The option a subset's mask folder comes from (for messages)."""
    return "dataset.mask_path" if spec.key == "dataset.path" else spec.key[:-len("path")] + "mask_path"


def _folder_index(spec) -> dict[str, Path]:
    folder = Path(spec.mask_path).expanduser()
    key = mask_key(spec)
    if not folder.is_dir():
        raise ConfigError(f"{key}: mask folder not found: {folder}")
    if folder.resolve().is_relative_to(spec.root.resolve()):
        raise ConfigError(f"{key}: {folder} is inside the dataset folder {spec.root}, where its masks would be "
                          f"trained on as images; keep the masks in a folder of their own")
    index: dict[str, Path] = {}
    for path in sorted(folder.iterdir()):
        if path.is_file() and is_image_name(path):
            index.setdefault(path.stem, path)
    return index


def mask_sources(scan) -> list[str | Path | None]:
    """Per scan item: its mask file, ALPHA (the image's alpha channel), or None (full weight: a mask
    folder without a file of its stem). Warns once per group with missing masks."""
    indexes: dict[str, dict[str, Path]] = {}
    sources: list[str | Path | None] = []
    missing: dict[int, int] = {}
    for item in scan.items:
        spec = scan.groups[item.group].spec
        if not spec.mask_path:
            sources.append(ALPHA)
            continue
        if spec.key not in indexes:
            indexes[spec.key] = _folder_index(spec)
        found = indexes[spec.key].get(item.path.stem)
        sources.append(found)
        if found is None:
            missing[item.group] = missing.get(item.group, 0) + 1
    for group, count in missing.items():
        g = scan.groups[group]
        total = sum(1 for item in scan.items if item.group == group)
        LOG.warning("%s: %d of %d images have no mask in %s; they train with full weight", g.folder, count, total,
                    g.spec.mask_path)
    return sources


def source_identity(source: str | Path | None) -> str:
    """What a cached latent's mask depends on beyond the image itself (part of the cache key)."""
    if isinstance(source, Path):
        from .cache import file_fingerprint
        try:
            return f"mask={file_fingerprint(source)}:{source.resolve()}"
        except OSError:
            return "mask=unreadable"
    return f"mask={source}"


def _mask_image(source: str | Path | None, image_path: Path, max_pixels: int) -> Image.Image | None:
    """The mask as an 8-bit greyscale image the size of the (upright) training image; None = full weight."""
    if source is None:
        return None
    img = _open(Path(image_path if source == ALPHA else source), max_pixels)
    try:
        img.load()
        img = ImageOps.exif_transpose(img)
        if source == ALPHA:
            if not _has_alpha(img):
                return None
            return img.convert("RGBA").getchannel("A")
        return img.convert("L")
    except BadImage:
        raise
    except Exception as e:
        raise BadImage(f"mask unreadable ({type(e).__name__}: {e})")
    finally:
        img.close()


def render_mask(source: str | Path | None, image_path: Path, image_size: tuple[int, int], bucket: tuple[int, int],
                crop: tuple[int, int], flip: bool, max_pixels: int) -> torch.Tensor:
    """[1, H, W] weights in [0, 1] for the bucket-sized crop the image trains on: the mask resized to
    the image's size (a mask folder's file may differ), then resized, cropped and flipped as the image is."""
    w, h = bucket
    try:
        mask = _mask_image(source, image_path, max_pixels)
    except BadImage as e:
        LOG.warning("%s: %s; it trains with full weight", source, e)
        mask = None
    if mask is None:
        return torch.ones(1, h, w)
    if mask.size != image_size:
        mask = mask.resize(image_size, Image.Resampling.BILINEAR)
    resized = resize_size(image_size[0], image_size[1], bucket)
    if mask.size != resized:
        mask = mask.resize(resized, Image.Resampling.BOX)  # area averaging, as the loss's latent resize
    top, left = crop
    mask = mask.crop((left, top, left + w, top + h))
    if flip:
        mask = mask.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return torch.from_numpy(np.asarray(mask, dtype=np.float32) / 255.0)[None]


def to_grid(mask: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """Masks [B, 1, H, W] (or [1, H, W]) resized by area to `size` (the latent grid)."""
    import torch.nn.functional as F
    batched = mask if mask.ndim == 4 else mask[None]
    if tuple(batched.shape[-2:]) != tuple(size):
        batched = F.interpolate(batched.float(), size=size, mode="area")
    return batched if mask.ndim == 4 else batched[0]
