"""Train the demo's base model: a small SD1-architecture pipeline that draws coarse shapes.

    .venv/bin/python tools/make_demo_model.py [--out assets/demo_model] [--vae-steps N] [--unet-steps N]
    .venv/bin/python tools/make_demo_model.py --continue-from assets/demo_model --vae-steps N --unet-steps N

It learns from generated 64 px images (assets/make_demo_dataset.py: circles, squares and
triangles in eight colours on four backgrounds, each with its caption) and never sees pink,
the colour the demo preset's LoRA then teaches it. Three stages, all on the CPU:
1. a KL autoencoder (64 px <-> 16x16x4 latents; its scaling factor from the latents' spread), on the
   demo images and four times as many shapes in random colours (any colour but pink's neighbourhood: like a real
   SD VAE it must encode colours its UNet never drew, or a LoRA can never draw them),
2. the UNet and the CLIP text encoder together on the latents, DDPM epsilon objective with the
   SD1 noise schedule, 10 % empty captions (so classifier-free guidance works),
3. saved as a diffusers folder in fp16 (the trainer loads it in fp32) with the offline
   tokenizer of the builtin tiny models.
--continue-from trains an earlier result further (its autoencoder's decoder only, so the latents its UNet
learnt stay put): the committed model was made in rounds, listed in its
demo_model.json. Seeded and single-process: rerunning with the same torch version gives the same weights up to
float rounding across CPUs. The committed model: a fresh run (24.6 min), a decoder round (--vae-steps 600
--unet-steps 0, 9 min) and a UNet round (--vae-steps 0 --unet-steps 400, 8.5 min), 42 min on a 2-core machine
busy with other jobs (--threads 1; docs/demo.md); the result (2.6 MB) is committed in
assets/demo_model so the demo starts without it.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

LATENT_DOWNSAMPLE = 4   # 64 px images -> 16x16 latents: a cheap UNet step on a CPU


def _dataset_module():
    spec = importlib.util.spec_from_file_location("make_demo_dataset", ROOT / "assets" / "make_demo_dataset.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _demo_images():
    return _dataset_module().base_model_images()


def colour_images(count: int, seed: int, avoid_radius: float = 60.0):
    """Shapes in random colours on random backgrounds, for the autoencoder only: like a real SD VAE it must
    encode any colour, or no LoRA can ever make the colour the demo teaches (the first autoencoder saw only
    the eight caption colours and decoded pink as cream). Colours within avoid_radius (RGB distance) of the
    concept colour are redrawn, so pink itself stays unseen and the autoencoder has to interpolate to it."""
    import numpy as np
    module = _dataset_module()
    concept = np.array(module.COLOURS[module.CONCEPT_COLOUR], dtype=np.float64)
    rng = np.random.default_rng(seed)

    def colour():
        while True:
            c = rng.integers(0, 256, 3)
            if np.linalg.norm(c - concept) > avoid_radius:
                return tuple(int(v) for v in c)
    return [module.draw(module.SHAPES[i % len(module.SHAPES)], colour(), colour()) for i in range(count)]


def unet_config() -> dict:
    from trainer_backend.families.sd.tiny import _unet_config
    return {**_unet_config("sd1"), "sample_size": 64 // LATENT_DOWNSAMPLE}


def vae_config() -> dict:
    return dict(in_channels=3, out_channels=3, latent_channels=4, layers_per_block=1,
                block_out_channels=(16, 32, 32), norm_num_groups=8, sample_size=64,
                down_block_types=("DownEncoderBlock2D",) * 3, up_block_types=("UpDecoderBlock2D",) * 3,
                scaling_factor=1.0)


def log(msg: str) -> None:
    print(f"[demo-model] {msg}", flush=True)


def train_vae(pixels, colour_pixels, steps: int, seed: int, previous=None):
    """Half of each batch from the demo images, half from colour_images. previous: an earlier autoencoder
    whose decoder alone trains on (its encoder, and so the latents its UNet learnt, stay as they were)."""
    import torch
    from diffusers import AutoencoderKL
    torch.manual_seed(seed)
    vae = AutoencoderKL(**vae_config()) if previous is None else previous
    vae.train()
    if previous is not None:
        vae.encoder.requires_grad_(False)
        vae.quant_conv.requires_grad_(False)
    opt = torch.optim.Adam([p for p in vae.parameters() if p.requires_grad], lr=1e-3)
    g = torch.Generator().manual_seed(seed)
    t0 = time.time()
    for step in range(1, steps + 1):
        # random 32 px crops: the autoencoder is convolutional, and flat shapes' edges look alike at any size
        top, left = (int(v) for v in torch.randint(0, 33, (2,), generator=g))
        x = torch.cat([pixels[torch.randint(len(pixels), (4,), generator=g)],
                       colour_pixels[torch.randint(len(colour_pixels), (4,), generator=g)]])
        x = x[:, :, top:top + 32, left:left + 32]
        post = vae.encode(x).latent_dist
        rec = vae.decode(post.sample(generator=g)).sample
        loss = torch.nn.functional.mse_loss(rec, x) + 1e-6 * post.kl().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % 20 == 0 or step == steps:
            log(f"vae step {step}/{steps} loss {loss.item():.4f} ({time.time() - t0:.0f} s)")
    vae.eval()
    with torch.no_grad():
        latents = vae.encode(pixels).latent_dist.mode()
        err = torch.nn.functional.mse_loss(vae.decode(latents).sample, pixels).item()
    scale = float(1.0 / latents.std()) if previous is None else vae.config.scaling_factor
    vae.register_to_config(scaling_factor=round(scale, 5))
    log(f"vae reconstruction mse {err:.4f} (pixels in [-1, 1]); scaling factor {scale:.4f}")
    return vae, latents * scale


def build_text_side(staging: Path, seed: int):
    import torch
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer
    from trainer_backend.families.sd.tiny import _text_encoder_config
    from trainer_backend.families.sd.tiny_tokenizer import write_tokenizer
    tokenizer = CLIPTokenizer.from_pretrained(str(write_tokenizer(staging / "tokenizer")))
    torch.manual_seed(seed)
    encoder = CLIPTextModel(CLIPTextConfig(**_text_encoder_config(32, tokenizer.pad_token_id, open_clip=False)))
    return tokenizer, encoder


def train_unet(latents, captions, tokenizer, text_encoder, steps: int, seed: int, unet=None):
    import torch
    from diffusers import DDPMScheduler, UNet2DConditionModel
    torch.manual_seed(seed)
    unet = unet if unet is not None else UNet2DConditionModel(**unet_config())
    noise_sched = DDPMScheduler(num_train_timesteps=1000, beta_start=0.00085, beta_end=0.012,
                                beta_schedule="scaled_linear")
    ids = tokenizer(captions + [""], padding="max_length", max_length=tokenizer.model_max_length,
                    truncation=True, return_tensors="pt").input_ids
    caption_ids, empty_ids = ids[:-1], ids[-1:]
    params = list(unet.parameters()) + list(text_encoder.parameters())
    opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 50) * max(0.1, 1 - s / max(steps, 1)))
    g = torch.Generator().manual_seed(seed)
    alphas = noise_sched.alphas_cumprod
    t0, running = time.time(), None
    unet.train()
    text_encoder.train()
    for step in range(1, steps + 1):
        pick = torch.randint(len(latents), (16,), generator=g)
        x0 = latents[pick]
        batch_ids = caption_ids[pick].clone()
        drop = torch.rand(len(pick), generator=g) < 0.1
        batch_ids[drop] = empty_ids
        noise = torch.randn(x0.shape, generator=g)
        t = torch.randint(0, 1000, (len(pick),), generator=g)
        noisy = noise_sched.add_noise(x0, noise, t)
        hidden = text_encoder(batch_ids).last_hidden_state
        pred = unet(noisy, t, hidden).sample
        # min-SNR-5 weighting: the many near-noise timesteps do not drown the detail ones
        snr = alphas[t] / (1 - alphas[t])
        weight = torch.clamp(snr, max=5.0) / snr
        loss = (weight * ((pred - noise) ** 2).mean(dim=(1, 2, 3))).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        running = loss.item() if running is None else 0.98 * running + 0.02 * loss.item()
        if step % 100 == 0 or step == steps:
            log(f"unet step {step}/{steps} loss {running:.4f} ({time.time() - t0:.0f} s)")
    return unet.eval(), text_encoder.eval()


def to_pixels(pil_images):
    import numpy as np
    import torch
    pixels = torch.from_numpy(np.stack([np.asarray(im, dtype=np.float32) for im in pil_images]))
    return pixels.permute(0, 3, 1, 2) / 127.5 - 1.0


def load_previous(folder: Path):
    """The autoencoder, UNet and text encoder of an earlier run of this script, in fp32, and its rounds."""
    import torch
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from transformers import CLIPTextModel
    vae = AutoencoderKL.from_pretrained(folder / "vae", torch_dtype=torch.float32).eval()
    unet = UNet2DConditionModel.from_pretrained(folder / "unet", torch_dtype=torch.float32)
    text_encoder = CLIPTextModel.from_pretrained(folder / "text_encoder", torch_dtype=torch.float32)
    info = json.loads((folder / "demo_model.json").read_text(encoding="utf-8"))
    history = info.get("rounds") or [{k: info[k] for k in ("vae_steps", "unet_steps", "seed", "seconds", "torch")}]
    log(f"continuing {folder} after {sum(r['unet_steps'] for r in history)} UNet steps")
    return vae, unet, text_encoder, history


def save(out: Path, vae, unet, text_encoder, staging: Path) -> None:
    import torch
    from diffusers import PNDMScheduler, StableDiffusionPipeline
    from transformers import CLIPTokenizer
    from trainer_backend.families.sd.tiny_tokenizer import write_tokenizer
    scheduler = PNDMScheduler(num_train_timesteps=1000, beta_start=0.00085, beta_end=0.012,
                              beta_schedule="scaled_linear", steps_offset=1, skip_prk_steps=True,
                              set_alpha_to_one=False)
    pipe = StableDiffusionPipeline(vae=vae, text_encoder=text_encoder,
                                   tokenizer=CLIPTokenizer.from_pretrained(str(staging / "tokenizer")),
                                   unet=unet, scheduler=scheduler, safety_checker=None, feature_extractor=None,
                                   requires_safety_checker=False)
    tmp = Path(tempfile.mkdtemp(prefix=".demo-model-", dir=out.parent))
    try:
        pipe.to(torch.float16).save_pretrained(tmp, safe_serialization=True)
        shutil.rmtree(tmp / "tokenizer")
        for config in tmp.glob("*/config.json"):   # a continued model would record where it was loaded from
            data = json.loads(config.read_text(encoding="utf-8"))
            if data.pop("_name_or_path", None) is not None:
                config.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        write_tokenizer(tmp / "tokenizer")       # the plain vocab/merges layout, like the tiny models
        (tmp / "README.md").write_text(
            "Demo base model of SD Training Studio, written by tools/make_demo_model.py (see its docstring).\n"
            "Draws circles, squares and triangles in eight colours (not pink) on four backgrounds at 64 px.\n",
            encoding="utf-8")
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=str(ROOT / "assets" / "demo_model"))
    p.add_argument("--vae-steps", type=int, default=600)
    p.add_argument("--unet-steps", type=int, default=700)
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: up to 2; 1 on a busy machine)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--continue-from", default="",
                   help="a folder this script wrote: go on from its weights (--vae-steps more on the "
                        "autoencoder's decoder, its encoder frozen; --unet-steps more on the UNet and "
                        "text encoder), so a busy CPU can train it in rounds")
    args = p.parse_args(argv)
    import torch
    torch.set_num_threads(args.threads or min(2, torch.get_num_threads()))
    start = time.time()
    images = _demo_images()
    pixels = to_pixels([im for im, _ in images])
    captions = [c for _, c in images]
    log(f"{len(images)} images, e.g. {captions[0]!r}")
    history = []
    with torch.random.fork_rng(devices=[]):
        staging = Path(tempfile.mkdtemp(prefix="demo-tok-"))
        try:
            tokenizer, text_encoder = build_text_side(staging, args.seed + 2)
            unet = None
            colour_pixels = to_pixels(colour_images(4 * len(images), args.seed + 3))
            if args.continue_from:
                vae, unet, text_encoder, history = load_previous(Path(args.continue_from))
                vae, latents = train_vae(pixels, colour_pixels, args.vae_steps, args.seed + 4, previous=vae)
            else:
                vae, latents = train_vae(pixels, colour_pixels, args.vae_steps, args.seed)
            # a continued round draws other batches than the first one did
            unet, text_encoder = train_unet(latents, captions, tokenizer, text_encoder, args.unet_steps,
                                            args.seed + 1 + len(history), unet=unet)
            out = Path(args.out)
            out.parent.mkdir(parents=True, exist_ok=True)
            save(out, vae, unet, text_encoder, staging)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    this_round = {"vae_steps": args.vae_steps, "unet_steps": args.unet_steps,
                  "seed": args.seed, "continued": bool(args.continue_from), "seconds": round(time.time() - start), "torch": torch.__version__}
    rounds = history + [this_round]
    info = {"unet_steps": sum(r["unet_steps"] for r in rounds), "vae_steps": sum(r["vae_steps"] for r in rounds),
            "seconds": sum(r["seconds"] for r in rounds), "rounds": rounds}
    (out / "demo_model.json").write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    log(f"wrote {out} in {info['seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
