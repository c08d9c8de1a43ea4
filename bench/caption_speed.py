"""Images per second of each tiny captioner on this machine (a regression figure, not a quality one:
the tiny models' text is gibberish), at batch 1 and batch 4, measured in one run (interleaved rounds, medians).

    PYTHONPATH=$PWD .venv/bin/python bench/caption_speed.py [--images 16] [--new-tokens 16] [--size 64]

On a GPU (--device cuda) the same script measures the real models given with --model KIND=FOLDER
(e.g. --model florence2=/models/Florence-2-base --model qwen2_5_vl=/models/Qwen2.5-VL-3B-Instruct
--size 1024) and prints the peak GPU memory too (docs/dataset.md, "Captioning")."""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def images(n: int, size: int) -> list:
    import numpy as np
    from PIL import Image
    rng = np.random.default_rng(0)
    return [Image.fromarray(rng.integers(0, 255, (size, size, 3), dtype=np.uint8)) for _ in range(n)]


def measure(captioner, pics: list, batch: int) -> float:
    captioner(pics[:batch])   # warm-up: first-call allocations and kernel selection
    started = time.perf_counter()
    for first in range(0, len(pics), batch):
        captioner(pics[first:first + batch])
    return len(pics) / (time.perf_counter() - started)


def main() -> None:
    from trainer_backend.captioners.job import Captioner
    from trainer_backend.captioners.kinds import KIND_NAMES, detect_kind
    from trainer_backend.captioners.options import CaptionOptions
    from trainer_backend.captioners.tiny import build_tiny_captioner
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--model", action="append", default=[], metavar="KIND=FOLDER")
    args = parser.parse_args()
    import torch
    pics = images(args.images, args.size)
    folders = dict(m.split("=", 1) for m in args.model)
    with tempfile.TemporaryDirectory() as tmp:
        print(f"{'captioner':<12} {'batch 1 img/s':>14} {'batch 4 img/s':>14} {'4 vs 1':>7} {'peak GiB':>9}")
        for kind in (folders or KIND_NAMES):
            folder = Path(folders[kind]) if folders else build_tiny_captioner(kind, Path(tmp) / kind)
            options = CaptionOptions(dataset=tmp, model=str(folder), device=args.device, max_new_tokens=args.new_tokens)
            k = detect_kind(folder)
            captioner = Captioner(folder, k, options, k.targets[0])
            if args.device.startswith("cuda"):
                torch.cuda.reset_peak_memory_stats()
            rates = {1: [], 4: []}
            for _ in range(args.rounds):   # interleaved, medians: this machine's load comes and goes
                for batch in rates:
                    rates[batch].append(measure(captioner, pics, batch))
            one, four = statistics.median(rates[1]), statistics.median(rates[4])
            peak = torch.cuda.max_memory_allocated() / 2**30 if args.device.startswith("cuda") else float("nan")
            print(f"{kind:<12} {one:>14.2f} {four:>14.2f} {four / one:>7.2f} {peak:>9.2f}", flush=True)


if __name__ == "__main__":
    main()
