"""What the workbench flags in a dataset, from the index's records (index.py), the training
settings and the captions.

Settings-dependent facts come from the trainer's own functions: the bucket (data/buckets.py
`assign_bucket`), the crop (`train_crop`, the one function the trainer's dataset calls) and the
minimum side the trainer skips below. Duplicates: exact by content hash, near by perceptual hash
(imagehash's pHash, Hamming distance <= `near_threshold` bits of 64), computed for all pairs at
once with numpy.

Flag kinds (one message each): unreadable, too_small, extreme_aspect, crop_cuts, exif_rotated,
cmyk, alpha, sixteen_bit, palette, animated, duplicate, near_duplicate, uncaptioned, caption.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, fields
from functools import lru_cache
from pathlib import Path

import numpy as np

from ..data.buckets import Crop, Size, assign_bucket, bucket_name, bucket_spec, make_buckets, too_small, train_crop
from ..data.captions import read_caption, split_tags

FLAG_KINDS = ("unreadable", "too_small", "extreme_aspect", "crop_cuts", "exif_rotated", "cmyk", "alpha",
              "sixteen_bit", "palette", "animated", "duplicate", "near_duplicate", "uncaptioned", "caption",
              "control_missing", "control_size")
KEPT_AT_LEAST = 2 / 3      # a crop that cuts away more than a third is flagged


@dataclass(frozen=True)
class CheckSettings:
    """The training settings the checks depend on ([dataset] keys of the same names) and the thresholds."""
    resolution: int = 512
    bucketing: bool = False
    bucket_min_side: int = 0
    bucket_max_side: int = 0
    bucket_step: int = 64
    bucket_no_upscale: bool = False
    center_crop: bool = True
    caption_extension: str = ".txt"
    max_aspect: float = 3.0          # longer side / shorter side above this: extreme_aspect
    near_threshold: int = 6          # pHash bits (of 64) two near duplicates may differ in

    @classmethod
    def from_values(cls, values: dict) -> "CheckSettings":
        """From a [dataset] section (or any dict): keys it does not know are ignored."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in names and v is not None})

    def spec_and_buckets(self):
        return _spec_and_buckets(self.resolution, self.bucketing, self.bucket_min_side, self.bucket_max_side,
                                 self.bucket_step, self.bucket_no_upscale)


@lru_cache(maxsize=64)
def _spec_and_buckets(*args):
    spec = bucket_spec(*args)   # made once per settings, not once per image
    return spec, make_buckets(spec)


def crop_of(width: int, height: int, settings: CheckSettings) -> tuple[Size, Crop]:
    """The bucket an image of this size lands in and the crop the trainer takes from it (with a random
    crop, the centred one of the crops it may take)."""
    spec, buckets = settings.spec_and_buckets()
    bucket = assign_bucket(width, height, spec, buckets)
    return bucket, train_crop(width, height, bucket, settings.center_crop)


def settings_flags(record: dict, settings: CheckSettings) -> dict[str, str]:
    """The flags that depend on the training settings (size, aspect, crop)."""
    if "width" not in record:
        return {}
    w, h = record["width"], record["height"]
    spec, _ = settings.spec_and_buckets()
    bucket, crop = crop_of(w, h, settings)
    out = {}
    if too_small(w, h, spec) and "clip" not in record:   # the clip scan keeps small clips (upscaled)
        out["too_small"] = (f"{w}×{h}: shorter side below {spec.min_side} px (dataset.bucket_min_side): "
                            f"the trainer skips it")
    elif crop.scale > 1.0001:
        out["too_small"] = f"{w}×{h} is smaller than its bucket {bucket_name(bucket)}: upscaled ×{crop.scale:.2f}"
    aspect = max(w, h) / min(w, h)
    if aspect > settings.max_aspect:
        out["extreme_aspect"] = f"aspect {aspect:.1f}:1 (more than {settings.max_aspect:g}:1)"
    if crop.kept < KEPT_AT_LEAST:
        out["crop_cuts"] = f"the crop to {bucket_name(bucket)} keeps {crop.kept:.0%} of the image"
    return out


def caption_of(folder: Path, rel: str, extension: str) -> tuple[str | None, str]:
    read = read_caption(Path(folder) / rel, extension)
    return read.text, read.problem


def duplicate_groups(records: list[dict], near_threshold: int) -> list[dict]:
    """[{"kind": "exact"|"near", "paths": [...]}]: exact groups share a content hash; near groups join
    images whose pHashes differ in at most near_threshold bits (one image of each exact group stands
    for it)."""
    by_hash: dict[str, list[str]] = {}
    for r in records:
        if "sha256" in r and "unreadable" not in r.get("flags", {}):
            by_hash.setdefault(r["sha256"], []).append(r["path"])
    groups = [{"kind": "exact", "paths": paths} for paths in by_hash.values() if len(paths) > 1]
    firsts = [r for r in records if "phash" in r and by_hash.get(r.get("sha256"), [None])[0] == r["path"]]
    if len(firsts) < 2:
        return groups
    hashes = np.array([int(r["phash"], 16) for r in firsts], dtype=np.uint64)
    parent = list(range(len(firsts)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i
    block = 512   # all pairs, a block of rows at a time (a 512 × N matrix of Hamming distances)
    for start in range(0, len(firsts), block):
        rows = hashes[start:start + block]
        close = np.bitwise_count(rows[:, None] ^ hashes[None, :]) <= near_threshold
        for i, j in zip(*np.nonzero(close)):
            i, j = start + int(i), int(j)
            if j > i:
                a, b = root(i), root(j)
                if a != b:
                    parent[b] = a
    near: dict[int, list[str]] = {}
    for i, r in enumerate(firsts):
        near.setdefault(root(i), []).append(r["path"])
    groups += [{"kind": "near", "paths": paths} for paths in near.values() if len(paths) > 1]
    return groups


def annotate(folder: Path, records: list[dict], settings: CheckSettings) -> tuple[list[dict], list[dict]]:
    """(items, duplicate groups): each item is its record plus `caption`, `bucket` and every flag."""
    groups = duplicate_groups(records, settings.near_threshold)
    dup_of: dict[str, tuple[str, str]] = {}    # path -> (flag kind, message)
    for g in groups:
        kind, says = ("duplicate", "same content as") if g["kind"] == "exact" else ("near_duplicate", "looks like")
        for p in g["paths"]:
            others = [o for o in g["paths"] if o != p]
            more = f" and {len(others) - 1} more" if len(others) > 1 else ""
            dup_of[p] = (kind, f"{says} {others[0]}{more}")
    from .metadata_captions import metadata_index
    in_metadata = metadata_index(folder)   # a metadata-JSON dataset keeps its captions there
    items = []
    for r in records:
        item = dict(r, flags=dict(r.get("flags", {})))
        item["flags"].update(settings_flags(r, settings))
        if "width" in r:
            item["bucket"] = bucket_name(crop_of(r["width"], r["height"], settings)[0])
        if r["path"] in in_metadata:
            text, problem = in_metadata[r["path"]][2], ""
        else:
            text, problem = caption_of(folder, r["path"], settings.caption_extension)
        item["caption"] = text
        if text is None:
            item["flags"]["uncaptioned"] = f"no {settings.caption_extension} caption"
        elif problem:
            item["flags"]["caption"] = problem
        if r["path"] in dup_of:
            kind, message = dup_of[r["path"]]
            item["flags"][kind] = message
        items.append(item)
    return items, groups


def tag_frequency(captions: list[str | None], separator: str = ",") -> list[tuple[str, int]]:
    """(tag, images) most frequent first; a tag counts once per caption."""
    counts: Counter = Counter()
    for caption in captions:
        if caption:
            counts.update(set(split_tags(caption, separator)))
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))


def report(folder: Path, items: list[dict], groups: list[dict]) -> dict:
    """The JSON `dataset check --json` prints: counts, the paths per flag, the duplicate groups."""
    def having(kind: str) -> list[str]:
        return [i["path"] for i in items if kind in i["flags"]]
    out = {"folder": str(folder), "images": sum(1 for i in items if "clip" not in i),
           "clips": sum(1 for i in items if "clip" in i),
           "captioned": sum(1 for i in items if i.get("caption") is not None),
           "duplicates": [g["paths"] for g in groups],
           "duplicate_groups": groups}
    for kind in FLAG_KINDS:
        if kind not in ("duplicate", "near_duplicate"):
            out[kind] = having(kind)
    out["messages"] = {i["path"]: i["flags"] for i in items if i["flags"]}
    return out


def settings_dict(settings: CheckSettings) -> dict:
    return asdict(settings)


def generate_and_edit() -> str:
    """The families whose control images are optional (registry.py), by name: "Flux.2, Qwen-Image 2.1, …"."""
    from ..families.registry import FAMILIES
    return ", ".join(e.label.split(" (")[0] for e in FAMILIES if e.control_images == "optional")


def pair_flags(folder: Path, control_root: Path, records: list[dict]) -> dict[str, dict[str, str]]:
    """Edit pairs (data/pairs.py's matching): path -> {"control_missing" | "control_size": message} and
    `controls`: the control images' paths, for every image of the folder."""
    from types import SimpleNamespace

    from ..data.images import probe
    from ..data.pairs import control_index, controls_of, highest_numbers
    index = control_index(Path(control_root), [])
    highest = highest_numbers(index)
    out: dict[str, dict] = {}
    for r in records:
        controls = controls_of(Path(folder) / r["path"], SimpleNamespace(root=Path(folder)), index, highest)
        entry: dict = {"controls": [str(c) for c in controls]}
        if not controls:
            entry["control_missing"] = ("no control image: an edit model skips this image; one that generates "
                                        f"and edits ({generate_and_edit()}) trains it on its caption alone")
        elif "width" in r:
            for c in controls:
                try:
                    info = probe(c, 10**9)
                except Exception as e:
                    entry["control_missing"] = f"control image {c.name} unreadable ({e})"
                    break
                if (info.width, info.height) != (r["width"], r["height"]):
                    entry["control_size"] = (f"control {c.name} is {info.width}×{info.height}, the image "
                                             f"{r['width']}×{r['height']} (centre-cropped and resized to match)")
        out[r["path"]] = entry
    return out
