"""Aspect-ratio bucketing: properties of the bucket arithmetic (hypothesis) and of whole epochs
built from real image files through the sampler."""
from __future__ import annotations

import math
import tempfile
from collections import Counter
from pathlib import Path

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from test_data_helpers import config, write_image
from trainer_backend.data import TrainDataset, collate, scan_dataset
from trainer_backend.data.buckets import (assign_bucket, bucket_spec, closest_bucket, crop_offset, make_buckets,
                                          resize_size)
from trainer_backend.data.sampler import BucketBatchSampler

resolutions = st.sampled_from([64, 128, 256, 512, 768, 1024])
steps = st.sampled_from([8, 32, 64])


@given(resolutions, steps)
def test_buckets_respect_step_sides_and_area(resolution, step):
    spec = bucket_spec(resolution, True, step=step)
    buckets = make_buckets(spec)
    assert len(set(buckets)) == len(buckets)
    for w, h in buckets:
        assert w % step == 0 and h % step == 0
        assert spec.min_side <= w <= spec.max_side and spec.min_side <= h <= spec.max_side
        assert w * h <= resolution * resolution
    assert (resolution // step * step,) * 2 in buckets


@given(resolutions, st.integers(16, 4000), st.integers(16, 4000))
def test_image_goes_to_the_bucket_with_the_closest_aspect_and_covers_it(resolution, width, height):
    spec = bucket_spec(resolution, True, step=64)
    buckets = make_buckets(spec)
    bucket = assign_bucket(width, height, spec, buckets)
    best = min(abs(math.log(b[0] / b[1]) - math.log(width / height)) for b in buckets)
    assert abs(math.log(bucket[0] / bucket[1]) - math.log(width / height)) == best
    resized = resize_size(width, height, bucket)
    assert resized[0] >= bucket[0] and resized[1] >= bucket[1]
    assert resized[0] == bucket[0] or resized[1] == bucket[1]      # covers it, no bigger than needed
    for rand in [(0.0, 0.0), (0.999, 0.999), (0.5, 0.25)]:
        top, left = crop_offset(resized, bucket, False, rand)
        assert 0 <= top <= resized[1] - bucket[1] and 0 <= left <= resized[0] - bucket[0]


@given(st.integers(16, 600), st.integers(16, 600))
def test_no_upscale_never_makes_a_small_image_bigger(width, height):
    spec = bucket_spec(512, True, min_side=8, step=8, no_upscale=True)
    bw, bh = assign_bucket(width, height, spec, make_buckets(spec))
    if width * height < 512 * 512:
        assert bw <= width and bh <= height
    assert bw * bh <= 512 * 512


def test_closest_bucket_is_symmetric_for_portrait_and_landscape():
    buckets = make_buckets(bucket_spec(512, True))
    w, h = closest_bucket(1000, 500, buckets)
    assert closest_bucket(500, 1000, buckets) == (h, w)


image_shapes = st.lists(st.tuples(st.integers(40, 200), st.integers(40, 200)), min_size=1, max_size=6)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shapes=image_shapes, repeats=st.lists(st.integers(1, 3), min_size=2, max_size=2),
       batch_size=st.integers(1, 4), seed=st.integers(0, 1000))
def test_epoch_uses_every_image_repeats_times_in_bucket_pure_reproducible_batches(shapes, repeats, batch_size, seed):
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for i, (w, h) in enumerate(shapes):
            write_image(root / f"{repeats[i % 2]}_c{i % 2}" / f"{i}.png", w, h, seed=i)
        cfg = config({"path": str(root), "bucketing": True, "bucket_step": 32, "bucket_min_side": 32},
                     schedule={"seed": seed, "batch_size": batch_size})
        scan = scan_dataset(cfg)
        ds = TrainDataset(scan, cfg)
        sampler = BucketBatchSampler(ds.sample_buckets, batch_size, seed=seed)
        batches = sampler.batches(0)

        used = Counter(ds.sample_items[i] for batch in batches for i in batch)
        expected = {k: scan.groups[item.group].repeats for k, item in enumerate(scan.items)}
        assert dict(used) == expected
        assert sum(scan.counts.bucket_sizes or (len(ds),)) == len(ds) == scan.counts.samples_per_epoch
        for batch in batches:
            assert len({ds.sample_buckets[i] for i in batch}) == 1
            stacked = collate([ds[i] for i in batch])["pixel_values"]       # same shape, or stack fails
            w, h = ds.bucket_sizes[ds.sample_buckets[batch[0]]]
            assert stacked.shape[1:] == (3, h, w)

        again = TrainDataset(scan_dataset(cfg), cfg)
        assert BucketBatchSampler(again.sample_buckets, batch_size, seed=seed).batches(0) == batches
        first = batches[0][0]
        assert torch.equal(again[first]["pixel_values"], ds[first]["pixel_values"])


def test_bucket_histogram_reports_images_and_samples(tmp_path):
    write_image(tmp_path / "2_wide" / "a.png", 128, 64)
    write_image(tmp_path / "2_wide" / "b.png", 130, 60, seed=1)
    write_image(tmp_path / "1_square" / "c.png", 64, 64, seed=2)
    cfg = config({"path": str(tmp_path), "bucketing": True, "bucket_step": 16, "bucket_min_side": 32})
    scan = scan_dataset(cfg)
    hist = {b["bucket"]: (b["images"], b["samples"]) for b in scan.summary["buckets"]}
    # 2:1 images: 80x48 (5:3) is the closest aspect among the 16-px buckets of area <= 64²
    assert hist == {"64x64": (1, 1), "80x48": (2, 4)}
    assert sorted(scan.counts.bucket_sizes) == [1, 4]
