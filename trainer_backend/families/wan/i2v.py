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


def ti2v_mix(noisy, clean, timesteps, given=None):
    """TI2V-5B's image-to-video input, as WanImageToVideoPipeline with expand_timesteps builds it: the first
    latent frame is the clean image's, and its tokens' timestep is 0 (the rest keep the sample's timestep).
    noisy (B, C, F', h, w); clean (B, C, F' or 1, h, w): its first frame is used; timesteps (B,); given (B,)
    bool: the samples that get their image (None: all) -> (latents, per-token timesteps (B, F' * h/2 * w/2),
    the transformer's 1x2x2 patches)."""
    import torch
    b, _, f, h, w = noisy.shape
    given = torch.ones(b, dtype=torch.bool, device=noisy.device) if given is None else given.to(noisy.device)
    # (no indexing by `given`: the memory probe runs this on the meta device)
    first = given.view(b, 1) & (torch.arange(f, device=noisy.device) == 0).view(1, f)    # (B, F')
    latents = torch.where(first.view(b, 1, f, 1, 1), clean[:, :, :1].to(noisy), noisy)
    per_token = torch.where(first.view(b, f, 1, 1), torch.zeros_like(timesteps).view(b, 1, 1, 1),
                            timesteps.view(b, 1, 1, 1))
    return latents, per_token.expand(b, f, h // 2, w // 2).reshape(b, -1)


START_IMAGE_STREAM = 0x7112   # the draws' own seed offset: the objective's per-sample draws stay as they are


def start_image_draws(seed: int, epoch: int, indices) -> "torch.Tensor":
    """One uniform draw in [0, 1) per sample (dataset.video_start_image_probability: the sample trains
    image-to-video when its draw is below it), from a generator of its own per (seed, epoch, sample index),
    as families/objectives.py's per-sample rule: the same choice in any batch, on any process, after resume."""
    import torch
    from ..objectives import sample_generator
    return torch.cat([torch.rand(1, generator=sample_generator(seed + START_IMAGE_STREAM, epoch, int(i)))
                      for i in indices])
