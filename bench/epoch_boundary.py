"""How long a training step waits for its batch at an epoch boundary, with and without starting
the next epoch's DataLoader workers ahead (training/epoch_loaders.py).

    .venv/bin/python bench/epoch_boundary.py [--images 4] [--size 1024] [--workers 2] [--epochs 5] [--step-s 0.5]

The trainer's real dataset and loaders read generated PNGs (decode, resize, crop, to tensor) with
worker processes, as on a GPU machine; a sleep of --step-s stands in for the GPU step (the process
waits on the device and the CPU is free for the workers, as there). Prints the mean wait for a
batch at the first step of an epoch and inside epochs, both ways, and their ratio. On an H200 the
boundary cost SDXL LoRA ~0.8 s every 4th step with 4 images an epoch (docs/performance.md "Measured on a GPU").
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from trainer_backend.config import load_config  # noqa: E402
from trainer_backend.data import TrainDataset, scan_dataset  # noqa: E402
from trainer_backend.training.epoch_loaders import EpochLoaders  # noqa: E402
from trainer_backend.training.loop import make_sampler  # noqa: E402


class OneProcess:
    num_processes, process_index = 1, 0


def waits(cfg, epochs: int, step_s: float, ahead: bool) -> tuple[list[float], list[float]]:
    dataset = TrainDataset(scan_dataset(cfg), cfg)
    loaders = EpochLoaders(cfg, dataset, make_sampler(cfg, dataset, OneProcess()), epochs, start_ahead=ahead)
    first, inside = [], []
    for epoch in range(epochs):
        batches = loaders.epoch(epoch)
        for i in range(len(dataset)):
            t = time.perf_counter()
            next(batches)
            (first if i == 0 else inside).append(time.perf_counter() - t)
            time.sleep(step_s)  # the GPU step: the trainer waits on the device
        for _ in batches:  # (none left) ends the epoch's iterator as the loop does
            pass
    loaders.close()
    return first[1:], inside  # epoch 0's first batch pays the start in both ways


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=4)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--step-s", type=float, default=0.5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        data.mkdir()
        rng = np.random.default_rng(0)
        for i in range(args.images):
            pixels = rng.integers(0, 256, (args.size, args.size, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(data / f"{i}.png")
            (data / f"{i}.txt").write_text("a photo of sks dog")
        cfg = load_config(None, [f"dataset.path={data}", f"dataset.resolution={args.size}",
                                 f"dataset.num_workers={args.workers}", "hardware.cpu=true",
                                 f"output.dir={Path(tmp) / 'out'}"])
        rows = {}
        for ahead in (False, True, False, True):  # interleaved: two rounds each
            first, inside = waits(cfg, args.epochs, args.step_s, ahead)
            rows.setdefault(ahead, ([], []))
            rows[ahead][0].extend(first)
            rows[ahead][1].extend(inside)
    print(f"{args.images} images of {args.size}² a epoch, {args.workers} workers, a {args.step_s} s step, "
          f"{args.epochs} epochs, two rounds each")
    for ahead, (first, inside) in rows.items():
        name = "next epoch's workers started ahead" if ahead else "workers started at each epoch"
        print(f"  {name:38s} wait at an epoch's first step {statistics.mean(first) * 1000:7.1f} ms, "
              f"inside an epoch {statistics.mean(inside) * 1000:6.1f} ms")
    before, after = statistics.mean(rows[False][0]), statistics.mean(rows[True][0])
    print(f"wait at the first step of an epoch: {after * 1000:.1f} ms vs {before * 1000:.1f} ms "
          f"({after / before:.3f}x)")


if __name__ == "__main__":
    main()
