"""What the scan tells the user: warnings (one per bad file), and the JSON-able summary the plan
and the GUI's dataset inspector show (counts per subset, missing captions, skipped files,
top tags, bucket histogram)."""
from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path
from typing import TYPE_CHECKING

from ..config import TrainConfig
from ..launch.plan import DataCounts
from .buckets import BucketSpec, Size, bucket_name

if TYPE_CHECKING:
    from .scan import ImageItem
    from .subsets import Group

TOP_TAGS = 30
PAIRS_SHOWN = 24  # (image, control image) pairs the summary lists for the inspector's side-by-side view


class ScanLog:
    """Collects every problem; caps the warning lines per kind so a folder of 10 000 EXIF-rotated
    photos does not flood the log (the summary still lists every file)."""

    def __init__(self, max_per_kind: int):
        self.max_per_kind = max_per_kind
        self.warnings: list[str] = []
        self.notes: list[str] = []                         # folder-level notes (ignored folders)
        self.skipped: list[dict] = []
        self.skip_counts: Counter = Counter()
        self.repairs: list[dict] = []
        self.repair_counts: Counter = Counter()
        self.caption_problems: list[dict] = []
        self.missing_captions: dict[int, list[str]] = {}   # group index -> files
        self.missing_controls: dict[str, list[str]] = {}   # control_path key -> images without a control image
        self.filter_counts: Counter = Counter()
        self.records: dict[str, int] = {}
        self._lines: Counter = Counter()
        self._suppressed: Counter = Counter()

    def warn(self, message: str, kind: str = "") -> None:
        if kind:
            self._lines[kind] += 1
            if self._lines[kind] > self.max_per_kind:
                self._suppressed[kind] += 1
                return
        self.warnings.append(message)

    def skip(self, path: Path, reason: str, kind: str) -> None:
        self.skipped.append({"file": str(path), "reason": reason, "kind": kind})
        self.skip_counts[kind] += 1
        self.warn(f"{path}: skipped: {reason}", kind)

    def unpaired(self, control_key: str, paths: list[Path], reason: str) -> None:
        """Images skipped for want of their control image: listed, warned about once per folder by the caller."""
        self.missing_controls.setdefault(control_key, []).extend(str(p) for p in paths)
        for path in paths:
            self.skipped.append({"file": str(path), "reason": reason, "kind": "no_control"})
            self.skip_counts["no_control"] += 1

    def repaired(self, path: Path, note: str) -> None:
        kind = note.split(" ")[0].lower()
        self.repairs.append({"file": str(path), "note": note})
        self.repair_counts[_repair_kind(note)] += 1
        self.warn(f"{path}: {note}", "repair:" + kind)

    def add(self, kind: str, path: Path, problem: str) -> None:
        self.caption_problems.append({"file": str(path), "problem": problem})
        self.warn(f"{path}: {problem}", kind)

    def filtered(self, source: Path, reason: str) -> None:
        # filters are the user's intent, not problems: counted, never warned per file
        kind = ("ignore_tags" if reason.startswith("has ignored tag") else
                "abs_min_score" if "abs_min_score" in reason else "min_score")
        self.filter_counts[kind] += 1

    def finish(self) -> list[str]:
        for kind, n in self._suppressed.items():
            self.warnings.append(f"... and {n} more '{kind}' warnings (every file is listed in the dataset summary)")
        self._suppressed.clear()
        return self.warnings


def _repair_kind(note: str) -> str:
    for key, kind in (("EXIF", "exif_rotated"), ("CMYK", "cmyk"), ("16-bit", "16_bit"), ("palette", "palette"),
                      ("transparency", "alpha")):
        if key in note:
            return kind
    return "other"


def build_summary(cfg: TrainConfig, groups: list["Group"], items: list["ImageItem"], log: ScanLog,
                  spec: BucketSpec, class_samples: int, held_out: int) -> dict:
    per_group = Counter(item.group for item in items)
    unpaired = {f for files in log.missing_controls.values() for f in files}
    subsets = []
    for i, g in enumerate(groups):
        entry = {"name": g.name, "path": str(g.folder),
                 "key": g.spec.key, "source": g.spec.source, "is_class": g.spec.is_class,
                 "repeats": g.repeats, "files": len(g.files), "images": per_group[i],
                 "samples": per_group[i] * g.repeats if not g.spec.is_class else 0,
                 "missing_captions": len(log.missing_captions.get(i, [])),
                 "class_tokens": g.class_tokens,
                 "control_path": str(g.spec.control_root or ""),
                 "missing_controls": sum(1 for f in g.files if str(f) in unpaired)}
        if g.name in log.records:
            entry["metadata_records"] = log.records[g.name]
        subsets.append(entry)
    instance = [item for item in items if not item.is_class]
    repeats = {i: g.repeats for i, g in enumerate(groups)}
    histogram: dict[Size, dict] = defaultdict(lambda: {"images": 0, "samples": 0})
    for item in instance:
        histogram[item.bucket]["images"] += 1
        histogram[item.bucket]["samples"] += repeats[item.group]
    tag_counts = Counter(tag for item in instance for tag in item.tags)
    instance_samples = sum(repeats[item.group] for item in instance)
    return {
        "resolution": cfg.dataset.resolution,
        "bucketing": spec.enabled,
        "bucket_sides": {"min": spec.min_side, "max": spec.max_side, "step": spec.step,
                         "no_upscale": spec.no_upscale},
        "images": len(instance),
        "class_images": len(items) - len(instance),
        "samples_per_epoch": instance_samples + class_samples,
        "instance_samples": instance_samples,
        "class_samples": class_samples,
        "validation_images": held_out,
        "subsets": subsets,
        "missing_captions": sum(len(v) for v in log.missing_captions.values()),
        "missing_caption_files": {str(groups[i].folder): files for i, files in log.missing_captions.items()},
        "control_images": sum(1 for item in instance if item.control is not None),
        "missing_controls": len(unpaired),
        "missing_control_files": log.missing_controls,
        # [image, its control image, further reference images…]
        "control_pairs": [[str(item.path), *(str(p) for p in item.controls)] for item in instance
                          if item.control is not None][:PAIRS_SHOWN],
        "caption_problems": log.caption_problems,
        "skipped": log.skipped,
        "skipped_count": len(log.skipped),
        "skipped_by_kind": dict(log.skip_counts),
        "repaired": log.repairs,
        "repaired_by_kind": dict(log.repair_counts),
        "filtered_by": dict(log.filter_counts),
        "filtered_count": sum(log.filter_counts.values()),
        "notes": log.notes,
        "top_tags": tag_counts.most_common(TOP_TAGS),
        "buckets": [{"bucket": bucket_name(b), "width": b[0], "height": b[1], **v}
                    for b, v in sorted(histogram.items(), key=lambda kv: (kv[0][0] / kv[0][1], kv[0][0]))],
    }


def data_counts(groups: list["Group"], items: list["ImageItem"], class_samples: int, used: list[Size]) -> DataCounts:
    """The numbers plan.make_plan needs: (name, images, repeats) per instance group, class samples
    per epoch, and samples per bucket (so batch counts respect "batches never mix buckets")."""
    per_group = Counter(item.group for item in items)
    subsets = tuple((groups[i].name, per_group[i], groups[i].repeats) for i in counted_groups(groups, items))
    repeats = {i: g.repeats for i, g in enumerate(groups)}
    per_bucket = Counter()
    for item in items:
        if not item.is_class:
            per_bucket[item.batch_bucket] += repeats[item.group]
    for k in class_sample_items(items, class_samples):
        per_bucket[items[k].batch_bucket] += 1
    bucket_sizes = tuple(per_bucket[b] for b in used) if len(used) > 1 else None
    return DataCounts(subsets=subsets, class_images=class_samples, bucket_sizes=bucket_sizes)


def counted_groups(groups: list["Group"], items: list["ImageItem"]) -> list[int]:
    """Group indices in DataCounts.subsets order: instance groups with at least one usable image."""
    used = {item.group for item in items}
    return [i for i, g in enumerate(groups) if not g.spec.is_class and i in used]


def class_sample_items(items: list["ImageItem"], class_samples: int) -> list[int]:
    """Indices (into items) of the class samples of one epoch: class images in scan order,
    cycled when there are fewer images than samples, the first ones when there are more."""
    class_idx = [i for i, item in enumerate(items) if item.is_class]
    return [class_idx[k % len(class_idx)] for k in range(class_samples)] if class_idx else []
