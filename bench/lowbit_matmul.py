"""Time of one frozen-base Linear (forward + input gradient) in 8 bits vs the plain matmul
(model.quantize = int8_compute / float8_compute, compute/lowbit_linear.py).

    .venv/bin/python bench/lowbit_matmul.py [--device cpu] [--rows 1024] [--repeats 5]
    python bench/lowbit_matmul.py --device cuda --dtype bf16

For a few layer sizes (in x out, as in SD1/SDXL/Flux attention and MLP layers) it prints the median time of
the plain layer (F.linear in --dtype, grad to the input) and of LowBitLinear for each kind, and their ratio
(< 1 = the 8-bit layer is faster). Quantizing the activations per row is part of the 8-bit time. The CPU
figures say nothing about a GPU: torch's CPU int8/float8 matmuls are reference kernels, not tuned ones.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from trainer_backend.compute.lowbit_linear import COMPUTE_KINDS, LowBitLinear  # noqa: E402

SIZES = [(320, 320), (640, 2560), (1280, 5120), (3072, 3072)]
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def timed(layer, x, device, repeats: int) -> float:
    def once():
        xi = x.detach().requires_grad_(True)
        layer(xi).sum().backward()
    once()  # warm-up
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        once()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", choices=DTYPES, default="fp32")
    ap.add_argument("--rows", type=int, default=1024, help="activation rows (batch x tokens)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--kinds", nargs="*", default=list(COMPUTE_KINDS))
    args = ap.parse_args()
    device, dtype = torch.device(args.device), DTYPES[args.dtype]
    torch.manual_seed(0)
    print(f"device {device}, {args.dtype}, {args.rows} rows, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads; median of {args.repeats} (forward + input gradient)")
    print(f"{'in x out':>12} {'plain ms':>9} " + " ".join(f"{k + ' ms':>19} {'ratio':>6}" for k in args.kinds))
    for k, n in SIZES:
        linear = torch.nn.Linear(k, n).to(device, dtype).requires_grad_(False)
        x = torch.randn(args.rows, k, device=device, dtype=dtype)
        plain = timed(linear, x, device, args.repeats)
        cells = []
        for kind in args.kinds:
            t = timed(LowBitLinear(linear, kind), x, device, args.repeats)
            cells.append(f"{t * 1e3:19.2f} {t / plain:6.2f}")
        print(f"{k:>5} x {n:<5} {plain * 1e3:9.2f} " + " ".join(cells))


if __name__ == "__main__":
    main()
