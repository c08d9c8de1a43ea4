"""Wan image-to-video conditioning from a clip's first frame, as the I2V pipeline builds it at sampling
(diffusers' WanImageToVideoPipeline.prepare_latents), so training sees what sampling will give:

- I2V-A14B: the first frame followed by black (zero) frames is encoded by the VAE and normalised; a mask
  marks the first frame (4 mask channels per latent frame: the VAE's temporal compression); the
  transformer's input is noisy latents ++ mask ++ condition on the channels (16 + 4 + 16 = 36).
- TI2V-5B (expand_timesteps): the first latent frame is the clean image latent and its tokens get
  timestep 0; the rest is noised as usual (`ti2v_mix`).
"""
from __future__ import annotations


def _normalise(vae, latents):
    import torch
    shape = (1, vae.config.z_dim, 1, 1, 1)
    mean = torch.tensor(vae.config.latents_mean, dtype=latents.dtype, device=latents.device).view(shape)
    std = torch.tensor(vae.config.latents_std, dtype=latents.dtype, device=latents.device).view(shape)
    return (latents - mean) / std


def first_frame_condition(vae, first_frame, num_frames: int, temporal: int = 4):
    """first_frame (B, 3, H, W) in [-1, 1] -> the I2V condition (B, temporal + z_dim, F', H/8, W/8),
    F' = (num_frames - 1) // temporal + 1."""
    import torch
    b, _, h, w = first_frame.shape
    video = torch.cat([first_frame.unsqueeze(2), first_frame.new_zeros(b, 3, num_frames - 1, h, w)], dim=2)
    latents = _normalise(vae, vae.encode(video.to(vae.dtype)).latent_dist.mode().float())
    _, _, frames, lh, lw = latents.shape
    mask = torch.zeros(b, temporal, frames, lh, lw, dtype=latents.dtype, device=latents.device)
    mask[:, :, 0] = 1.0  # the first latent frame holds the given image (all `temporal` mask channels)
    return torch.cat([mask, latents], dim=1)


def i2v_input(noisy, condition):
    """The I2V transformer's input: noisy latents ++ mask ++ condition on the channels."""
    import torch
    return torch.cat([noisy, condition.to(noisy)], dim=1)


def ti2v_mix(noisy, clean, timesteps):
    """TI2V-5B: the first latent frame is the clean image's, and its tokens' timestep is 0.
    noisy/clean (B, C, F', h, w); timesteps (B,) -> (latents, per-token timesteps (B, F' * h/2 * w/2))."""
    latents = noisy.clone()
    latents[:, :, 0] = clean[:, :, 0]
    b, _, f, h, w = noisy.shape
    per_token = timesteps.view(b, 1, 1, 1).expand(b, f, h // 2, w // 2).clone()
    per_token[:, 0] = 0
    return latents, per_token.reshape(b, -1)
