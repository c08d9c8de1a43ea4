"""Memory of a full fine-tune of the tiny SDXL model with and without precision.full_bf16.

    .venv/bin/python bench/full_bf16_memory.py [--steps 3] [--resolution 32]

Each mode runs in a fresh process (peaks do not mix) and reports:
- training state: bytes held by the trained weights, their gradients and the optimizer state after
  one real step (exact; the part full_bf16 changes; scales with the model, see bytes/param);
- peak memory while `train(cfg)` runs, from trainer_backend.compute.devices (CUDA/ROCm: peak allocated
  tensor memory; CPU: peak resident set above the resident set just before training).
On a CPU with the tiny model the peak is dominated by the Python/torch runtime and the data
pipeline, so it moves far less than the training state; on a real SDXL UNet (2.6 B parameters)
the training state is most of it: ~41 GB with fp32 master weights vs ~21 GB with full_bf16.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MODES = {
    "fp32 master weights (mixed bf16)": ["precision.mixed=bf16"],
    "full_bf16, stochastic rounding": ["precision.mixed=bf16", "precision.full_bf16=true"],
    "full_bf16, Kahan summation": ["precision.mixed=bf16", "precision.full_bf16=true",
                                   "precision.half_weights_rounding=kahan"],
}


def overrides(workdir: Path, model: Path, data: Path, steps: int, resolution: int, mode: list[str]) -> list[str]:
    return [f"model.path={model}", f"dataset.path={data}", f"dataset.resolution={resolution}",
            f"output.dir={workdir / 'runs'}", "output.name=bench", "hardware.cpu=true", "logging.tensorboard=false",
            "network.type=full", "optimizer.name=adamw", "optimizer.lr=1e-4", f"schedule.max_steps={steps}",
            "checkpoints.at_end=false", "checkpoints.resume=none", *mode]


def measure(args: list[str]) -> dict:
    """In this (fresh) process: the training state after one step, then the peak during train()."""
    import torch
    from trainer_backend.compute import devices
    from trainer_backend.config import load_config
    from trainer_backend.training.full_half_precision import keep_half_weights
    from trainer_backend.data.indexed import IndexedDataset, collate_with_index
    from trainer_backend.training.loop import train
    from trainer_backend.diffusion.loss import diffusion_loss
    from trainer_backend.methods import setup_method
    from trainer_backend.training.optimizers import build_optimizer
    from trainer_backend.training.half_precision_optimizers import optimizer_state_bytes
    from trainer_backend.training.setup import build_dataset, load_base_model, make_accelerator, open_run, place_model, \
        scan_data
    from trainer_backend.config.checks import validate_for_run

    cfg = validate_for_run(load_config(None, args))
    device = torch.device("cpu") if cfg.hardware.cpu else devices.as_device()
    before = devices.memory_stats(device).allocated
    devices.reset_peak_memory(device)
    assert train(cfg) == 0
    peak = devices.peak_memory_bytes(device)

    # the training state after one real step, set up as train() does
    accelerator = make_accelerator(cfg)
    run = open_run(cfg, accelerator)
    model = load_base_model(cfg, accelerator)
    weight_dtype = place_model(model, cfg, accelerator)
    scan = scan_data(cfg)
    dataset = build_dataset(cfg, scan, scan.counts, model, accelerator, run)
    trainable = setup_method(model, cfg)
    keep_half_weights(trainable, cfg, accelerator)
    optimizer = build_optimizer(cfg, trainable.param_groups)
    batch = collate_with_index([IndexedDataset(dataset)[0]])
    with accelerator.autocast():
        loss = diffusion_loss(model, model.unet, batch, cfg=cfg, epoch=0, device=accelerator.device,
                              weight_dtype=weight_dtype)
    loss.backward()
    optimizer.step()
    params = trainable.parameters()
    run.events.close()
    return {"params": sum(p.numel() for p in params),
            "weights": sum(p.numel() * p.element_size() for p in params),
            "grads": sum(p.grad.numel() * p.grad.element_size() for p in params if p.grad is not None),
            "optimizer": optimizer_state_bytes(optimizer), "peak": peak, "before": before,
            "device": devices.device_kind(device), "param_dtype": str(params[0].dtype).replace("torch.", "")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--resolution", type=int, default=32)
    parser.add_argument("--measure", help=argparse.SUPPRESS)  # internal: JSON overrides, run in a child
    args = parser.parse_args()
    if args.measure:
        print("RESULT " + json.dumps(measure(json.loads(args.measure))))
        return 0

    sys.path.insert(0, str(ROOT / "tests"))
    from conftest import make_dataset
    from trainer_backend.families import build_tiny_model
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model = build_tiny_model("sdxl", work / "tiny-sdxl")
        data = make_dataset(work / "data", n=4, size=args.resolution)
        results = {}
        for name, mode in MODES.items():
            child = overrides(work / name.split(",")[0].replace(" ", "_"), model, data, args.steps,
                              args.resolution, mode)
            out = subprocess.run([sys.executable, __file__, "--measure", json.dumps(child)], capture_output=True,
                                 text=True, cwd=ROOT)
            line = next((ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")), None)
            if line is None:
                print(out.stdout[-2000:], out.stderr[-4000:], file=sys.stderr)
                return 1
            results[name] = json.loads(line[len("RESULT "):])

    mib = 1024 * 1024
    print(f"Full fine-tune of tiny SDXL, {args.steps} steps at {args.resolution} px, AdamW, "
          f"device {next(iter(results.values()))['device']}")
    print(f"{'mode':34} {'dtype':>8} {'params':>10} {'weights':>9} {'grads':>9} {'optim':>9} {'state':>9} "
          f"{'B/param':>8} {'peak':>9} {'peak-start':>10}")
    for name, r in results.items():
        total = r["weights"] + r["grads"] + r["optimizer"]
        print(f"{name:34} {r['param_dtype']:>8} {r['params']:>10,} {r['weights'] / mib:>8.2f}M "
              f"{r['grads'] / mib:>8.2f}M {r['optimizer'] / mib:>8.2f}M {total / mib:>8.2f}M "
              f"{total / r['params']:>8.1f} {r['peak'] / mib:>8.1f}M {(r['peak'] - r['before']) / mib:>9.1f}M")
    base, half = (results[k] for k in list(MODES)[:2])
    state_ratio = (half["weights"] + half["grads"] + half["optimizer"]) / (
        base["weights"] + base["grads"] + base["optimizer"])
    print(f"training state full_bf16 / fp32 master: {state_ratio:.2f}")
    print(f"peak memory during train(), full_bf16 / fp32 master: {half['peak'] / base['peak']:.3f} "
          f"(above the start: {(half['peak'] - half['before']) / max(1, base['peak'] - base['before']):.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
