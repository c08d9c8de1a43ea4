"""Trainer overhead versus a bare loop, a tiny model, cached latents, same process and data.

    .venv/bin/python bench/overhead.py [--arch sd1|flux|…] [--steps 40] [--rounds 3] [--resolution 64] [--images 4]

Each round runs the real trainer (`trainer_backend.training.loop.train`: events, TensorBoard,
progress bar, stop checks, accumulation grouping, per-sample seeded noise) and a bare
loop (forward, loss, backward, optimizer step; nothing else) over the same cached
latents and captions, interleaved. Steps/s of the trainer come from its own `step`
events (first to last, so model loading and caching are excluded). Prints the medians
and the ratio; the goal is trainer >= 0.97x bare. For SD1 the bare loop is diffusers' plain
UNet call on epsilon noise; for other families it draws uniform noise levels and calls the
family's own forward (`predict`: Flux packs latents and adds position ids and guidance) under
rectified flow, which is all a bare loop for that model must do.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from conftest import make_dataset  # noqa: E402
from trainer_backend.config import load_config  # noqa: E402
from trainer_backend.data import TrainDataset, collate, scan_dataset  # noqa: E402
from trainer_backend.training.loop import train  # noqa: E402
from trainer_backend.methods.lora import setup_lora  # noqa: E402
from trainer_backend.families import load_model  # noqa: E402
from trainer_backend.families.sd.text import encode_text, tokenize  # noqa: E402
from trainer_backend.families import build_tiny_model  # noqa: E402
from trainer_backend.config.checks import validate_for_run  # noqa: E402


def trainer_rate(cfg) -> float:
    assert train(cfg) == 0
    steps = [json.loads(line) for line in (cfg.run_dir / "events.jsonl").read_text().splitlines()]
    steps = [e for e in steps if e["event"] == "step"]
    return (len(steps) - 1) / (steps[-1]["time"] - steps[0]["time"])


def bare_rate(cfg, steps: int) -> float:
    """The minimum loop: same model, LoRA, optimizer, batch and cached latents."""
    torch.manual_seed(cfg.schedule.seed)
    model = load_model(cfg.model.path)
    scan = scan_dataset(cfg)
    dataset = TrainDataset(scan, cfg)

    @torch.no_grad()
    def encode(pixels):
        return model.family.encode_latents(model, pixels, None)  # the posterior mean, scaled (and shifted)

    dataset.cache_latents(encode, None, progress=False, vae_id="bench")
    trainable = setup_lora(model, cfg)
    opt = torch.optim.AdamW(trainable.parameters(), lr=cfg.optimizer.lr)
    batch = collate([dataset[i] for i in range(cfg.schedule.batch_size)])
    sched, family = model.noise_scheduler, model.family
    ends = []  # measured like the trainer's events: first step end to last step end
    for _ in range(steps):
        latents = batch["latents"]
        noise = torch.randn_like(latents)
        if family.name == "sd1":
            t = torch.randint(0, 1000, (latents.shape[0],))
            hidden, _ = encode_text(model, tokenize(model, batch["caption"]))
            pred, target = model.unet(sched.add_noise(latents, noise, t), t, hidden).sample, noise
        else:  # rectified flow through the family's forward
            sigma = torch.rand(latents.shape[0])
            s4 = sigma.view(-1, 1, 1, 1)
            text = family.encode_text(model, family.tokenize(model, batch["caption"], 75))
            pred = family.predict(model, model.denoiser, (1 - s4) * latents + s4 * noise, sigma * 1000, text, batch,
                                  torch.float32)
            target = noise - latents
        loss = torch.nn.functional.mse_loss(pred, target)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        ends.append(time.perf_counter())
    return (len(ends) - 1) / (ends[-1] - ends[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default="sd1", help="a registered family with a tiny model (sd1, flux, …)")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--images", type=int, default=4, help="dataset size (batch 2: images/2 steps per epoch)")
    ap.add_argument("--rounds", type=int, default=5, help="the first round warms up and is not counted")
    ap.add_argument("--resolution", type=int, default=64)
    args = ap.parse_args()
    torch.set_num_threads(torch.get_num_threads())
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        model_dir = build_tiny_model(args.arch, tmp / f"tiny-{args.arch}")
        data = make_dataset(tmp / "data", n=args.images, size=args.resolution)
        trainer, bare = [], []
        for r in range(args.rounds):
            cfg = validate_for_run(load_config(None, [
                f"model.path={model_dir}", f"dataset.path={data}", f"dataset.resolution={args.resolution}",
                "dataset.cache_latents=true", f"output.dir={tmp / 'runs'}", f"output.name=r{r}",
                f"schedule.max_steps={args.steps}", "schedule.batch_size=2", "precision.mixed=no",
                "network.rank=4", "network.alpha=4", "hardware.cpu=true"]))
            # alternate which runs first, so drift in machine load hits both alike
            if r % 2:
                b_rate, t_rate = bare_rate(cfg, args.steps), trainer_rate(cfg)
            else:
                t_rate, b_rate = trainer_rate(cfg), bare_rate(cfg, args.steps)
            label = "warm-up, not counted" if r == 0 else ""
            if r > 0:
                trainer.append(t_rate)
                bare.append(b_rate)
            print(f"round {r + 1}: trainer {t_rate:.2f} steps/s, bare {b_rate:.2f} steps/s {label}", flush=True)
    t, b = statistics.median(trainer), statistics.median(bare)
    print(f"median trainer {t:.2f} steps/s | bare loop {b:.2f} steps/s | ratio {t / b:.3f} (goal >= 0.97)")


if __name__ == "__main__":
    main()
