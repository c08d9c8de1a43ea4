"""Paired control images (dataset.control_path, each subset's control_path; docs/dataset.md "Paired
control images"): each training image's control (reference) image for an edit model.

Matching: the control image of `<root>/<sub/folder>/<stem>.<ext>` is `<control_root>/<sub/folder>/<stem>.<any
image ext>` (the first in name order when several share the stem). Several reference images (a model that
takes more than one, Family.max_control_images): `<stem>_0.<ext>`, `<stem>_1.<ext>`, … in the same place,
numbered from 0 without gaps (the first gap ends them); a plain `<stem>.<ext>` wins and means one
reference. A training image without its control image is skipped, never trained without it: one
warning per folder (the count and the first few names), every file in the summary; except for a
model that generates and edits (Family.control_images = "optional", e.g. Qwen-Image 2.1): there it
trains on its caption alone (a caption-only item), and batches never mix the two kinds
(ImageItem.batch_bucket). Pixels (control_in_bucket):
each control image is centre-cropped to its training image's aspect (when it differs), resized to the size
the training image is resized to, then cropped and flipped exactly as the training image
(data/dataset.py): a control image of the same size goes through the very same operations, one of the same
aspect stays aligned. A sample holds its references one after another along the channels
(`control_pixel_values` [3·N, H, W], `control_latents` [C·N, h, w]); per_reference splits them.
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


def highest_numbers(index: dict[tuple[str, str], Path]) -> dict[tuple[str, str], int]:
    """(sub-folder, stem) -> the highest N among its numbered control images `<stem>_N.*`."""
    out: dict[tuple[str, str], int] = {}
    for folder, stem in index:
        base, sep, number = stem.rpartition("_")
        if sep and number.isdigit():
            out[(folder, base)] = max(out.get((folder, base), -1), int(number))
    return out


def controls_of(image: Path, spec: SubsetSpec, index: dict[tuple[str, str], Path],
                highest: dict[tuple[str, str], int] | None = None) -> tuple[Path, ...]:
    """The control images of `image`, in order (empty: there is none, or a numbered one is missing):
    `<stem>.*`, else `<stem>_0.*`, `<stem>_1.*`, … without a gap up to the highest number there
    (`highest`: highest_numbers(index)). An image outside its subset's root (a metadata record's absolute
    path) is matched by its name at the top of the control folder."""
    try:
        relative = image.relative_to(spec.root)
    except ValueError:
        relative = Path(image.name)
    folder = relative.parent.as_posix()
    if (folder, image.stem) in index:
        return (index[(folder, image.stem)],)
    found: list[Path] = []
    while (folder, f"{image.stem}_{len(found)}") in index:
        found.append(index[(folder, f"{image.stem}_{len(found)}")])
    top = (highest if highest is not None else highest_numbers(index)).get((folder, image.stem), -1)
    return tuple(found) if len(found) > top else ()  # a gap: a reference is missing, never trained without it


def pair_images(groups: list[Group], candidates: list, log: "ScanLog", problems: list[tuple[Path, str]],
                keep_unpaired: bool = False) -> list:
    """Set `control` (and `extra_controls`) on every candidate (with .path, .group, .control, .extra_controls)
    of a paired folder; drop the ones without their control images, with one warning per folder
    (`keep_unpaired`: keep them as caption-only items, with one note per folder). Unpaired folders and
    class images pass unchanged."""
    indexes: dict[Path, dict[tuple[str, str], Path]] = {}
    numbers: dict[Path, dict[tuple[str, str], int]] = {}
    for group in groups:
        spec = group.spec
        if spec.control_root is not None and not spec.is_class and spec.control_root not in indexes:
            check_control_root(spec)
            indexes[spec.control_root] = control_index(spec.control_root, problems)
            numbers[spec.control_root] = highest_numbers(indexes[spec.control_root])
    kept, missing, totals = [], {}, {}
    for c in candidates:
        spec = groups[c.group].spec
        if spec.control_root is None or spec.is_class:
            kept.append(c)
            continue
        totals[spec.key] = totals.get(spec.key, 0) + 1
        controls = controls_of(c.path, spec, indexes[spec.control_root], numbers[spec.control_root])
        c.control, c.extra_controls = (controls[0], controls[1:]) if controls else (None, ())
        if c.control is None:
            missing.setdefault(spec.key, (spec, []))[1].append(c.path)
        if c.control is not None or keep_unpaired:
            kept.append(c)
    for key, (spec, paths) in missing.items():
        names = ", ".join(p.name for p in paths[:NAMES_SHOWN]) + (", …" if len(paths) > NAMES_SHOWN else "")
        if keep_unpaired:
            log.notes.append(f"{spec.control_key}: {len(paths)} of {totals[key]} images in {spec.root} have no control "
                             f"image and train on their captions alone (the model generates and edits): {names}")
            continue
        log.unpaired(spec.control_key, paths, f"no control image in {spec.control_root}")
        log.warn(f"{spec.control_key}: {len(paths)} of {totals[key]} images in {spec.root} have no control image "
                 f"(same file name; or <name>_0, <name>_1, … without a gap) in {spec.control_root}; they are "
                 f"skipped, never trained without it: {names}")
    return kept


def check_reference_counts(items: list, batch_size: int) -> None:
    """A batch stacks its samples' references: with batch_size > 1 every paired image needs as many."""
    counts: dict[int, Path] = {}
    for item in items:
        if item.control is not None:
            counts.setdefault(1 + len(item.extra_controls), item.path)
    if len(counts) > 1 and batch_size > 1:
        shown = ", ".join(f"{path.name}: {n}" for n, path in sorted(counts.items()))
        raise ConfigError(f"schedule.batch_size: the paired images have different numbers of reference images "
                          f"({shown}); a batch stacks them, so give every image as many, or set batch_size = 1")


def check_reference_limit(items: list, groups: list[Group], limit: int, label: str) -> None:
    """Refuse an image with more reference images than the model takes (Family.max_control_images)."""
    for item in items:
        if item.control is not None and 1 + len(item.extra_controls) > limit:
            names = ", ".join(p.name for p in (item.control, *item.extra_controls))
            raise ConfigError(f"{groups[item.group].spec.control_key}: {item.path.name} has "
                              f"{1 + len(item.extra_controls)} reference images ({names}); {label} takes "
                              + ("one (name it like its image)" if limit == 1 else f"at most {limit}"))


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


def per_reference(stacked, channels: int):
    """[B, N·channels, H, W] (a batch's N reference images one after another along the channels, as
    samples hold them) -> [B·N, channels, H, W], sample by sample; N = 1 is the tensor itself."""
    b, total, h, w = stacked.shape
    return stacked.reshape(b * (total // channels), channels, h, w)


def joined_references(per_ref, batch: int):
    """The inverse of per_reference: [B·N, C, h, w] -> [B, N·C, h, w]."""
    n, c, h, w = per_ref.shape
    return per_ref.reshape(batch, (n // batch) * c, h, w)
