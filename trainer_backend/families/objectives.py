"""Training objectives a family can choose: what noise and timesteps a sample gets, what the
denoiser sees, what it must predict, and how each sample's loss is weighted.

Per-sample randomness (noise, timestep, noise offset, VAE sampling) comes from a generator
seeded by (seed, epoch, dataset index): a sample gets the same draws whether it is trained in a
batch of 4, in 4 accumulated batches of 1, or on another rank. That is what makes accumulation
and multi-GPU runs equal to single-GPU ones, and resume exact. Every objective keeps that rule.
"""
from __future__ import annotations

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
        """(noise [B,...], timesteps [B], vae_eps [B,...]); `loss` is the config's [loss] section."""
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

    def draw(self, indices, seed, epoch, latent_shape, loss):
        noises, steps, eps = [], [], []
        for index in indices:
            g = sample_generator(seed, epoch, index)
            noise = torch.randn(latent_shape, generator=g)
            if loss.noise_offset:
                noise = noise + loss.noise_offset * torch.randn((latent_shape[0], 1, 1), generator=g)
            noises.append(noise)
            steps.append(torch.randint(loss.timestep_min, loss.timestep_max, (1,), generator=g))
            eps.append(torch.randn(latent_shape, generator=g))
        return torch.stack(noises), torch.cat(steps), torch.stack(eps)

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
