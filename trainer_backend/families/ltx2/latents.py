"""LTX-2's latent arithmetic as LTX2Pipeline does it, on (B, C, F, h, w) video latents: the VAE's per-channel
normalisation, the packing into the transformer's token sequence (patch_size x patch_size x patch_size_t patches,
frame-major) and back, and the resolution-dependent sigma shift (mu linear in the packed token count)."""
from __future__ import annotations

import math


def normalize(latents, vae):
    """(latents - mean) * scaling_factor / std per channel (LTX2Pipeline._normalize_latents)."""
    mean = vae.latents_mean.view(1, -1, 1, 1, 1).to(latents.device, latents.dtype)
    std = vae.latents_std.view(1, -1, 1, 1, 1).to(latents.device, latents.dtype)
    return (latents - mean) * vae.config.scaling_factor / std


def denormalize(latents, vae):
    mean = vae.latents_mean.view(1, -1, 1, 1, 1).to(latents.device, latents.dtype)
    std = vae.latents_std.view(1, -1, 1, 1, 1).to(latents.device, latents.dtype)
    return latents * std / vae.config.scaling_factor + mean


def pack(latents, p: int = 1, pt: int = 1):
    """(B, C, F, H, W) -> (B, F/pt * H/p * W/p, C * pt * p * p) tokens."""
    b, c, f, h, w = latents.shape
    x = latents.reshape(b, c, f // pt, pt, h // p, p, w // p, p)
    return x.permute(0, 2, 4, 6, 1, 3, 5, 7).flatten(4, 7).flatten(1, 3)


def unpack(tokens, frames: int, height: int, width: int, p: int = 1, pt: int = 1):
    """The inverse of pack: frames/height/width are the patched grid's (F/pt, H/p, W/p)."""
    b = tokens.size(0)
    x = tokens.reshape(b, frames, height, width, -1, pt, p, p)
    return x.permute(0, 4, 1, 5, 2, 6, 3, 7).flatten(6, 7).flatten(4, 5).flatten(2, 3)


def token_count(latent_shape: tuple[int, ...], p: int = 1, pt: int = 1) -> int:
    """Video tokens of one (C, F, h, w) latent: the sequence length LTX2Pipeline computes mu from."""
    _, f, h, w = latent_shape
    return (f // pt) * (h // p) * (w // p)


def sigma_shift(tokens: int, scheduler_config: dict) -> float:
    """exp(mu) of LTX2Pipeline's calculate_shift for `tokens` video tokens (the scheduler's exponential time
    shift then maps sigma to shift*sigma / (1 + (shift - 1)*sigma)); 1 (no shift) when the scheduler does not
    shift dynamically, where its static `shift` applies instead."""
    c = scheduler_config
    if not c.get("use_dynamic_shifting"):
        return float(c.get("shift", 1.0) or 1.0)
    base_len, max_len = c.get("base_image_seq_len", 1024), c.get("max_image_seq_len", 4096)
    base_shift, max_shift = c.get("base_shift", 0.95), c.get("max_shift", 2.05)
    m = (max_shift - base_shift) / (max_len - base_len)
    return math.exp(tokens * m + base_shift - m * base_len)
