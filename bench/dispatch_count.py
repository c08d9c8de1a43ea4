"""Operators dispatched per training step, by kind: what bf16 autocast costs with fp32 adapters.

    .venv/bin/python bench/dispatch_count.py [--arch sdxl] [--resolution 64] [--targets to_q,to_k,to_v,to_out.0]

A step that is bound by the CPU (the H100 profile of SDXL LoRA at 1024²: the GPU busy 27 % of a
step) pays for every kernel it launches, so the count of operators a step dispatches is a speed
figure that a CPU can measure exactly. This runs the real trainer (`training.loop.train`) in this
process under a `TorchDispatchMode` that counts every aten operator (below autograd and autocast,
so autocast's casts and the backward's ops are counted too), once for N and once for 2N steps:
the difference ÷ N is one step's count, with model loading, caching and the final save cancelled
out. Settings compared (LoRA on the attention targets, bf16 autocast as on a GPU):

- `mixed bf16`: our default, adapters in fp32 under bf16 autocast (small updates are kept);
- `full_bf16`: `precision.full_bf16 = true`, adapters in bf16 like the diffusers examples' bf16
  runs (their LoRA weights take the UNet's dtype; they upcast only for fp16), with stochastic
  rounding of the updates;
- `optimizer.fused = true`: PyTorch's fused AdamW kernel, on the fp32 adapters or (with `full_bf16` and nearest
  rounding) stepping the bf16 adapters itself, as the examples' bf16 runs do with torch's AdamW.

Prints ops per step, casts/copies per step (`_to_copy`, `copy_`), and the ratios. Counts are
deterministic; the bf16 autocast on a CPU is slow, so keep the resolution small.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from collections import Counter
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from conftest import make_dataset  # noqa: E402
from trainer_backend.config import load_config  # noqa: E402
from trainer_backend.config.checks import validate_for_run  # noqa: E402
from trainer_backend.families import build_tiny_model  # noqa: E402
from trainer_backend.training.loop import train  # noqa: E402

CASTS = ("aten._to_copy", "aten.copy_")


class OpCounter(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[func.overloadpacket._qualified_op_name.replace("::", ".")] += 1
        return func(*args, **(kwargs or {}))


def run_counts(overrides: list[str]) -> Counter:
    cfg = validate_for_run(load_config(None, overrides))
    with OpCounter() as counter:
        assert train(cfg) == 0
    return counter.ops


def per_step(base: list[str], extra: list[str], steps: int, out: Path, label: str) -> Counter:
    short = run_counts(base + extra + [f"schedule.max_steps={steps}", f"output.name={label}-a",
                                       f"output.dir={out}"])
    long = run_counts(base + extra + [f"schedule.max_steps={2 * steps}", f"output.name={label}-b",
                                      f"output.dir={out}"])
    return Counter({op: (long[op] - short[op]) / steps for op in long if long[op] != short[op]})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default="sdxl")
    ap.add_argument("--resolution", type=int, default=64)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--targets", default="to_q,to_k,to_v,to_out.0")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        model = build_tiny_model(args.arch, tmp / f"tiny-{args.arch}")
        data = make_dataset(tmp / "data", n=2, size=args.resolution)
        targets = ",".join(f'"{t}"' for t in args.targets.split(","))
        base = [f"model.path={model}", f"dataset.path={data}", f"dataset.resolution={args.resolution}",
                "dataset.cache_text_encoder_outputs=true", "schedule.batch_size=1", "precision.mixed=bf16",
                "network.rank=4", "network.alpha=4", f"network.target_modules=[{targets}]",
                "hardware.cpu=true", "checkpoints.every_n_steps=0", "logging.tensorboard=false"]
        settings = {"mixed bf16 (fp32 adapters)": [],
                    "full_bf16, stochastic rounding": ["precision.full_bf16=true"],
                    "full_bf16, nearest rounding": ["precision.full_bf16=true",
                                                    'precision.half_weights_rounding="nearest"'],
                    "mixed bf16, fused AdamW": ["optimizer.fused=true"],
                    "full_bf16, nearest, fused AdamW": ["precision.full_bf16=true", "optimizer.fused=true",
                                                        'precision.half_weights_rounding="nearest"']}
        counts = {name: per_step(base, extra, args.steps, tmp / "runs", f"r{i}")
                  for i, (name, extra) in enumerate(settings.items())}
    print(f"tiny {args.arch}, {args.resolution}², LoRA on {args.targets}, ops dispatched per optimizer step")
    print(f"{'setting':<32} {'all ops':>9} {'casts/copies':>13}")
    for name, c in counts.items():
        print(f"{name:<32} {sum(c.values()):>9.0f} {sum(c[o] for o in CASTS):>13.0f}")
    names = list(counts)
    ref = counts[names[0]]
    for name in names[1:]:
        c = counts[name]
        print(f"{name} / {names[0]}: all ops {sum(c.values()) / sum(ref.values()):.3f}, casts/copies "
              f"{sum(c[o] for o in CASTS) / sum(ref[o] for o in CASTS):.3f}")
        diff = Counter({op: c[op] - ref[op] for op in set(c) | set(ref)})
        print("  most changed ops per step: " + ", ".join(f"{op} {n:+.0f}" for op, n in
                                                        sorted(diff.items(), key=lambda kv: -abs(kv[1]))[:6]))

if __name__ == "__main__":
    main()
