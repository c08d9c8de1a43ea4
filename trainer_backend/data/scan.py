"""scan_dataset: config -> the usable images, their captions and buckets, and a summary.

Bad files never stop a run: each gets one warning naming it and is counted in the summary.
Only a missing dataset folder or a dataset with no usable image left is a ConfigError.
"""
from __future__ import annotations

import logging
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from ..config import ConfigError, TrainConfig
from ..launch.plan import DataCounts
from .buckets import BucketSpec, Size, assign_bucket, bucket_spec, make_buckets, too_small
from .captions import read_caption, split_tags
from .images import BadImage, load_rgb, probe
from .metadata import TagOptions, filter_reason, image_of, json_files, metadata_location, read_records, \
    transform_tags
from .pairs import check_reference_counts, pair_images
from .subsets import Group, SubsetSpec, check_root, class_spec, folder_groups, resolve_subsets, walk_images
from .summary import ScanLog, build_summary, data_counts

LOG = logging.getLogger(__name__)
MAX_WARNINGS_PER_KIND = 25  # the summary keeps every file; the log gets this many lines per kind


@dataclass
class ImageItem:
    """One usable image file (not expanded by repeats)."""
    path: Path
    caption: str                 # caption as read (class-token fallback applied)
    tags: tuple[str, ...]        # the caption as tags, for shuffle and tag dropout
    tag_separator: str           # joins tags back into a caption
    group: int                   # index into DatasetScan.groups
    width: int                   # after EXIF rotation
    height: int
    bucket: Size                 # target (width, height)
    is_class: bool = False
    control: Path | None = None  # the paired control image (data/pairs.py); None when the folder has none
    extra_controls: tuple[Path, ...] = ()  # the further reference images (numbered names), in order
    clip: object = None          # a clip's training window (data/video_scan.ClipWindow); None: an image

    @property
    def batch_bucket(self) -> tuple[int, ...]:
        """What batches never mix: the (width, height) bucket, and a clip's frame count after it (then 1 when
        its audio track trains: a batch never mixes clips with and without audio); an edit pair
        carries (0, its number of reference images) after its size, so a dataset of pairs and caption-only
        images (Family.control_images = "optional") never stacks the two kinds in one batch."""
        if self.clip is not None:
            return (*self.bucket, self.clip.frames) + ((1,) if self.clip.audio else ())
        return self.bucket if self.control is None else (*self.bucket, 0, 1 + len(self.extra_controls))

    @property
    def controls(self) -> tuple[Path, ...]:
        """Every reference image, in order (empty: unpaired)."""
        return () if self.control is None else (self.control, *self.extra_controls)


@dataclass
class DatasetScan:
    items: list[ImageItem]
    summary: dict
    counts: DataCounts
    warnings: list[str]
    groups: list[Group] = field(default_factory=list)
    buckets: list[Size] = field(default_factory=list)   # bucket id -> (w, h), the ones in use
    bucket_spec: BucketSpec | None = None
    class_samples: int = 0                              # class samples per epoch
    validation: list[ImageItem] = field(default_factory=list)
    video: object = None         # the clip options (data/video_scan.VideoOptions) of a video family's scan


@dataclass
class _Candidate:
    path: Path
    group: int
    caption: str
    tags: tuple[str, ...]
    separator: str
    is_class: bool
    caption_missing: bool = False
    caption_problem: str = ""
    control: Path | None = None
    extra_controls: tuple[Path, ...] = ()


def _folder_candidates(group: Group, index: int) -> list[_Candidate]:
    spec = group.spec
    out = []
    for path in group.files:
        missing, problem = False, ""
        if spec.is_class and spec.class_prompt:
            caption = spec.class_prompt
        else:
            read = read_caption(path, spec.caption_extension)
            missing, problem = read.text is None, read.problem
            if problem and not read.text and group.class_tokens:
                problem += f"; using '{group.class_tokens}'"
            caption = read.text or group.class_tokens
        sep = spec.captions.separator
        out.append(_Candidate(path, index, caption, tuple(split_tags(caption, sep)), sep, spec.is_class,
                              missing, problem))
    return out


def _report_captions(groups: list[Group], usable: list[_Candidate], log: ScanLog) -> None:
    """Caption warnings only for images that are actually used: one per file for empty or
    non-UTF-8 captions, one per group for missing caption files (often all of them, on purpose)."""
    missing: dict[int, list[Path]] = {}
    for c in usable:
        if c.caption_problem:
            log.add("caption", c.path, c.caption_problem)
        if c.caption_missing:
            missing.setdefault(c.group, []).append(c.path)
    for index, paths in missing.items():
        group = groups[index]
        spec = group.spec
        log.missing_captions[index] = [str(p) for p in paths]
        used = sum(1 for c in usable if c.group == index)
        fallback = f"using '{group.class_tokens}'" if group.class_tokens else "training them with an empty caption"
        log.warn(f"{group.folder}: {len(paths)} of {used} images have no {spec.caption_extension} caption; {fallback}")


def _metadata_candidates(spec: SubsetSpec, group_index: int, opts: TagOptions, separator: str, log: ScanLog,
                         problems: list[tuple[Path, str]]) -> tuple[list[_Candidate], int]:
    location = metadata_location(spec.root, spec.metadata_path, spec.key)
    records = read_records(json_files(location, problems), problems)
    out = []
    for record in records:
        reason = filter_reason(record, opts)
        if reason:
            log.filtered(record.source, reason)
            continue
        path, why = image_of(record, spec.root)
        if path is None:
            problems.append((record.source, why))
            continue
        tags = transform_tags(record, opts)
        out.append(_Candidate(path, group_index, separator.join(tags), tuple(tags), separator, False))
    return out, len(records)


def held_out_positions(n: int, every_nth: int, fraction: float = 0.0) -> set[int]:
    """Positions held out for validation: every Nth (1-based), else round(n × fraction) positions
    (at least 1, never all) spread evenly over the sorted list."""
    if every_nth:
        return {i for i in range(n) if (i + 1) % every_nth == 0}
    if fraction <= 0 or n < 2:
        return set()
    count = min(n - 1, max(1, round(n * fraction)))
    return {int((j + 0.5) * n / count) for j in range(count)}


def _split(candidates: list[_Candidate], every_nth: int, split: str,
           fraction: float = 0.0) -> tuple[list[_Candidate], list[_Candidate]]:
    held_at = held_out_positions(len(candidates), every_nth, fraction)
    if not held_at:
        return candidates, []
    train = [c for i, c in enumerate(candidates) if i not in held_at]
    held = [c for i, c in enumerate(candidates) if i in held_at]
    return (held, train) if split == "validation" else (train, held)


def _check(c: _Candidate, spec: BucketSpec, buckets: list[Size], max_pixels: int, background: str,
           verify: bool) -> tuple[ImageItem | None, BadImage | None, tuple[str, ...]]:
    try:
        info = probe(c.path, max_pixels, background)
        if too_small(info.width, info.height, spec):
            raise BadImage(f"too small ({info.width}×{info.height}; the minimum side is {spec.min_side}; "
                           f"lower dataset.bucket_min_side to keep it)", "too_small")
        bucket = assign_bucket(info.width, info.height, spec, buckets)
        if verify:
            load_rgb(c.path, max_pixels, background, draft=bucket).close()
    except BadImage as e:
        return None, e, ()
    for control in ((c.control, *c.extra_controls) if c.control is not None else ()):
        try:  # a pair is used whole or not at all
            probe(control, max_pixels, background)
            if verify:
                load_rgb(control, max_pixels, background).close()
        except BadImage as e:
            return None, BadImage(f"its control image {control} cannot be used: {e}", "bad_control"), ()
    item = ImageItem(c.path, c.caption, c.tags, c.separator, c.group, info.width, info.height, bucket, c.is_class,
                     c.control, c.extra_controls)
    return item, None, info.notes


def _gather(cfg: TrainConfig, log: ScanLog, problems: list[tuple[Path, str]]) -> tuple[list[Group],
                                                                                         list[_Candidate]]:
    ds = cfg.dataset
    groups: list[Group] = []
    candidates: list[_Candidate] = []
    opts = TagOptions.from_config(ds)
    for spec in resolve_subsets(ds):
        check_root(spec)
        if spec.source == "metadata":
            group = Group(spec.root.name or str(spec.root), spec, spec.repeats or spec.default_repeats, "")
            found, records = _metadata_candidates(spec, len(groups), opts, ds.tag_separator, log, problems)
            group.files = [c.path for c in found]
            log.records[group.name] = records
            groups.append(group)
            candidates += found
            continue
        for group in folder_groups(spec, problems, log.notes):
            groups.append(group)
            candidates += _folder_candidates(group, len(groups) - 1)
    cls = class_spec(ds)
    if cls is not None:
        if cls.root.is_dir():
            for group in folder_groups(cls, problems, log.notes):
                groups.append(group)
                candidates += _folder_candidates(group, len(groups) - 1)
        else:
            log.warn(f"{cls.root}: class image folder does not exist yet; no class images are used")
    return groups, candidates


def scan_dataset(cfg: TrainConfig, split: str = "train", video=None, captions_only: bool | None = None) -> DatasetScan:
    """Find, check and caption every image of the configured dataset. `split="validation"` returns
    the images held out by dataset.validation_every_nth instead of the training ones. `video` (a video
    family's data/video_scan.VideoOptions, data/video_items.video_options): the folders' clips train too,
    one item per window. `captions_only`: an image of a paired folder without its control image trains on its
    caption alone instead of being skipped (a model that generates and edits: Family.control_images =
    "optional"); None: as model.arch's registered family says (no: model.arch = auto)."""
    ds = cfg.dataset
    if captions_only is None:
        from ..config.control_rules import family_control_mode
        captions_only = family_control_mode(cfg.model.arch) == "optional"
    spec = bucket_spec(ds.resolution, ds.bucketing, ds.bucket_min_side, ds.bucket_max_side, ds.bucket_step,
                       ds.bucket_no_upscale)
    buckets = make_buckets(spec)
    log = ScanLog(MAX_WARNINGS_PER_KIND)
    problems: list[tuple[Path, str]] = []
    groups, found = _gather(cfg, log, problems)
    candidates = pair_images(groups, found, log, problems, keep_unpaired=captions_only)
    for path, reason in problems:
        kind = "symlink_loop" if "symlink loop" in reason else "unreadable" if "unreadable" in reason else "metadata"
        log.skip(path, reason, kind)

    instance = [c for c in candidates if not c.is_class]
    kept, held = _split(instance, ds.validation_every_nth, split, cfg.validation.fraction)
    todo = kept + [c for c in candidates if c.is_class]
    max_pixels = int(ds.max_image_megapixels * 1e6)
    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        results = list(pool.map(lambda c: _check(c, spec, buckets, max_pixels, ds.alpha_background,
                                                 ds.verify_images), todo))
    items: list[ImageItem] = []
    usable: list[_Candidate] = []
    for c, (item, bad, notes) in zip(todo, results):
        if bad is not None:
            log.skip(c.path, str(bad), bad.kind)
            continue
        for note in notes:
            log.repaired(c.path, note)
        items.append(item)
        usable.append(c)
    _report_captions(groups, usable, log)
    validation = [ImageItem(c.path, c.caption, c.tags, c.separator, c.group, 0, 0, buckets[0], control=c.control,
                            extra_controls=c.extra_controls)
                  for c in held]

    if video is not None and split == "train":
        from .video_items import clip_items
        items += clip_items(groups, video, spec, buckets, log, ImageItem)
    _require_usable(cfg, items, found, log)
    check_reference_counts(items, cfg.schedule.batch_size)
    # the plan counts class images that training will generate first, so it is right before they exist
    pending = _pending_class_images(cfg, spec, buckets) if split == "train" else []
    counted = pending + items
    class_samples = _class_samples(ds.class_samples, groups, counted)
    used = sorted({item.batch_bucket for item in counted}, key=lambda b: (b[0] / b[1], b[0], b[2:]))
    summary = build_summary(cfg, groups, counted, log, spec, class_samples, len(held))
    summary["class_images_to_generate"] = len(pending)
    if captions_only and summary["control_images"]:  # a dataset of edit pairs and plain captions
        summary["caption_only_images"] = summary["images"] - summary["control_images"]
    if pending:
        log.notes.append(f"{len(pending)} class images will be generated before training (dataset.num_class_images "
                         f"= {ds.num_class_images}); the plan counts them")
    counts = data_counts(groups, counted, class_samples, used)
    for note in log.notes:
        log.warn(note)
    if video is not None:
        from .video_items import clip_summary
        summary["video"] = clip_summary(items, video)
    return DatasetScan(items, summary, counts, log.finish(), groups, used, spec, class_samples, validation, video)


def _pending_class_images(cfg: TrainConfig, spec: BucketSpec, buckets: list[Size]) -> list[ImageItem]:
    """Stand-ins for the class images training will generate (dataset.num_class_images beyond the
    files in dataset.class_path): square at the resolution, first in scan order, as in the run's
    class-image folder (gen-*.png sorts before user-*). Counted, never loaded."""
    ds = cfg.dataset
    if not ds.num_class_images or not ds.class_prompt.strip():
        return []
    root = Path(ds.class_path).expanduser() if ds.class_path else None
    found = len(walk_images(root, [])) if root is not None and root.is_dir() else 0
    side = ds.resolution
    bucket = assign_bucket(side, side, spec, buckets)
    sep = ds.caption_separator
    tags = tuple(split_tags(ds.class_prompt, sep))
    return [ImageItem(Path(f"<class image {i} to generate>"), ds.class_prompt, tags, sep, -1, side, side, bucket,
                      is_class=True) for i in range(ds.num_class_images - found)]


def _class_samples(configured: int, groups: list[Group], items: list[ImageItem]) -> int:
    if not any(item.is_class for item in items):
        return 0
    if configured:
        return configured
    per_image = {i: g.repeats for i, g in enumerate(groups)}
    return sum(per_image[item.group] for item in items if not item.is_class)


def _require_usable(cfg: TrainConfig, items: list[ImageItem], candidates: list[_Candidate], log: ScanLog) -> None:
    if any(not item.is_class for item in items):
        return
    key = "dataset.path" if cfg.dataset.path else "dataset.subsets"
    where = cfg.dataset.path or ", ".join(s.path for s in cfg.dataset.subsets)
    if not any(not c.is_class for c in candidates):
        filtered = sum(log.filter_counts.values())
        extra = f" ({filtered} filtered out by the metadata filters)" if filtered else ""
        raise ConfigError(f"{key}: no images found in {where}{extra}")
    for warning in log.finish():  # the caller never gets the scan, so say why here
        LOG.warning(warning)
    reasons = ", ".join(f"{n} {kind.replace('_', ' ')}" for kind, n in sorted(log.skip_counts.items()))
    raise ConfigError(f"{key}: no usable image left in {where}: every image was skipped ({reasons}); "
                      f"see the warnings above")
