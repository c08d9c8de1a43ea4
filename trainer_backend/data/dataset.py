"""TrainDataset: samples (images × repeats + class samples) -> tensors, reproducibly.

Every random choice of a sample (flip, random crop, caption dropout, tag shuffle/dropout) comes
from an rng seeded by (seed, epoch, index), so an epoch is the same however it is split across
workers and processes, and a resumed run sees exactly the samples it would have seen.
"""
from __future__ import annotations

import logging
import random
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from PIL import Image

from ..config import TrainConfig
from ..launch.plan import DataCounts
from .buckets import resize_size, train_crop
from .cache import (DiskLatents, check_outside, file_fingerprint, latent_key, pad_text_entries, split_text_outputs,
                    unpack_encoded)
from .captions import augment_caption
from .images import BadImage, load_rgb
from .masks import mask_sources, render_mask, source_identity, to_grid
from .pairs import control_in_bucket, joined_references, per_reference
from .scan import DatasetScan, ImageItem
from .summary import class_sample_items, counted_groups

LOG = logging.getLogger(__name__)


def _fingerprint(path: Path) -> str:
    try:
        return file_fingerprint(path)
    except OSError:
        return "unreadable"


def to_tensor(img: Image.Image) -> torch.Tensor:
    """8-bit RGB PIL image -> float32 [3, H, W] in [-1, 1]."""
    arr = np.asarray(img, dtype=np.uint8)
    return torch.from_numpy(arr.copy()).permute(2, 0, 1).float().div_(127.5).sub_(1.0)


class TrainDataset(torch.utils.data.Dataset):
    """Samples of one epoch. `counts` (default scan.counts) sets the repeats per subset and the
    class samples; pass plan.multi_counts when the plan divides repeats across processes."""

    def __init__(self, scan: DatasetScan, cfg: TrainConfig, counts: DataCounts | None = None):
        ds = cfg.dataset
        self.scan = scan
        self.items: list[ImageItem] = scan.items
        self.seed = cfg.schedule.seed
        self.background = ds.alpha_background
        self.max_pixels = int(ds.max_image_megapixels * 1e6)
        self.cache_both_flips = ds.cache_both_flips
        self.epoch = 0
        bucket_ids = {b: i for i, b in enumerate(scan.buckets)}
        counts = counts or scan.counts
        order = counted_groups(scan.groups, scan.items)
        if [name for name, _, _ in counts.subsets] != [scan.groups[i].name for i in order]:
            raise ValueError("TrainDataset: counts.subsets do not match the scan's subsets")
        repeats = {group: r for group, (_, _, r) in zip(order, counts.subsets)}
        samples: list[int] = []
        for idx, item in enumerate(self.items):
            if not item.is_class:
                samples += [idx] * repeats[item.group]
        samples += class_sample_items(self.items, counts.class_images)
        self.sample_items = samples                                   # dataset index -> item index
        self.sample_buckets = [bucket_ids[self.items[k].batch_bucket] for k in samples]
        self.bucket_sizes = list(scan.buckets)                        # bucket id -> (w, h[, clip frames])
        self.video = scan.video                                       # clip options (video families)
        self._clip_latents = None                                     # data/video_dataset.ClipLatents
        self.audio = None  # the run's audio encoder (data/audio.AudioEncoding) for clips that train their audio
        self._flip_allowed = True
        self._latents: dict[tuple[int, bool], torch.Tensor] | None = None
        self._latent_keys: dict[tuple[int, bool], str] = {}
        self._control_latents: dict[tuple[int, bool], torch.Tensor] = {}   # paired images' control latents
        self._latent_stds: dict[tuple[int, bool], torch.Tensor] = {}  # the posterior's std (diffusion/posterior.py)
        self._latent_conditions: dict[tuple[int, bool], dict] = {}  # Family.pixel_conditions, cached with latents
        self._condition_names: tuple[str, ...] = ()
        self._control_keys: dict[tuple[int, bool], str] = {}
        self._disk: DiskLatents | None = None
        self._fixed_crops: dict[int, tuple[int, int]] = {}
        self._text: dict[str, object] | None = None
        self._text_pairs = True   # the text cache covers edit pairs too (cache_text(pairs=False): caption-only items)
        self._pair_text: dict | None = None  # (item, flip, caption) -> an edit pair's text read with its control
        self._failed: set[int] = set()
        # loss.masked: per item, where its mask comes from (data/masks.py); masks cached with latents
        self._mask_sources = mask_sources(scan) if cfg.loss.masked else None
        self._masks: dict[tuple[int, bool], torch.Tensor] = {}

    # ------------------------------------------------------------------ sampling

    def __len__(self) -> int:
        return len(self.sample_items)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _rng(self, index: int) -> random.Random:
        # string seeds hash with sha512: stable across processes and PYTHONHASHSEED
        return random.Random(f"{self.seed}:{self.epoch}:{index}")

    def _group(self, item: ImageItem):
        return self.scan.groups[item.group].spec

    def caption_for(self, index: int) -> str:
        """The caption dataset[index] trains with this epoch (without loading the image)."""
        return self._sample_plan(index)[2]

    def _sample_plan(self, index: int) -> tuple[bool, tuple[float, float], str]:
        item = self.items[self.sample_items[index]]
        spec = self._group(item)
        rng = self._rng(index)
        flip = rng.random() < 0.5 and spec.flip and self._flip_allowed
        crop01 = (rng.random(), rng.random())
        aug = spec.captions
        if aug.dropout or (aug.shuffle and aug.shuffle_p) or aug.tag_dropout:
            caption = augment_caption(item.caption, list(item.tags), aug, rng, item.tag_separator)
        else:
            caption = item.caption
        return flip, crop01, caption

    def __getitem__(self, index: int) -> dict:
        item_idx = self.sample_items[index]
        item = self.items[item_idx]
        flip, crop01, caption = self._sample_plan(index)
        sample: dict = {"caption": caption, "is_class": item.is_class,
                        "original_size": (item.height, item.width),
                        "target_size": (item.bucket[1], item.bucket[0])}
        if item.clip is not None:  # a clip window: (3, F, H, W) pixels or its cached latents
            from .video_items import clip_sample
            clip_sample(self, item, sample, flip, crop01)
        elif self._latents is not None or self._disk is not None:
            top, left = self._crop_of(item_idx, item, crop01)
            sample["latents"] = self._cached_latents(item_idx, flip)
            std = self._cached_std(item_idx, flip)
            if std is not None:  # the step draws latents + std · eps, as the VAE would sample
                sample["latents_std"] = std
            if self._condition_names:  # what the step would build from the pixels (Family.pixel_conditions)
                sample["conditions"] = self._cached_conditions(item_idx, flip)
            if item.control is not None:
                sample["control_latents"] = self._cached_latents(item_idx, flip, control=True)
            sample["crop_top_left"] = self._flipped_crop(item, (top, left), flip)
            if self._mask_sources is not None:
                sample["mask"] = self._cached_mask(item_idx, flip)
        else:
            pixels, control, crop = self._pixels_with_fallback(item_idx, crop01, flip)
            sample["pixel_values"], sample["crop_top_left"] = pixels, crop
            if self._mask_sources is not None:
                sample["mask"] = self.mask(item_idx, self._crop_of(item_idx, item, crop01), flip)
            if control is not None:  # the same resize, crop and flip as pixel_values (data/pairs.py)
                sample["control_pixel_values"] = control
        if self._text is not None and (item.control is None or self._text_pairs):
            sample["text"] = self._text[caption]
        elif self._pair_text is not None and item.control is not None:  # cache_pair_text: per pair and flip
            sample["text"] = self._pair_text[(item_idx, flip and self._flip_allowed, caption)]
        return sample

    # ------------------------------------------------------------------ pixels

    def _crop_of(self, item_idx: int, item: ImageItem, crop01: tuple[float, float]) -> tuple[int, int]:
        """(top, left) in the resized image; fixed per image once latents are cached."""
        if item_idx in self._fixed_crops:
            return self._fixed_crops[item_idx]
        crop = train_crop(item.width, item.height, item.bucket, self._group(item).center_crop, crop01)
        return crop.top, crop.left

    @staticmethod
    def _flipped_crop(item: ImageItem, crop: tuple[int, int], flip: bool, source: ImageItem | None = None
                      ) -> tuple[int, int]:
        # SDXL's crop conditioning describes the crop in the image the model actually saw
        if not flip:
            return crop
        src = source or item
        resized = resize_size(src.width, src.height, item.bucket)
        return crop[0], resized[0] - crop[1] - item.bucket[0]

    def render(self, item: ImageItem, crop: tuple[int, int], flip: bool, source: ImageItem | None = None
               ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Load `source` (default: item), resize to cover item's bucket, crop, flip -> tensor; and the
        same for its control images (None when it has none), each placed at the training image's resized
        size first (data/pairs.py), so all get exactly the same crop and flip: [3·N, H, W] for N references."""
        src = source or item
        img = load_rgb(src.path, self.max_pixels, self.background)
        resized = resize_size(img.width, img.height, item.bucket)
        controls = [control_in_bucket(load_rgb(path, self.max_pixels, self.background), img.size, resized)
                    for path in src.controls]
        if (img.width, img.height) != resized:
            img = img.resize(resized, Image.Resampling.LANCZOS)
        control = torch.cat([self._crop_flip(c, item.bucket, crop, flip) for c in controls]) if controls else None
        return self._crop_flip(img, item.bucket, crop, flip), control

    @staticmethod
    def _crop_flip(img: Image.Image, bucket, crop: tuple[int, int], flip: bool) -> torch.Tensor:
        top, left = crop
        img = img.crop((left, top, left + bucket[0], top + bucket[1]))
        if flip:
            img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        return to_tensor(img)

    def mask(self, item_idx: int, crop: tuple[int, int], flip: bool) -> torch.Tensor:
        """[1, H, W] loss weights of item `item_idx` rendered like its pixels (loss.masked)."""
        item = self.items[item_idx]
        return render_mask(self._mask_sources[item_idx], item.path, (item.width, item.height), item.bucket, crop,
                           flip, self.max_pixels)

    def _pixels_with_fallback(self, item_idx: int, crop01, flip: bool
                              ) -> tuple[torch.Tensor, torch.Tensor | None, tuple[int, int]]:
        """(pixels, control pixels or None, crop). A file that breaks after the scan (deleted,
        rewritten; the control image too) never stops the run: warn once and train this sample on
        the next good image (pair), rendered into the same bucket."""
        item = self.items[item_idx]
        crop = self._crop_of(item_idx, item, crop01)
        for step in range(len(self.items)):
            k = (item_idx + step) % len(self.items)
            if k in self._failed:
                continue
            source = self.items[k]
            fallback = train_crop(source.width, source.height, item.bucket, True, crop01)
            use_crop = crop if k == item_idx else (fallback.top, fallback.left)
            try:
                return (*self.render(item, use_crop, flip, source), self._flipped_crop(item, use_crop, flip, source))
            except BadImage as e:
                self._failed.add(k)
                LOG.warning("%s: skipped during training: %s (a different image is used in its place)",
                            source.path, e)
        raise RuntimeError("dataset: every image failed to load during training")

    # ------------------------------------------------------------------ latent cache

    def cache_latents(self, encode: Callable[[torch.Tensor], torch.Tensor], cache_dir: Path | None = None,
                      progress: bool = True, vae_id: str = "", batch_size: int = 4,
                      conditions: tuple[str, ...] = ()) -> None:
        """Encode every image once (both orientations when flip is on and dataset.cache_both_flips)
        and serve latents from memory, or from safetensors files in cache_dir (reused across runs).
        Random crops are frozen per image while cached. A paired image's control image is encoded with
        it (the same crop and flip; `encode` gives the posterior mean) under a key of its own file.
        `conditions`: the names of the conditions `encode` gives beside the latents (data/cache.unpack_encoded;
        Family.pixel_condition_names), stored with them and served as sample["conditions"]."""
        self._condition_names = tuple(conditions)
        from tqdm.auto import tqdm

        any_flip = any(self._group(item).flip for item in self.items)
        if any_flip and not self.cache_both_flips:
            self._flip_allowed = False
            LOG.warning("dataset: flip is disabled while latents are cached (dataset.cache_both_flips is off)")
        if any(not self._group(item).center_crop for item in self.items):
            LOG.warning("dataset: random crop is fixed per image while latents are cached")
        roots = [g.spec.root for g in self.scan.groups]
        if cache_dir is not None:
            check_outside(Path(cache_dir), roots)
            self._disk = DiskLatents(Path(cache_dir))
        memory: dict[tuple[int, bool], torch.Tensor] = {}
        todo: dict[tuple[int, int], list[tuple[int, bool, str, str]]] = {}
        for idx, item in enumerate(self.items):
            if item.clip is not None:  # clips: cached per window below (data/video_items.py)
                continue
            crop_rng = random.Random(f"{self.seed}:crop:{idx}")
            crop = self._crop_of(idx, item, (crop_rng.random(), crop_rng.random()))
            self._fixed_crops[idx] = crop
            flips = (False, True) if self._group(item).flip and self._flip_allowed else (False,)
            fingerprint = _fingerprint(item.path)
            # every reference file's identity (one reference: the key it always had)
            control_print = "|".join(_fingerprint(p) for p in item.controls) + "".join(
                f"|{p.resolve()}" for p in item.extra_controls)
            resized = resize_size(item.width, item.height, item.bucket)
            for flip in flips:
                mask_id = source_identity(self._mask_sources[idx]) if self._mask_sources is not None else ""
                key = latent_key(fingerprint, item.path, item.bucket, resized, crop, flip, vae_id, self.background,
                                 mask=mask_id)
                self._latent_keys[(idx, flip)] = key
                control_key = ""
                if item.control is not None:  # its own file's identity: an edited control image is re-encoded
                    control_key = latent_key(control_print, item.control, item.bucket, resized, crop, flip, vae_id,
                                             self.background, role="control")
                    self._control_keys[(idx, flip)] = control_key
                if self._disk is None or not all(self._disk.has(k) for k in (key, control_key) if k) or (
                        conditions and not self._disk.has_conditions(key, conditions)):
                    todo.setdefault(item.bucket, []).append((idx, flip, key, control_key))
        total = sum(len(v) for v in todo.values())
        bar = tqdm(total=total, desc="caching latents", disable=not progress or total == 0, unit="img")
        for jobs in todo.values():
            for start in range(0, len(jobs), batch_size):
                chunk = jobs[start:start + batch_size]
                rendered = [self._pixels_with_fallback(idx, (0.5, 0.5), flip)[:2] for idx, flip, _, _ in chunk]
                with torch.no_grad():
                    latents, stds, conds = _unpacked(encode(torch.stack([pixels for pixels, _ in rendered])))
                    controls = self._encode_controls(encode, [control for _, control in rendered])
                for j, ((idx, flip, key, control_key), lat) in enumerate(zip(chunk, latents)):
                    std = None if stds is None else stds[j].clone()
                    cond = {name: t[j].clone() for name, t in conds.items()}
                    if std is not None and self._disk is None:
                        self._latent_stds[(idx, flip)] = std
                    if cond and self._disk is None:
                        self._latent_conditions[(idx, flip)] = cond
                    mask = None
                    if self._mask_sources is not None:  # on the latent grid, like the loss resizes it
                        mask = to_grid(self.mask(idx, self._fixed_crops[idx], flip), tuple(lat.shape[-2:]))
                    for k, value, store, m in ((key, lat, memory, mask),
                                               (control_key, controls.get(j), self._control_latents, None)):
                        if not k or value is None:
                            continue
                        if self._disk is not None:
                            self._disk.save(k, value.clone(), mask=m, std=std if k == key else None,
                                            conditions=cond if k == key else None)
                        else:
                            store[(idx, flip)] = value.clone()
                            if m is not None:
                                self._masks[(idx, flip)] = m
                bar.update(len(chunk))
        bar.close()
        if any(item.clip is not None for item in self.items):
            from .video_items import cache_clip_latents
            total += cache_clip_latents(self, encode, self._disk.folder if self._disk is not None else None,
                                        progress, vae_id, conditions=self._condition_names)
        self._latents = memory if self._disk is None else None
        self.cached_count, self.encoded_count = len(self._latent_keys), total

    @staticmethod
    def _encode_controls(encode, rendered: list[torch.Tensor | None]) -> dict[int, torch.Tensor]:
        """Position in `rendered` -> its control latents [N·C, h, w]: each reference encoded on its own,
        those with as many references in one batch (one reference each: one batch, as always)."""
        by_count: dict[int, list[int]] = {}
        for j, control in enumerate(rendered):
            if control is not None:
                by_count.setdefault(control.shape[0], []).append(j)
        out: dict[int, torch.Tensor] = {}
        for positions in by_count.values():
            stacked = torch.stack([rendered[j] for j in positions])
            mean, _, _ = _unpacked(encode(per_reference(stacked, 3)))  # a condition: its mean alone
            latents = joined_references(mean, len(positions))
            out.update(zip(positions, latents))
        return out

    def _cached_latents(self, item_idx: int, flip: bool, control: bool = False) -> torch.Tensor:
        """The cached latents of the image (or of its control image) in the orientation served."""
        if not flip or not self._flip_allowed:
            flip = False
        if self._latents is not None:
            return (self._control_latents if control else self._latents)[(item_idx, flip)]
        return self._disk.load((self._control_keys if control else self._latent_keys)[(item_idx, flip)])

    def _cached_std(self, item_idx: int, flip: bool) -> torch.Tensor | None:
        flip = flip and self._flip_allowed
        if self._latents is not None:
            return self._latent_stds.get((item_idx, flip))
        return self._disk.load_std(self._latent_keys[(item_idx, flip)])

    def _cached_conditions(self, item_idx: int, flip: bool) -> dict[str, torch.Tensor]:
        flip = flip and self._flip_allowed
        if self._latents is not None:
            return self._latent_conditions[(item_idx, flip)]
        return self._disk.load_conditions(self._latent_keys[(item_idx, flip)])

    def _cached_mask(self, item_idx: int, flip: bool) -> torch.Tensor:
        flip = flip and self._flip_allowed
        if self._latents is not None:
            return self._masks[(item_idx, flip)]
        return self._disk.load_mask(self._latent_keys[(item_idx, flip)])

    # ------------------------------------------------------------------ text-encoder cache

    def captions_are_static(self) -> bool:
        return all(self._group(item).captions.is_static for item in self.items)

    def cache_text(self, encode_fn: Callable[[list[str]], object], key: str = "", batch_size: int = 16,
                   pairs: bool = True) -> bool:
        """Encode each distinct caption once (plus "" when caption dropout is on) and attach the
        outputs to samples as sample["text"]. encode_fn maps a list of captions to a tensor, tuple or
        dict of tensors with the batch first. Returns False (and caches nothing) when captions
        change per epoch (tag shuffle or tag dropout). `pairs=False`: only the images without a control
        image (an edit pair's text depends on its control image: its batches encode it each step)."""
        if not self.captions_are_static():
            LOG.warning("dataset: text-encoder outputs are not cached because captions change every epoch "
                        "(shuffle_tags or tag_dropout is on)")
            self._text = None
            return False
        cached = [item for item in self.items if pairs or item.control is None]
        captions = sorted({item.caption for item in cached} |
                          ({""} if any(self._group(i).captions.dropout for i in cached) else set()))
        store: dict[str, object] = {}
        for start in range(0, len(captions), batch_size):
            chunk = captions[start:start + batch_size]
            with torch.no_grad():
                outputs = encode_fn(chunk)
            store.update(zip(chunk, split_text_outputs(outputs, len(chunk))))
        self._text, self.text_cache_key, self._text_pairs = store, key, pairs
        return True

    def cache_pair_text(self, encode_fn: Callable[[str, torch.Tensor], dict]) -> int:
        """With cached latents each edit pair's control image is fixed per orientation, so a text encoder
        that reads it with the caption (Family.text_reads_control) runs once per (pair, flip, caption):
        encode_fn(caption, control latents [N·C, h, w]) -> a batch-of-one text dict; entries are padded with
        zeros (mask 0) to one length so batches stack. Returns the number encoded (0: latents not cached)."""
        if (self._latents is None and self._disk is None) or not self.captions_are_static():
            return 0
        store: dict = {}
        for idx, item in enumerate(self.items):
            if item.control is None:
                continue
            captions = {item.caption} | ({""} if self._group(item).captions.dropout else set())
            for flip in ((False, True) if self._group(item).flip and self._flip_allowed else (False,)):
                control = self._cached_latents(idx, flip, control=True)
                for caption in captions:
                    with torch.no_grad():
                        store[(idx, flip, caption)] = split_text_outputs(encode_fn(caption, control), 1)[0]
        self._pair_text = pad_text_entries(store)
        return len(store)


def _unpacked(encoded) -> tuple[torch.Tensor, torch.Tensor | None, dict[str, torch.Tensor]]:
    """A cache pass's `encode` result (data/cache.unpack_encoded) as fp32 CPU tensors."""
    mean, std, conditions = unpack_encoded(encoded)
    return (mean.detach().float().cpu(), None if std is None else std.detach().float().cpu(),
            {name: t.detach().float().cpu() for name, t in conditions.items()})
