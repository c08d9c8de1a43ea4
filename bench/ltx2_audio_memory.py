"""What a clip's audio track adds to an LTX-2 training step's memory, on the full-size model on the meta device
(the memory planner's own tally, trainer_backend/training/memory_probe.py; no GPU, no weights): one LoRA step
at 640 px x 121 frames (16 latent frames of 20x20) with the audio stream isolated on one token (the planner's
table) and with the clip's 126 audio tokens (5.04 s at 25 tokens per second), with and without gradient
checkpointing. The planner plans the first; docs/video.md quotes the difference.

    python bench/ltx2_audio_memory.py      # a few minutes on a CPU
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

VIDEO_TARGETS = ["attn1.to_q", "attn1.to_k", "attn1.to_v", "attn1.to_out.0", "attn2.to_q", "attn2.to_k",
                 "attn2.to_v", "attn2.to_out.0", "ff.net.0.proj", "ff.net.2"]
SIDE, LATENT_FRAMES, AUDIO_TOKENS = 640, 16, 126


def step_peak(load, cfg, gc: bool, audio_tokens: int) -> float:
    """GiB: the peak of one forward and backward (gradients included), as the planner's probe tallies it."""
    import torch
    from trainer_backend.diffusion.loss import diffusion_loss
    from trainer_backend.methods import setup_method
    from trainer_backend.training import memory_probe as mp
    from trainer_backend.training.setup import place_model
    dev = torch.device("meta")
    model = load()
    for module in model.components().values():
        module.to(dev)
    dtype = place_model(model, cfg, mp._Device(dev))
    setup_method(model, cfg)
    if gc:
        model.denoiser.enable_gradient_checkpointing()
    sample = mp._sample(model, (SIDE, SIDE), 1, dev)
    channels = sample["latents"].shape[1]
    sample["latents"] = torch.zeros(1, channels, LATENT_FRAMES, SIDE // 32, SIDE // 32, device=dev)
    if audio_tokens:
        width = model.denoiser.config.audio_in_channels
        sample["audio_latents"] = torch.zeros(1, audio_tokens, width, device=dev)
    with mp.MetaAutocast(dtype), mp.LiveBytes() as tally:
        diffusion_loss(model, model.denoiser, sample, cfg=cfg, epoch=0, device=dev, weight_dtype=dtype).backward()
    return tally.peak / 2 ** 30


def main() -> None:
    import make_memory_tables as tables
    from trainer_backend.config import from_dict
    from trainer_backend.training.meta_values import AllValid
    _, load = tables._full_size("ltx2")
    for name, targets in (("video-stream targets", VIDEO_TARGETS), ("the schema's default targets", None)):
        network = {"type": "lora", "rank": 16, **({"target_modules": targets} if targets else {})}
        cfg = from_dict({"model": {"arch": "ltx2"}, "network": network, "precision": {"mixed": "bf16"},
                         "dataset": {"video_fps": 24}})
        for gc in (True, False):
            with AllValid():
                alone, both = (step_peak(load, cfg, gc, n) for n in (0, AUDIO_TOKENS))
            print(f"{name}, gradient checkpointing {'on' if gc else 'off'}: video only {alone:.2f} GiB, "
                  f"with {AUDIO_TOKENS} audio tokens {both:.2f} GiB (+{both - alone:.2f} GiB, x{both / alone:.2f})",
                  flush=True)


if __name__ == "__main__":
    main()
