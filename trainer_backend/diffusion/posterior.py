"""Cached latents that keep the VAE's sampling: the cache stores, per image, the posterior mean and its
standard deviation in the space the denoiser trains in, and every step draws mean + std · eps with the
sample's own eps (families/objectives.py's per-sample generator, the same draw an uncached step feeds the
VAE), so training on cached latents is training on the VAE's posterior samples, as without the cache.

How, for any family: its `encode_latents` runs once with the real VAE (the encoder runs once), while a
stand-in records the posterior the VAE returned; then it runs again on a stand-in VAE whose posterior has
mean 0 and the recorded std, with eps = 1 and eps = None. Every family maps the posterior sample
mean + std · eps to its latents by scaling, shifting and rearranging elements (affine, element by
element), so T(std) - T(0) is the std in the trained space, exactly, in fp32. A family whose latents
ignore eps (the posterior mean alone) gives std 0, and its cache stores none; one that never calls
`vae.encode(...).latent_dist` keeps the mean alone.
"""
from __future__ import annotations

import torch


class _Posterior:
    """What `vae.encode(x).latent_dist` gives, for the parts a family reads (mean, std, mode, sample)."""

    def __init__(self, mean: torch.Tensor, std: torch.Tensor):
        self.mean, self.std = mean, std
        self.var = std * std
        self.logvar = torch.log(self.var.clamp_min(1e-30))

    def mode(self) -> torch.Tensor:
        return self.mean

    def sample(self, generator=None) -> torch.Tensor:
        return self.mean + self.std * torch.randn(self.mean.shape, generator=generator, dtype=self.mean.dtype)


class _Encoded:
    def __init__(self, dist):
        self.latent_dist = dist


class _StandInVAE:
    """The model's VAE with `encode` replaced: everything else (config, dtype, batch-norm statistics) is
    the real one's."""

    def __init__(self, vae, encode):
        self._vae, self.encode = vae, encode

    def __getattr__(self, name):
        return getattr(self._vae, name)


def _with_vae(model, stand_in, fn):
    real = model.vae
    model.vae = stand_in
    try:
        return fn()
    finally:
        model.vae = real


def encode_posterior(model, pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(the posterior mean's latents, their std) for a batch of pixels, as `family.encode_latents` lays
    them out; std None where the family's latents do not depend on the VAE's sampling."""
    family, recorded = model.family, []

    def recording(x, *args, **kwargs):
        out = real_vae.encode(x, *args, **kwargs)
        recorded.append(getattr(out, "latent_dist", None))
        return out

    real_vae = model.vae
    mean = _with_vae(model, _StandInVAE(real_vae, recording), lambda: family.encode_latents(model, pixels, None))
    dist = recorded[0] if len(recorded) == 1 else None
    if dist is None or not hasattr(dist, "std"):
        return mean, None
    std = dist.std.detach().float()
    zero = _Posterior(torch.zeros_like(std), std)
    unit = torch.ones(mean.shape, dtype=torch.float32, device=std.device)
    try:
        spread = _with_vae(model, _StandInVAE(real_vae, lambda *a, **k: _Encoded(zero)),
                           lambda: family.encode_latents(model, pixels, unit).float()
                           - family.encode_latents(model, pixels, None).float())
    except (RuntimeError, ValueError):  # eps laid out unlike the latents: keep the mean alone
        return mean, None
    if spread.shape != mean.shape or not torch.any(spread != 0):
        return mean, None
    return mean, spread


def draw_latents(mean: torch.Tensor, std: torch.Tensor, eps: torch.Tensor) -> torch.Tensor:
    """One step's posterior sample in the trained space: the cached mean plus the cached std times the
    sample's own eps (the draw an uncached step would give the VAE)."""
    return mean + std * eps.to(device=mean.device, dtype=mean.dtype)
