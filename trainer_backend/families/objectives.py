"""Training objectives a family can choose: what noise and timesteps a sample gets, what the
denoiser sees, what it must predict, and how each sample's loss is weighted.

Per-sample randomness (noise, timestep, noise offset, VAE sampling) comes from a generator
seeded by (seed, epoch, dataset index): a sample gets the same draws whether it is trained in a
batch of 4, in 4 accumulated batches of 1, or on another rank. That is what makes accumulation
and multi-GPU runs equal to single-GPU ones, and resume exact. Every objective keeps that rule.
"""
from __future__ import annotations

import math

import torch


def sample_generator(seed: int, epoch: int, index: int) -> torch.Generator:
    return torch.Generator().manual_seed((seed * 1_000_003 + epoch * 7_919 + index) % (2**63))


def encode_with_vae(vae, pixels: torch.Tensor, eps: torch.Tensor | None, scaling: float, shift: float = 0.0):
    """VAE posterior sample with our own per-sample eps (or its mean when eps is None)."""
    dist = vae.encode(pixels.to(vae.dtype)).latent_dist
    latents = dist.mean if eps is None else dist.mean + dist.std * eps.to(dist.mean)
    return (latents.float() - shift) * scaling


class Objective:
    """The contract: `draw` the per-sample randomness, then `noisy`, `target` and `weights`."""

    def draw(self, indices: list[int], seed: int, epoch: int, latent_shape: tuple[int, ...], loss) -> tuple:
        """(noise [B,...], timesteps [B], vae_eps [B,...]); `loss` is the config's [loss] section.
        Each sample draws, from its own generator and in this order: noise, the noise offset (when
        on), its timestep (`timestep`), the VAE posterior's noise."""
        noises, steps, eps = [], [], []
        for index in indices:
            g = sample_generator(seed, epoch, index)
            noise = torch.randn(latent_shape, generator=g)
            if loss.noise_offset:
                # one offset per channel, over every frame and pixel (video latents are (C, F, h, w))
                offset_shape = (latent_shape[0],) + (1,) * (len(latent_shape) - 1)
                noise = noise + loss.noise_offset * torch.randn(offset_shape, generator=g)
            noises.append(noise)
            steps.append(self.timestep(g, latent_shape, loss))
            eps.append(torch.randn(latent_shape, generator=g))
        return torch.stack(noises), torch.cat(steps), torch.stack(eps)

    def timestep(self, generator: torch.Generator, latent_shape: tuple[int, ...], loss) -> torch.Tensor:
        """One sample's timestep, shape (1,)."""
        raise NotImplementedError

    def noisy(self, latents: torch.Tensor, noise: torch.Tensor, timesteps: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def target(self, latents: torch.Tensor, noise: torch.Tensor, timesteps: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def weights(self, timesteps: torch.Tensor, loss) -> torch.Tensor | None:
        """Per-sample loss weights, or None for equal weights."""
        return None


class DDPMObjective(Objective):
    """Discrete-time DDPM noise (SD1, SD2, SDXL): epsilon or v-prediction, min-SNR-γ weighting."""

    def __init__(self, scheduler, prediction_type: str):
        self.scheduler, self.prediction_type = scheduler, prediction_type

    def timestep(self, generator, latent_shape, loss):
        return torch.randint(loss.timestep_min, loss.timestep_max, (1,), generator=generator)

    def noisy(self, latents, noise, timesteps):
        return self.scheduler.add_noise(latents, noise, timesteps)

    def target(self, latents, noise, timesteps):
        if self.prediction_type == "v_prediction":
            return self.scheduler.get_velocity(latents, noise, timesteps)
        return noise

    def weights(self, timesteps, loss):
        if loss.min_snr_gamma <= 0:
            return None
        return snr_weights(self.scheduler, timesteps, loss.min_snr_gamma, self.prediction_type)


def snr_weights(scheduler, timesteps: torch.Tensor, gamma: float, prediction_type: str) -> torch.Tensor:
    """Min-SNR-γ loss weights (Hang et al. 2023)."""
    alphas = scheduler.alphas_cumprod.to(timesteps.device)[timesteps].float()
    snr = alphas / (1 - alphas)
    clipped = torch.clamp(snr, max=gamma)
    return clipped / (snr + 1) if prediction_type == "v_prediction" else clipped / snr


# ----------------------------------------------------------------------------- flow matching

def sample_u(scheme: str, generator: torch.Generator, *, logit_mean: float = 0.0, logit_std: float = 1.0,
             mode_scale: float = 1.29) -> torch.Tensor:
    """One draw in (0, 1) from the timestep density `scheme` (SD3 paper §3.1; the schemes diffusers'
    training_utils and kohya's flux trainer offer): uniform, logit_normal, sigmoid (= logit-normal
    with mean 0, std 1), mode."""
    if scheme in ("logit_normal", "sigmoid"):
        mean, std = (logit_mean, logit_std) if scheme == "logit_normal" else (0.0, 1.0)
        return torch.sigmoid(torch.normal(mean=mean, std=std, size=(1,), generator=generator))
    u = torch.rand((1,), generator=generator)
    if scheme == "mode":
        return 1 - u - mode_scale * (torch.cos(math.pi * u / 2) ** 2 - 1 + u)
    return u


def shift_sigma(sigma: torch.Tensor, shift: float) -> torch.Tensor:
    """The timestep shift of SD3/Flux schedulers: more steps at high noise for shift > 1."""
    return shift * sigma / (1 + (shift - 1) * sigma)


def resolution_shift(image_seq_len: int, base_seq_len: int = 256, max_seq_len: int = 4096,
                     base_shift: float = 0.5, max_shift: float = 1.15) -> float:
    """Flux's resolution-dependent shift exp(mu), mu linear in the packed latent's token count."""
    m = (max_shift - base_shift) / (max_seq_len - base_seq_len)
    return math.exp(image_seq_len * m + base_shift - m * base_seq_len)


def flow_loss_weights(scheme: str, sigmas: torch.Tensor) -> torch.Tensor | None:
    """Per-sample loss weights of the SD3 paper: none, sigma_sqrt (σ⁻²) or cosmap."""
    if scheme == "sigma_sqrt":
        return sigmas.float() ** -2.0
    if scheme == "cosmap":
        return 2 / (math.pi * (1 - 2 * sigmas.float() + 2 * sigmas.float() ** 2))
    return None


class FlowMatchObjective(Objective):
    """Rectified flow (SD3, Flux): x_σ = (1 − σ)·x + σ·ε, the denoiser predicts ε − x.

    Timesteps are σ·1000 (floats), as diffusers' flow-matching schedulers count them. σ comes from
    loss.timestep_sampling, then the shift: loss.flow_shift when > 0, else the family's own
    (`shift`, or Flux's resolution-dependent one when `resolution_shift` is set), then is mapped
    into [loss.timestep_min, loss.timestep_max) / 1000 (the whole range by default)."""

    def __init__(self, shift: float = 1.0, dynamic_shift: dict | None = None):
        self.shift, self.dynamic_shift = shift, dynamic_shift

    def _shift(self, latent_shape: tuple[int, ...], loss) -> float:
        if loss.flow_shift > 0:
            return loss.flow_shift
        if self.dynamic_shift is not None:  # Flux: tokens of the 2x2-packed latent
            return resolution_shift((latent_shape[-2] // 2) * (latent_shape[-1] // 2), **self.dynamic_shift)
        return self.shift

    def timestep(self, generator, latent_shape, loss):
        lo, hi = loss.timestep_min / 1000, loss.timestep_max / 1000
        u = sample_u(loss.timestep_sampling, generator, logit_mean=loss.logit_mean, logit_std=loss.logit_std,
                     mode_scale=loss.mode_scale)
        return (lo + shift_sigma(u, self._shift(latent_shape, loss)) * (hi - lo)) * 1000

    @staticmethod
    def _sigmas(timesteps: torch.Tensor, ndim: int) -> torch.Tensor:
        return (timesteps.float() / 1000).reshape(-1, *([1] * (ndim - 1)))

    def noisy(self, latents, noise, timesteps):
        sigmas = self._sigmas(timesteps, latents.ndim).to(latents)
        return (1 - sigmas) * latents + sigmas * noise

    def target(self, latents, noise, timesteps):
        return noise - latents

    def weights(self, timesteps, loss):
        return flow_loss_weights(loss.flow_weighting, timesteps.float() / 1000)
