"""The diffusion training objective for one batch.

Per-sample randomness (noise, timestep, noise offset, VAE sampling) comes from a generator
seeded by (seed, epoch, dataset index): a sample gets the same noise whether it is trained
in a batch of 4, in 4 accumulated batches of 1, or on another rank. That is what makes
accumulation and multi-GPU runs equal to single-GPU ones, and resume exact.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..families.sd.text import encode_text, sdxl_add_time_ids, tokenize


def sample_generator(seed: int, epoch: int, index: int) -> torch.Generator:
    return torch.Generator().manual_seed((seed * 1_000_003 + epoch * 7_919 + index) % (2**63))


def per_sample_noise(indices: list[int], seed: int, epoch: int, latent_shape: tuple[int, ...], t_min: int,
                     t_max: int, noise_offset: float):
    """(noise [B,...], timesteps [B], vae_eps [B,...]) from per-sample generators."""
    noises, steps, eps = [], [], []
    for index in indices:
        g = sample_generator(seed, epoch, index)
        noise = torch.randn(latent_shape, generator=g)
        if noise_offset:
            noise = noise + noise_offset * torch.randn((latent_shape[0], 1, 1), generator=g)
        noises.append(noise)
        steps.append(torch.randint(t_min, t_max, (1,), generator=g))
        eps.append(torch.randn(latent_shape, generator=g))
    return torch.stack(noises), torch.cat(steps), torch.stack(eps)


def encode_latents(vae, pixels: torch.Tensor, eps: torch.Tensor | None, scaling: float, shift: float = 0.0):
    """VAE posterior sample with our own per-sample eps (or its mean when eps is None)."""
    dist = vae.encode(pixels.to(vae.dtype)).latent_dist
    latents = dist.mean if eps is None else dist.mean + dist.std * eps.to(dist.mean)
    return (latents.float() - shift) * scaling


def snr_weights(scheduler, timesteps: torch.Tensor, gamma: float, prediction_type: str) -> torch.Tensor:
    """Min-SNR-γ loss weights (Hang et al. 2023)."""
    alphas = scheduler.alphas_cumprod.to(timesteps.device)[timesteps].float()
    snr = alphas / (1 - alphas)
    clipped = torch.clamp(snr, max=gamma)
    return clipped / (snr + 1) if prediction_type == "v_prediction" else clipped / snr


def diffusion_loss(model, unet, batch: dict, *, cfg, epoch: int, device, weight_dtype,
                   text_encoders: list | None = None, parts: "LossParts | None" = None) -> torch.Tensor:
    """Mean loss over the batch: noise the latents, predict, compare with the target.
    Class (prior-preservation) samples are weighted by dataset.prior_loss_weight; `parts`, when
    given, collects the instance and class (prior) losses separately for the step event."""
    indices = batch["index"].tolist()
    if "latents" in batch:
        latents = batch["latents"].to(device, torch.float32)
        shape = tuple(latents.shape[1:])
        noise, timesteps, _ = per_sample_noise(indices, cfg.schedule.seed, epoch, shape, cfg.loss.timestep_min,
                                               cfg.loss.timestep_max, cfg.loss.noise_offset)
    else:
        pixels = batch["pixel_values"].to(device)
        f = model.vae_scale_factor
        shape = (model.vae.config.latent_channels, pixels.shape[-2] // f, pixels.shape[-1] // f)
        noise, timesteps, eps = per_sample_noise(indices, cfg.schedule.seed, epoch, shape, cfg.loss.timestep_min,
                                                 cfg.loss.timestep_max, cfg.loss.noise_offset)
        with torch.no_grad():
            latents = encode_latents(model.vae, pixels, eps.to(device), model.vae.config.scaling_factor,
                                     getattr(model.vae.config, "shift_factor", None) or 0.0)
    noise, timesteps = noise.to(device), timesteps.to(device)
    scheduler = model.noise_scheduler
    noisy = scheduler.add_noise(latents, noise, timesteps)

    if "text" in batch:  # cached text-encoder outputs (frozen encoders, static captions)
        hidden, pooled = batch["text"]["hidden"].to(device), batch["text"].get("pooled")
    else:
        input_ids = [ids.to(device) for ids in tokenize(model, list(batch["caption"]),
                                                         cfg.dataset.max_token_length)]
        hidden, pooled = encode_text(model, input_ids, text_encoders)
    added = None
    if model.arch == "sdxl":
        time_ids = torch.stack([sdxl_add_time_ids(tuple(o), tuple(c), tuple(t)) for o, c, t in zip(
            batch["original_size"].tolist(), batch["crop_top_left"].tolist(), batch["target_size"].tolist())])
        added = {"text_embeds": pooled.to(device), "time_ids": time_ids.to(device, hidden.dtype)}

    pred = unet(noisy.to(weight_dtype), timesteps, hidden.to(weight_dtype), added_cond_kwargs=added).sample
    if model.prediction_type == "v_prediction":
        target = scheduler.get_velocity(latents, noise, timesteps)
    else:
        target = noise
    per_sample = F.mse_loss(pred.float(), target.float(), reduction="none").mean(dim=(1, 2, 3))
    if cfg.loss.min_snr_gamma > 0:
        per_sample = per_sample * snr_weights(scheduler, timesteps, cfg.loss.min_snr_gamma, model.prediction_type)
    if parts is not None and "is_class" in batch:
        parts.add(per_sample.detach(), batch["is_class"])
    if "is_class" in batch and cfg.dataset.prior_loss_weight != 1.0:
        weights = torch.where(batch["is_class"].to(device), cfg.dataset.prior_loss_weight, 1.0)
        per_sample = per_sample * weights
    return per_sample.mean()


class LossParts:
    """Per-sample losses of one optimizer step, summed by kind: instance samples and class
    (prior-preservation) samples, the latter before dataset.prior_loss_weight. `reduce` averages
    each over all processes: {"loss_instance": ..., "loss_prior": ...} (a part with no sample this
    step is left out). Disabled (reduce returns {}) when the run has no class samples."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.totals = torch.zeros(4, dtype=torch.float64)  # instance sum, count, class sum, count

    def add(self, per_sample: torch.Tensor, is_class: torch.Tensor) -> None:
        if not self.enabled:
            return
        losses, is_class = per_sample.detach().double().cpu(), is_class.cpu().bool()
        self.totals += torch.stack([losses[~is_class].sum(), (~is_class).sum().double(),
                                    losses[is_class].sum(), is_class.sum().double()])

    def reduce(self, accelerator) -> dict[str, float]:
        if not self.enabled:
            return {}
        totals = self.totals
        if accelerator.num_processes > 1:
            totals = accelerator.reduce(totals.to(accelerator.device), reduction="sum").cpu()
        out = {}
        for name, (total, count) in (("loss_instance", totals[:2]), ("loss_prior", totals[2:])):
            if count > 0:
                out[name] = float(total / count)
        return out
