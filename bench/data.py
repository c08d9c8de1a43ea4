"""Dataset pipeline throughput with latent caching off and on, tiny SD1, same data and sampler.

    .venv/bin/python bench/data.py [--images 32] [--resolution 128] [--batch 4] [--rounds 1] [--train-step]

Generates JPEG photos-sized images (default 768×512, so decoding and resizing cost what they
cost on real data), then runs two epochs of what the trainer does per batch to get latents:
- caching off: load, resize, crop, flip -> VAE encode, every epoch;
- caching on: epoch 1 encodes every image once (both flips) and includes that cost; epoch 2
  reads the cached latents.
`--train-step` adds the tiny UNet's forward and backward pass to every batch (the same work in
both modes), which shows the effect on a whole training step (the tiny UNet's backward pass
dominates at 128 px, so expect little there). With --rounds > 1 the modes alternate and the
medians are printed (shared machines are noisy). Prints samples/s per epoch and the ratio of
epoch 2 cached to epoch 2 uncached (goal: >= 2x at 128 px).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from trainer_backend.config import from_dict  # noqa: E402
from trainer_backend.data import TrainDataset, collate, scan_dataset  # noqa: E402
from trainer_backend.data.sampler import BucketBatchSampler  # noqa: E402
from trainer_backend.families import load_model  # noqa: E402
from trainer_backend.families import build_tiny_model  # noqa: E402


def make_photos(folder: Path, n: int, width: int, height: int) -> Path:
    """Smooth gradients plus noise and a few shapes: JPEG-sized like a real photo."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    for i in range(n):
        base = rng.uniform(0, 255, 3)
        arr = (base + 60 * np.sin(xx[..., None] / (20 + i) + yy[..., None] / 37) +
               rng.normal(0, 12, (height, width, 3)))
        arr[height // 4: height // 2, width // 3: width // 2] = rng.uniform(0, 255, 3)
        Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8)).save(folder / f"{i:03d}.jpg", quality=92)
        (folder / f"{i:03d}.txt").write_text(f"photo number {i}")
    return folder


def run_epochs(cfg, model, cache: bool, train_step: bool, batch_size: int, workers: int) -> list[float]:
    """samples/s of epochs 1 and 2 (epoch 1 includes building the cache)."""
    vae, unet = model.vae, model.unet
    tokenizer, text_encoder = model.tokenizers[0], model.text_encoders[0]
    rates = []
    start = time.perf_counter()
    ds = TrainDataset(scan_dataset(cfg), cfg)
    if cache:
        @torch.no_grad()
        def encode(pixels: torch.Tensor) -> torch.Tensor:
            return vae.encode(pixels).latent_dist.mean * vae.config.scaling_factor
        ds.cache_latents(encode, None, progress=False, vae_id="bench")
    sampler = BucketBatchSampler(ds.sample_buckets, batch_size, seed=0)
    for epoch in range(2):
        ds.set_epoch(epoch)
        loader = torch.utils.data.DataLoader(ds, batch_sampler=sampler.batches(epoch), collate_fn=collate,
                                             num_workers=workers)
        seen = 0
        for batch in loader:
            if "latents" in batch:
                latents = batch["latents"]
            else:
                with torch.no_grad():
                    latents = vae.encode(batch["pixel_values"]).latent_dist.mean * vae.config.scaling_factor
            if train_step:
                with torch.no_grad():
                    ids = tokenizer(batch["caption"], padding="max_length", max_length=tokenizer.model_max_length,
                                    truncation=True, return_tensors="pt").input_ids
                    hidden = text_encoder(ids)[0]
                t = torch.randint(0, 1000, (len(latents),))
                noise = torch.randn_like(latents)
                pred = unet(latents + noise, t, hidden).sample
                torch.nn.functional.mse_loss(pred, noise).backward()
                unet.zero_grad(set_to_none=True)
            seen += len(latents)
        now = time.perf_counter()
        rates.append(seen / (now - start))
        start = now
    return rates


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--images", type=int, default=32)
    ap.add_argument("--resolution", type=int, default=128)
    ap.add_argument("--source-size", default="768x512", help="generated image size, WxH")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=1, help="alternate off/on this many times; report medians")
    ap.add_argument("--flip", action="store_true", help="random flip (caching encodes both orientations)")
    ap.add_argument("--train-step", action="store_true", help="add the tiny UNet forward/backward per batch")
    ap.add_argument("--vae-downsample", type=int, default=2, choices=(2, 4, 8),
                    help="the tiny VAE's factor: 2 (the test models) or 8 (SD's, so latents have real proportions)")
    args = ap.parse_args()
    width, height = (int(v) for v in args.source_size.lower().split("x"))

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        data = make_photos(tmp / "photos", args.images, width, height)
        model = load_model(str(build_tiny_model("sd1", tmp / "tiny-sd1", vae_downsample=args.vae_downsample)))
        model.unet.train()
        cfg = from_dict({"dataset": {"path": str(data), "resolution": args.resolution, "flip": args.flip},
                         "schedule": {"seed": 0, "batch_size": args.batch}})
        print(f"tiny SD1, {args.images} images {width}x{height} JPEG -> {args.resolution}px, batch {args.batch}, "
              f"workers {args.workers}, flip {args.flip}, train step {args.train_step}, "
              f"VAE downsample {args.vae_downsample}, "
              f"{torch.get_num_threads()} threads")
        runs: dict[bool, list[list[float]]] = {False: [], True: []}
        for _ in range(args.rounds):
            for cache in (False, True):
                runs[cache].append(run_epochs(cfg, model, cache, args.train_step, args.batch, args.workers))
        off, on = ([statistics.median(r[e] for r in runs[c]) for e in range(2)] for c in (False, True))
    print(f"{'':22}{'epoch 1':>12}{'epoch 2':>12}   (samples/s)")
    print(f"{'latent caching off':22}{off[0]:12.1f}{off[1]:12.1f}")
    print(f"{'latent caching on':22}{on[0]:12.1f}{on[1]:12.1f}")
    print(f"epoch 2 cached / uncached: {on[1] / off[1]:.1f}x   (goal >= 2x)")
    print(f"epoch 1 cached / uncached: {on[0] / off[0]:.2f}x   (the one-time cost of building the cache)")


if __name__ == "__main__":
    main()
