"""Peak memory and step time with and without memory.block_swap, memory.offload_encoders and
optimizer.fused_backward, each mode a real `train(cfg)` in a fresh process (peaks do not mix).

    .venv/bin/python bench/memory_swap_fused.py --tiny [--arch sd1] [--swap 2] [--steps 3] [--quantize int8]
    python bench/memory_swap_fused.py --device cuda --arch sdxl [--swap 5] [--resolution 1024]   # SDXL has 7 blocks

--tiny trains the family's tiny random model on the CPU; without it the full-size model is built with
random weights from the bundled configs (bench/gpubench/models.py; sd15, sdxl, flux). Each mode reports:
- peak: CUDA's peak allocated tensor memory during train() (CPU: peak resident set, where host and
  "device" are the same memory, so block swap cannot lower it there);
- denoiser on device: the most bytes of the denoiser's weights and buffers on their device copies at any
  block's start (what block swap lowers; measured through the swap's own bookkeeping, so it is exact on
  the CPU too);
- gradients: the most trained-weight gradient bytes alive at once (what fused_backward lowers);
- s/step: median seconds per step after the first.
Ratios are against the plain mode of the same method (LoRA or full fine-tune). --quantize KIND adds
"lora, KIND" and "lora, KIND, block_swap=N" (model.quantize: the swapped blocks move at their quantized size;
quantized weights are counted by their real bytes, inner tensors and nf4 quant_state included).
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def modes(swap: int, quantize: str = "") -> dict[str, list[str]]:
    full = ["network.type=full", "optimizer.max_grad_norm=0"]
    quantized = {f"lora, {quantize}": [f"model.quantize={quantize}"],
                 f"lora, {quantize}, block_swap={swap}": [f"model.quantize={quantize}", f"memory.block_swap={swap}"]}
    return {
        "lora": [],
        **(quantized if quantize else {}),
        f"lora, block_swap={swap}": [f"memory.block_swap={swap}"],
        "lora, offload_encoders": ["memory.offload_encoders=true"],
        "full": full,
        "full, fused_backward": [*full, "optimizer.fused_backward=true"],
        f"full, fused_backward, block_swap={swap}": [*full, "optimizer.fused_backward=true",
                                                    f"memory.block_swap={swap}"],
    }


def measure(args: list[str]) -> dict:
    """In this (fresh) process: train(cfg) with probes on the denoiser's blocks and the trained weights."""
    import torch
    from trainer_backend.config import load_config
    from trainer_backend.config.checks import validate_for_run
    from trainer_backend.training import loop, memory_setup
    from trainer_backend.compute import devices
    from trainer_backend.compute.weight_storage import leaves, quant_state_leaves, quant_state_of, storage_of

    def parts(t) -> list:
        return [*leaves(storage_of(t)), *quant_state_leaves(quant_state_of(t))]

    cfg = validate_for_run(load_config(None, args))
    device = torch.device("cpu") if cfg.hardware.cpu else devices.as_device()
    found = {"device_bytes": 0, "grad_bytes": 0, "steps": []}

    def install(cfg, model, trainable, optimizer, dev):
        installed = memory_setup.install_after_prepare(cfg, model, trainable, optimizer, dev)
        swap = installed.get("block_swap")
        tensors = [*model.denoiser.parameters(), *model.denoiser.buffers()]

        def on_device_bytes(*_):
            total = 0
            for t in tensors:
                now = parts(t)
                home = swap is not None and id(t) in swap.host and {x.data_ptr() for x in now} == {
                    x.data_ptr() for x in (*leaves(swap.host[id(t)]), *quant_state_leaves(swap.host_states.get(id(t))))}
                total += 0 if home else sum(x.numel() * x.element_size() for x in now)
            found["device_bytes"] = max(found["device_bytes"], total)

        for block in model.family.blocks(model):
            block.register_forward_pre_hook(on_device_bytes)
        params = trainable.parameters()

        def on_grad(p):
            alive = sum(q.grad.numel() * q.grad.element_size() for q in params if q.grad is not None)
            found["grad_bytes"] = max(found["grad_bytes"], alive + (p.numel() * p.element_size()
                                                                     if p.grad is None else 0))
        for p in params:  # after the fused step's own hook (which frees the gradient it used)
            p.register_post_accumulate_grad_hook(on_grad)
        return installed

    step = loop.optimizer_step

    def timed_step(*a, **k):
        devices.synchronize(device)
        found["steps"].append(time.perf_counter())
        return step(*a, **k)

    loop.install_after_prepare, loop.optimizer_step = install, timed_step
    devices.reset_peak_memory(device)
    assert loop.train(cfg) == 0
    times = [b - a for a, b in zip(found["steps"], found["steps"][1:])]
    return {"peak": devices.peak_memory_bytes(device), "device_bytes": found["device_bytes"],
            "grad_bytes": found["grad_bytes"], "s_per_step": statistics.median(times) if times else 0.0,
            "device": devices.device_kind(device)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="the family's tiny random model (CPU check)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--arch", default="sd1", help="sd1/sdxl/sd3/flux with --tiny; sd15/sdxl/flux full size")
    parser.add_argument("--swap", type=int, default=2, help="memory.block_swap in the swap modes")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--resolution", type=int, default=32)
    parser.add_argument("--only", default="", help="mode names separated by | (default: all)")
    parser.add_argument("--quantize", default="", help="also the modes 'lora, KIND' and 'lora, KIND, block_swap=N'")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override for every mode, e.g. precision.gradient_checkpointing=true")
    parser.add_argument("--measure", help=argparse.SUPPRESS)  # internal: JSON overrides, run in a child
    args = parser.parse_args()
    if args.measure:
        print("RESULT " + json.dumps(measure(json.loads(args.measure))))
        return 0

    sys.path.insert(0, str(ROOT / "tests"))
    from conftest import make_dataset
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if args.tiny:
            from trainer_backend.families import build_tiny_model
            model = build_tiny_model(args.arch, work / "model")
        else:
            sys.path.insert(0, str(ROOT / "bench"))
            from gpubench.models import build
            model = build(args.arch, work / "model", args.device, tiny=False)
        data = make_dataset(work / "data", n=4, size=args.resolution)
        results = {}
        chosen = {n: m for n, m in modes(args.swap, args.quantize).items()
                  if not args.only or n in args.only.split("|")}
        for name, mode in chosen.items():
            child = [f"model.path={model}", f"dataset.path={data}", f"dataset.resolution={args.resolution}",
                     f"output.dir={work / 'runs'}", f"output.name=m{len(results)}", "logging.tensorboard=false",
                     f"hardware.cpu={str(args.device == 'cpu').lower()}", f"schedule.max_steps={args.steps}",
                     "checkpoints.at_end=false", "checkpoints.resume=none", "optimizer.lr=1e-4",
                     "precision.mixed=" + ("no" if args.device == "cpu" else "bf16"), *args.set, *mode]
            out = subprocess.run([sys.executable, __file__, "--measure", json.dumps(child)], capture_output=True,
                                 text=True, cwd=ROOT)
            line = next((ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")), None)
            if line is None:
                print(f"{name}: failed\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}", file=sys.stderr)
                continue
            results[name] = json.loads(line[len("RESULT "):])
            r = results[name]
            base = results.get("full" if name.startswith("full") else "lora", r)
            mib = 1024 * 1024
            print(f"{name:40} peak {r['peak'] / mib:9.1f} MiB ({r['peak'] / base['peak']:.3f}x)  "
                  f"denoiser on device {r['device_bytes'] / mib:8.2f} MiB "
                  f"({r['device_bytes'] / max(1, base['device_bytes']):.3f}x)  "
                  f"gradients {r['grad_bytes'] / mib:8.2f} MiB ({r['grad_bytes'] / max(1, base['grad_bytes']):.3f}x)  "
                  f"{r['s_per_step']:.3f} s/step ({r['s_per_step'] / max(1e-9, base['s_per_step']):.2f}x)",
                  flush=True)
    print(f"arch {args.arch}{' (tiny)' if args.tiny else ''}, {args.steps} steps at {args.resolution} px, "
          f"device {next(iter(results.values()))['device'] if results else '?'}")
    return 0 if results else 1


if __name__ == "__main__":
    sys.exit(main())
