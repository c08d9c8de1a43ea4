"""Aspect-ratio buckets: pure arithmetic, no I/O.

A bucket is a (width, height) target size. Every image is resized to cover its bucket and
cropped to it; batches never mix buckets (the sampler groups by bucket id).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

Size = tuple[int, int]  # (width, height)


@dataclass(frozen=True)
class BucketSpec:
    """Resolved bucketing options (0/auto values already filled in)."""
    resolution: int
    enabled: bool
    min_side: int
    max_side: int
    step: int
    no_upscale: bool

    @property
    def max_area(self) -> int:
        return self.resolution * self.resolution


def bucket_spec(resolution: int, enabled: bool, min_side: int = 0, max_side: int = 0, step: int = 64,
                no_upscale: bool = False) -> BucketSpec:
    """Fill in the automatic sides (min = resolution/2, max = resolution×2); with bucketing on,
    sides are rounded down to the step (and are at least one step)."""
    step = max(8, step)
    min_side = min_side or resolution // 2
    max_side = max_side or resolution * 2
    if enabled:
        min_side = max(step, _round_down(min_side, step))
        max_side = max(min_side, _round_down(max_side, step))
    return BucketSpec(resolution, enabled, min_side, max(min_side, max_side), step, no_upscale)


def _round_down(value: float, step: int) -> int:
    return int(value // step) * step


def make_buckets(spec: BucketSpec) -> list[Size]:
    """All (w, h) with sides in [min_side, max_side], multiples of step, and the largest height
    for each width such that w*h <= resolution². Sorted by aspect ratio (w/h)."""
    if not spec.enabled:
        return [(spec.resolution, spec.resolution)]
    buckets: set[Size] = set()
    width = spec.min_side
    while width <= spec.max_side:
        height = min(spec.max_side, _round_down(spec.max_area / width, spec.step))
        if height >= spec.min_side:
            buckets.add((width, height))
            buckets.add((height, width))
        width += spec.step
    # The square bucket at (rounded) resolution is always available.
    side = max(spec.min_side, min(spec.max_side, _round_down(spec.resolution, spec.step)))
    buckets.add((side, side))
    return sorted(buckets, key=lambda s: (s[0] / s[1], s[0]))


def closest_bucket(width: int, height: int, buckets: list[Size]) -> Size:
    """The bucket whose aspect ratio is closest to the image's (in log space, so 2:1 and 1:2 are
    equally far from 1:1); ties go to the larger area."""
    ratio = math.log(width / height)
    return min(buckets, key=lambda b: (abs(math.log(b[0] / b[1]) - ratio), -b[0] * b[1]))


def no_upscale_bucket(width: int, height: int, spec: BucketSpec) -> Size:
    """For an image smaller than resolution² in area: a bucket of its own aspect ratio and at most
    its own area, sides rounded down to the step, so it is never upscaled."""
    area = min(width * height, spec.max_area)
    scale = math.sqrt(area / (width * height))
    bucket_w = _round_down(width * scale, spec.step)
    bucket_h = _round_down(height * scale, spec.step)
    bucket_w = max(spec.step, min(bucket_w, spec.max_side))
    bucket_h = max(spec.step, min(bucket_h, spec.max_side))
    return bucket_w, bucket_h


def assign_bucket(width: int, height: int, spec: BucketSpec, buckets: list[Size]) -> Size:
    """The target size of one image (width, height after EXIF rotation)."""
    if not spec.enabled:
        return buckets[0]
    if spec.no_upscale and width * height < spec.max_area:
        return no_upscale_bucket(width, height, spec)
    return closest_bucket(width, height, buckets)


def too_small(width: int, height: int, spec: BucketSpec) -> bool:
    """Images whose shorter side is below the smallest bucket side are skipped (they would be
    upscaled so far that they teach blur)."""
    return min(width, height) < spec.min_side


def resize_size(width: int, height: int, bucket: Size) -> Size:
    """The size the image is resized to so that it just covers the bucket (aspect kept)."""
    scale = max(bucket[0] / width, bucket[1] / height)
    # ceil so rounding never leaves the resized image a pixel short of the bucket
    return max(bucket[0], math.ceil(width * scale - 1e-6)), max(bucket[1], math.ceil(height * scale - 1e-6))


def crop_offset(resized: Size, bucket: Size, center: bool, rand01: tuple[float, float]) -> tuple[int, int]:
    """(top, left) of the bucket-sized crop inside the resized image. `rand01` are two uniform
    numbers in [0, 1) used for a random crop, so the caller owns the randomness."""
    spare_w, spare_h = resized[0] - bucket[0], resized[1] - bucket[1]
    if center:
        return spare_h // 2, spare_w // 2
    return min(spare_h, int(rand01[0] * (spare_h + 1))), min(spare_w, int(rand01[1] * (spare_w + 1)))


@dataclass(frozen=True)
class Crop:
    """What the trainer takes from one image: resized to `resized` (w, h), then the bucket-sized
    window at (top, left) of that."""
    width: int            # the image, after EXIF rotation
    height: int
    bucket: Size
    resized: Size
    top: int
    left: int

    @property
    def box(self) -> tuple[float, float, float, float]:
        """(left, top, right, bottom) of the crop in the image's own pixels (for drawing it)."""
        sx, sy = self.width / self.resized[0], self.height / self.resized[1]
        return (self.left * sx, self.top * sy, (self.left + self.bucket[0]) * sx, (self.top + self.bucket[1]) * sy)

    @property
    def kept(self) -> float:
        """The fraction of the image's area inside the crop (1.0: nothing cut away)."""
        return (self.bucket[0] * self.bucket[1]) / (self.resized[0] * self.resized[1])

    @property
    def scale(self) -> float:
        """How much the image is scaled (>1: upscaled, softer than the bucket's resolution)."""
        return self.resized[0] / self.width


def train_crop(width: int, height: int, bucket: Size, center: bool, rand01: tuple[float, float] = (0.5, 0.5)
               ) -> Crop:
    """The crop of a (width, height) image in its bucket: the one function the trainer's dataset and
    the workbench's crop preview both call, so what is shown is what is trained."""
    resized = resize_size(width, height, bucket)
    top, left = crop_offset(resized, bucket, center, rand01)
    return Crop(width, height, bucket, resized, top, left)


def bucket_name(bucket: Size) -> str:
    return f"{bucket[0]}x{bucket[1]}"
