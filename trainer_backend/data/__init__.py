"""The dataset pipeline: scan folders / metadata JSON, bucket, augment, cache.

    scan = scan_dataset(cfg)                 # usable images, summary, plan counts, warnings
    dataset = TrainDataset(scan, cfg)        # samples = images × repeats + class samples
    dataset.set_epoch(e); dataset[i]         # dict of tensors (see TrainDataset.__getitem__)
    DataLoader(dataset, batch_sampler=BucketBatchSampler(dataset.sample_buckets, ...), collate_fn=collate)
"""
from __future__ import annotations

from importlib import import_module

__all__ = ["DatasetScan", "ImageItem", "TrainDataset", "collate", "latent_cache_dir", "scan_dataset"]
# Loaded on first use (PEP 562), so the torch-free modules (buckets, captions, images, scan, pairs,
# subsets) can be imported by the studio and the workbench without pulling in torch.
_LAZY = {"DatasetScan": ".scan", "ImageItem": ".scan", "scan_dataset": ".scan", "TrainDataset": ".dataset",
         "latent_cache_dir": ".cache", "stack_text": ".cache"}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def collate(samples: list[dict]) -> dict:
    """Stack a list of samples (all from one bucket) into a batch: pixel_values [B,3,H,W] or
    latents [B,C,h,w] (paired images: control_pixel_values or control_latents alike); caption (alias captions)
    list[str]; original_size / crop_top_left / target_size as long tensors [B,2] (h,w / top,left / h,w);
    is_class bool [B]; text (when cached) stacked per key; mask [B,1,H,W] (pixels) or [B,1,h,w] (cached
    latents' grid) with loss.masked; conditions (cached with the latents) stacked per name."""
    import torch
    captions = [s["caption"] for s in samples]
    batch: dict = {"caption": captions, "captions": captions,  # both spellings: same list
                   "is_class": torch.tensor([bool(s["is_class"]) for s in samples], dtype=torch.bool)}
    for key in ("pixel_values", "latents", "latents_std", "mask", "control_pixel_values", "control_latents"):
        if key in samples[0]:
            batch[key] = torch.stack([s[key] for s in samples])
    for key in ("original_size", "crop_top_left", "target_size"):
        batch[key] = torch.tensor([list(s[key]) for s in samples], dtype=torch.long)
    if "text" in samples[0]:
        from .cache import stack_text
        batch["text"] = stack_text([s["text"] for s in samples])
    if "conditions" in samples[0]:  # cached with the latents (Family.pixel_conditions), stacked per name
        batch["conditions"] = {k: torch.stack([s["conditions"][k] for s in samples]) for k in samples[0]["conditions"]}
    for key, time_dim in (("audio_latents", 0), ("audio_waveform", 1)):  # a clip window's audio (data/audio.py)
        if key in samples[0]:
            from .audio import stack_cropped
            batch[key] = stack_cropped([s[key] for s in samples], time_dim)
    return batch
