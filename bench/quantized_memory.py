"""Weight bytes, peak memory and step time of LoRA training with a quantized frozen base
(model.quantize and model.quantize_text_encoders = none | int8 | float8 | nf4).

    .venv/bin/python bench/quantized_memory.py --tiny [--model sdxl] [--steps 4] [--resolution 32]
    python bench/quantized_memory.py --device cuda --model sdxl [--resolution 1024] [--steps 6]

Each mode runs the real trainer (`train(cfg)`) in a fresh process (peaks do not mix), the same LoRA
on the same images; the denoiser and the text encoders are quantized alike. It reports, per mode:
- weights: bytes of the denoiser's linear layers (what is quantized), of the whole denoiser and of the
  text encoders as placed on the device (quantized tensors at their real size: torchao's inner tensors,
  bitsandbytes' packed weights plus absmax); the tiny models are mostly convolutions, full-size ones
  mostly linear layers;
- peak: peak memory while train() runs (CUDA: peak allocated tensor bytes; CPU: peak resident set
  above the resident set just before training: on the CPU with a tiny model the Python/torch runtime
  dominates it);
- s/step: the median step time after the first step (CPU: no int8/float8 kernels, so slower).
and the ratios to the unquantized run. With OUT set, one JSON line per mode goes to
$OUT/quantized_memory.jsonl. Full size (--device cuda): the model is built with random weights from
the bundled configs by bench/gpubench/models.py (nothing is downloaded).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
MODES = ("none", "int8", "float8", "nf4")


def overrides(work: Path, model: Path, data: Path, mode: str, args) -> list[str]:
    cuda = args.device != "cpu"
    return [f"model.path={model}", f"dataset.path={data}", f"dataset.resolution={args.resolution}",
            f"output.dir={work / 'runs'}", f"output.name=q-{mode}", f"hardware.cpu={str(not cuda).lower()}",
            "logging.tensorboard=false", "network.rank=16", "network.alpha=16", "optimizer.lr=1e-4",
            f"schedule.max_steps={args.steps}", "checkpoints.at_end=false", "checkpoints.resume=none",
            f"precision.mixed={'bf16' if cuda else 'no'}", f"precision.gradient_checkpointing={str(cuda).lower()}",
            "dataset.class_tokens=a photo", f"model.quantize={mode}", f"model.quantize_text_encoders={mode}"]


def measure(args: list[str]) -> dict:
    """In this (fresh) process: the peak during train(), then the weight bytes as place_model leaves them."""
    import torch
    from trainer_backend.config import load_config
    from trainer_backend.config.checks import validate_for_run
    from trainer_backend.compute import devices
    from trainer_backend.training.loop import train
    from trainer_backend.compute.quantize import weight_bytes
    from trainer_backend.training.setup import load_base_model, make_accelerator, place_model

    cfg = validate_for_run(load_config(None, args))
    device = torch.device("cpu") if cfg.hardware.cpu else devices.as_device()
    before = devices.memory_stats(device).allocated
    devices.reset_peak_memory(device)
    assert train(cfg) == 0
    peak = devices.peak_memory_bytes(device)
    events = [json.loads(line) for line in (cfg.run_dir / "events.jsonl").read_text().splitlines()]
    rates = [e["it_per_s"] for e in events if e["event"] == "step" and e.get("it_per_s")][1:]
    from accelerate.state import AcceleratorState
    AcceleratorState._reset_state(reset_partial_state=True)
    accelerator = make_accelerator(cfg)
    model = load_base_model(cfg, accelerator)
    place_model(model, cfg, accelerator)
    return {"mode": cfg.model.quantize, "device": devices.device_kind(device),
            "denoiser_bytes": weight_bytes(model.denoiser), "linear_bytes": linear_bytes(model.denoiser),
            "text_encoder_bytes": sum(weight_bytes(te) for te in model.text_encoders),
            "peak": peak, "before": before, "s_per_step": 1 / statistics.median(rates) if rates else None}


def linear_bytes(module) -> int:
    """Bytes of the denoiser's linear layers (bitsandbytes' Linear4bit is one too): what quantization acts on."""
    import torch
    from trainer_backend.compute.quantize import weight_bytes
    return sum(weight_bytes(m) for m in module.modules() if isinstance(m, torch.nn.Linear))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="the family's tiny random model (CPU-sized)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--model", default="sd15", choices=("sd15", "sdxl", "flux"))
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--resolution", type=int, default=0, help="0 = 32 tiny, 1024 full size")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--workdir", default="", help="keep the built model here (default: a temp folder)")
    parser.add_argument("--measure", help=argparse.SUPPRESS)  # internal: JSON overrides, run in a child
    args = parser.parse_args()
    if args.measure:
        print("RESULT " + json.dumps(measure(json.loads(args.measure))))
        return 0
    if not args.tiny and args.device == "cpu":
        parser.error("a full-size model on the CPU takes many minutes and tens of GB: use --tiny or --device cuda")
    args.resolution = args.resolution or (32 if args.tiny else 1024)
    sys.path.insert(0, str(ROOT / "bench" / "gpubench"))
    from models import build, make_images

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.workdir or tmp)
        model = build(args.model, work / f"model-{args.model}{'-tiny' if args.tiny else ''}", args.device, args.tiny)
        data = make_images(work / f"images-{args.resolution}", args.resolution)
        results = []
        for mode in args.modes.split(","):
            child = overrides(work / mode, model, data, mode, args)
            out = subprocess.run([sys.executable, __file__, "--measure", json.dumps(child)], capture_output=True,
                                 text=True, cwd=ROOT)
            line = next((ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")), None)
            if line is None:
                print(f"mode {mode} failed:", out.stdout[-2000:], out.stderr[-4000:], file=sys.stderr)
                return 1
            results.append({**json.loads(line[len("RESULT "):]), "model": args.model, "tiny": args.tiny,
                            "resolution": args.resolution, "steps": args.steps})
    report(results)
    if os.environ.get("OUT"):
        with open(Path(os.environ["OUT"]) / "quantized_memory.jsonl", "a", encoding="utf-8") as f:
            for r in results:
                f.write(json.dumps(r) + "\n")
    return 0


def report(results: list[dict]) -> None:
    mib = 1024 * 1024
    base = next((r for r in results if r["mode"] == "none"), results[0])
    r0 = results[0]
    print(f"LoRA rank 16 on {'tiny ' if r0['tiny'] else ''}{r0['model']}, {r0['steps']} steps at "
          f"{r0['resolution']} px, device {r0['device']}")
    print(f"{'mode':7} {'linear':>9} {'ratio':>6} {'denoiser':>10} {'ratio':>6} {'text enc.':>10} {'ratio':>6} {'peak':>10} {'ratio':>6} "
          f"{'peak-start':>10} {'ratio':>6} {'s/step':>7} {'ratio':>6}")
    for r in results:
        rise, base_rise = r["peak"] - r["before"], max(1, base["peak"] - base["before"])
        step = r["s_per_step"] or float("nan")
        base_step = base["s_per_step"] or float("nan")
        print(f"{r['mode']:7} {r['linear_bytes'] / mib:>8.2f}M {r['linear_bytes'] / base['linear_bytes']:>6.3f} "
              f"{r['denoiser_bytes'] / mib:>9.2f}M {r['denoiser_bytes'] / base['denoiser_bytes']:>6.3f} "
              f"{r['text_encoder_bytes'] / mib:>9.2f}M "
              f"{r['text_encoder_bytes'] / max(1, base['text_encoder_bytes']):>6.3f} "
              f"{r['peak'] / mib:>9.1f}M {r['peak'] / base['peak']:>6.3f} {rise / mib:>9.1f}M {rise / base_rise:>6.3f} "
              f"{step:>7.3f} {step / base_step:>6.2f}")


if __name__ == "__main__":
    sys.exit(main())
