"""Clips in a video family's dataset: the folders' clips as scan items (one per training window), their
samples, and their latents cached per window.

scan_dataset(cfg, video=video_options(cfg.dataset, family.frame_step)) adds, for every folder subset,
the clips under it (.mp4/.webm/.mov/.mkv/.m4v files, `<name>.frames/` image sequences; data/video.py)
as ImageItems with `clip` set to a data/video_scan.ClipWindow; images stay plain items (the family
encodes them as 1-frame clips). A clip that cannot be read or is too short is skipped with one line.
"""
from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path

from .buckets import BucketSpec, Size
from .captions import read_caption, split_tags
from .subsets import CONCEPT_DIR, Group
from .video import FRAMES_FOLDER_SUFFIX, VIDEO_EXTENSIONS, BadClip, probe_clip
from .video_scan import VideoOptions, _windows_of

LOG = logging.getLogger(__name__)


def video_options(ds, frame_step: int, seed: int = 0, audio_stream: bool = False) -> VideoOptions:
    """The [dataset] section's video_* options with the family's frame rule; `audio_stream`: the model has one
    (Family.audio_stream), so the clips' audio tracks train unless dataset.video_audio is off."""
    return VideoOptions(frame_step=frame_step, fps=ds.video_fps, max_frames=ds.video_frames,
                        clip_mode=ds.video_clip_mode, max_windows=ds.video_max_windows,
                        sequence_fps=ds.video_sequence_fps, caption_extension=ds.caption_extension, seed=seed,
                        frame_buckets=tuple(sorted(set(ds.video_frame_buckets))),
                        audio=audio_stream and ds.video_audio)


def planned_video_options(cfg) -> VideoOptions | None:
    """The scan's clip options for a config without loading its model (the plan, inspect, the studio): the
    family model.arch names, or the model given names (launch/model_size.planning_arch); None for an image
    family or one not known yet."""
    from ..families.registry import FAMILY_NAMES, entry
    from ..launch.model_size import planning_arch
    arch = planning_arch(cfg)
    known = entry(arch) if arch in FAMILY_NAMES else None
    step = known.frame_step if known is not None else 0
    return video_options(cfg.dataset, step, cfg.schedule.seed, known.audio_stream) if step else None


def is_clip_file(path: Path) -> bool:
    """A video file or an image-sequence folder (images are not clips here: the image scan has them)."""
    if path.is_dir():
        return path.name.lower().endswith(FRAMES_FOLDER_SUFFIX)
    return path.suffix.lower() in VIDEO_EXTENSIONS


def group_clips(group: Group) -> list[Path]:
    """The clips of a group's folder: the whole tree, except that a root with N_concept subfolders keeps
    only its own top-level clips (the subfolders are groups of their own), as images are grouped."""
    root = group.folder
    try:
        children = sorted(p for p in root.iterdir() if not p.name.startswith("."))
    except OSError:
        return []
    if root == group.spec.root and any(p.is_dir() and CONCEPT_DIR.match(p.name) for p in children):
        return [p for p in children if is_clip_file(p)]
    return _tree_clips(root)


def _tree_clips(folder: Path) -> list[Path]:
    out: list[Path] = []
    for entry in sorted(folder.iterdir()):
        if entry.name.startswith("."):
            continue
        if is_clip_file(entry):
            out.append(entry)
        elif entry.is_dir():
            out.extend(_tree_clips(entry))
    return out


def clip_items(groups: list[Group], opts: VideoOptions, spec: BucketSpec, buckets: list[Size], log,
               make_item) -> list:
    """Items (`make_item`: data/scan.ImageItem) of every window of the groups' clips (folder subsets; class
    folders hold images)."""
    items = []
    for index, group in enumerate(groups):
        if group.spec.is_class or group.spec.source != "folders":
            continue
        sep = group.spec.captions.separator
        for path in group_clips(group):
            try:
                info = probe_clip(path, opts.sequence_fps)
            except BadClip as e:
                log.skip(path, str(e), "bad_clip")
                continue
            caption = read_caption(path, group.spec.caption_extension).text or group.class_tokens
            windows = _windows_of(path, info, caption, opts, spec, buckets)
            if not windows:
                need = min(opts.frame_buckets) if opts.frame_buckets else 1
                log.skip(path, f"{info.frames} frames at {info.fps:g} fps give fewer than {need} at "
                               f"{opts.fps:g} fps", "short_clip")
                continue
            tags = tuple(split_tags(caption, sep))
            items += [make_item(path, caption, tags, sep, index, info.width, info.height, w.bucket, clip=w)
                      for w in windows]
    return items


def clip_summary(items: list, opts: VideoOptions) -> dict:
    """The clips in a scan: how many, their windows, seconds, audio tracks and frame buckets."""
    clips = {item.path: item.clip.info for item in items if item.clip is not None}
    windows = [item.clip for item in items if item.clip is not None]
    return {"clips": len(clips), "windows": len(windows),
            "duration_s": round(sum(info.duration for info in clips.values()), 2),
            "with_audio": sum(info.has_audio for info in clips.values()),
            "audio_trained": len({w.path for w in windows if w.audio}),
            "images_as_frames": sum(1 for item in items if item.clip is None and not item.is_class),
            "clip_mode": opts.clip_mode, "fps": opts.fps, "frame_rule": f"{opts.frame_step}k+1",
            "frame_buckets": dict(sorted(Counter(w.frame_bucket for w in windows).items()))}


def clip_sample(dataset, item, sample: dict, flip: bool, crop01: tuple[float, float]) -> None:
    """A clip window's pixels (3, F, H, W) in [-1, 1] (or its cached latents) into `sample`; a window that trains
    its audio track adds its audio: `audio_latents` (L, D) when cached, else `audio_waveform` (channels, samples)
    at the audio encoder's rate (data/audio.py)."""
    window = item.clip
    sample["crop_top_left"] = (0, 0)
    if dataset._clip_latents is not None:  # fixed at the first draw (a random window) while cached
        sample["latents"], std, conditions = dataset._clip_latents.get_entry(window, epoch=0)
        if std is not None:  # each step draws latents + std · eps, as the VAE would sample (diffusion/posterior.py)
            sample["latents_std"] = std
        conditions = dict(conditions)
        if "audio_latents" in conditions:  # the window's audio track (data/audio.py), read by diffusion/loss.py
            sample["audio_latents"] = conditions.pop("audio_latents")
        if conditions:  # what the step would build from the pixels (Family.pixel_conditions: I2V's first frame)
            sample["conditions"] = conditions
        return
    from .video_dataset import window_pixels
    spec = dataset._group(item)
    # a clip that breaks after the scan (deleted, rewritten) never stops the run: warn once and train this
    # sample on the next good clip of the same frame bucket, as images fall back
    same = _bucket_clips(dataset)[item.batch_bucket]
    start = next(n for n, k in enumerate(same) if dataset.items[k] is item)
    for k in same[start:] + same[:start]:
        if k in dataset._failed:
            continue
        source = dataset.items[k].clip
        try:
            indices = source.indices(dataset.video.fps, dataset.epoch, dataset.video.seed)
            sample["pixel_values"] = window_pixels(source, indices, spec.center_crop, crop01, flip)
            audio = dataset.audio
            if source.audio and audio is not None:
                import torch

                from .audio import window_audio
                wave = window_audio(source, dataset.video.fps, indices, audio.rate, audio.channels)
                sample["audio_waveform"] = torch.from_numpy(wave)
            return
        except (BadClip, OSError) as e:
            dataset._failed.add(k)
            LOG.warning("%s: skipped during training: %s (another clip of its frame bucket is used in its place)",
                        source.path, e)
    raise RuntimeError(f"dataset: every clip of frame bucket {window.frame_bucket} failed to load during training")


def _bucket_clips(dataset) -> dict[tuple, list[int]]:
    """Frame bucket -> the indices of its clip items (made once per dataset)."""
    found = getattr(dataset, "_clips_by_bucket", None)
    if found is None:
        found = {}
        for k, other in enumerate(dataset.items):
            if other.clip is not None:
                found.setdefault(other.batch_bucket, []).append(k)
        dataset._clips_by_bucket = found
    return found


def cache_clip_latents(dataset, encode, folder: Path | None, progress: bool, vae_id: str,
                       conditions: tuple[str, ...] = ()) -> int:
    """Encode every clip window once (flips off for clips while cached); returns how many were encoded.
    conditions: the names `encode` gives beside the latents (Family.pixel_conditions), cached with them."""
    from tqdm.auto import tqdm
    from .video_dataset import ClipLatents
    cache = ClipLatents(encode, vae_id, dataset.video, folder, conditions=conditions, audio=dataset.audio)
    windows = list(dict.fromkeys(item.clip for item in dataset.items if item.clip is not None))
    if any(dataset._group(item).flip for item in dataset.items if item.clip is not None):
        LOG.warning("dataset: clips are not flipped while their latents are cached")
    for window in tqdm(windows, desc="caching clip latents", disable=not progress, unit="clip"):
        cache.get(window, epoch=0)
    dataset._clip_latents = cache
    return cache.encoded
