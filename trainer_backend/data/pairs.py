"""Paired control images (dataset.control_path, each subset's control_path; docs/dataset.md "Paired
control images"): each training image's control (reference) image for an edit model.

Matching: the control image of `<root>/<sub/folder>/<stem>.<ext>` is `<control_root>/<sub/folder>/<stem>.<any
image ext>` (the first in name order when several share the stem). A training image without its control
image is skipped, never trained without it: one warning per folder (the count and the first few names),
every file in the summary. Pixels (control_in_bucket): the control image is centre-cropped to its training
image's aspect (when it differs), resized to the size the training image is resized to, then cropped and
flipped exactly as the training image (data/dataset.py): a control image of the same size goes through the
very same operations, one of the same aspect stays aligned.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from PIL import Image

from ..config import ConfigError
from .buckets import Size
from .subsets import Group, SubsetSpec, walk_images

if TYPE_CHECKING:
    from .summary import ScanLog

NAMES_SHOWN = 5  # file names quoted in the grouped warning


def check_control_root(spec: SubsetSpec) -> None:
    """A control folder that is missing or not a folder stops the scan naming its key."""
    root = spec.control_root
    if root is not None and not root.is_dir():
        raise ConfigError(f"{spec.control_key}: {root} is not a folder (the control images, one per training image)")


def control_index(root: Path, problems: list[tuple[Path, str]]) -> dict[tuple[str, str], Path]:
    """(relative sub-folder, file stem) -> control image, for every image under `root`."""
    index: dict[tuple[str, str], Path] = {}
    for path in walk_images(root, problems):
        index.setdefault((path.relative_to(root).parent.as_posix(), path.stem), path)
    return index


def control_of(image: Path, spec: SubsetSpec, index: dict[tuple[str, str], Path]) -> Path | None:
    """The control image of `image` (None: there is none). An image outside its subset's root (a metadata
    record's absolute path) is matched by its name at the top of the control folder."""
    try:
        relative = image.relative_to(spec.root)
    except ValueError:
        relative = Path(image.name)
    return index.get((relative.parent.as_posix(), image.stem))


def pair_images(groups: list[Group], candidates: list, log: "ScanLog", problems: list[tuple[Path, str]]) -> list:
    """Set `control` on every candidate (with .path, .group, .control) of a paired folder; drop the ones
    without a control image, with one warning per folder. Unpaired folders and class images pass unchanged."""
    indexes: dict[Path, dict[tuple[str, str], Path]] = {}
    for group in groups:
        spec = group.spec
        if spec.control_root is not None and not spec.is_class and spec.control_root not in indexes:
            check_control_root(spec)
            indexes[spec.control_root] = control_index(spec.control_root, problems)
    kept, missing, totals = [], {}, {}
    for c in candidates:
        spec = groups[c.group].spec
        if spec.control_root is None or spec.is_class:
            kept.append(c)
            continue
        totals[spec.key] = totals.get(spec.key, 0) + 1
        c.control = control_of(c.path, spec, indexes[spec.control_root])
        if c.control is None:
            missing.setdefault(spec.key, (spec, []))[1].append(c.path)
        else:
            kept.append(c)
    for key, (spec, paths) in missing.items():
        names = ", ".join(p.name for p in paths[:NAMES_SHOWN]) + (", …" if len(paths) > NAMES_SHOWN else "")
        log.unpaired(spec.control_key, paths, f"no control image in {spec.control_root}")
        log.warn(f"{spec.control_key}: {len(paths)} of {totals[key]} images in {spec.root} have no control image "
                 f"(same file name) in {spec.control_root}; they are skipped, never trained without it: {names}")
    return kept


def control_in_bucket(img: Image.Image, target: Size, resized: Size) -> Image.Image:
    """The control image at `resized`, the size its training image (of size `target`) is resized to
    before the crop: the largest centred box of the training image's aspect (all of it when the aspects
    agree: a different aspect is cropped, never stretched), resized to exactly `resized` as the training
    image is, so a control image of the training image's own size goes through the very same resize."""
    (cw, ch), (tw, th) = img.size, target
    if cw * th > ch * tw:      # wider than the training image: keep the middle columns
        w = round(ch * tw / th)
        box = ((cw - w) // 2, 0, (cw - w) // 2 + w, ch)
    else:                      # taller (or the same aspect: the whole image)
        h = round(cw * th / tw)
        box = (0, (ch - h) // 2, cw, (ch - h) // 2 + h)
    if (box[2] - box[0], box[3] - box[1]) != (cw, ch):
        img = img.crop(box)
    return img.resize(resized, Image.Resampling.LANCZOS) if img.size != resized else img
