"""The diffusion training loss for one batch, for any family: the family's latents, text
conditioning and forward call under its objective (families/objectives.py, where the
per-sample randomness rule lives). A batch of clips that train their audio track (a family with an audio
stream: LTX-2) adds the audio term: the audio latents noised at the sample's timestep with their own
noise, both streams predicted in one call, loss = video + loss.audio_loss_weight x audio."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..compute.devices import to_device
from .posterior import draw_latents


def diffusion_loss(model, denoiser, batch: dict, *, cfg, epoch: int, device, weight_dtype,
                   text_encoders: list | None = None, parts: "LossParts | None" = None) -> torch.Tensor:
    """Mean loss over the batch: noise the latents, predict, compare with the target; the family
    (model.family) supplies the latents, text conditioning, objective and forward call.
    Class (prior-preservation) samples are weighted by dataset.prior_loss_weight; `parts`, when
    given, collects the instance and class (prior) losses separately for the step event."""
    family = model.family
    objective = family.objective(model)
    indices = [int(i) for i in batch["index"]]  # plain ints from the loader (a tensor from older callers)
    seed = cfg.schedule.seed
    if "latents" in batch:
        latents = to_device(batch["latents"], device).float()
        noise, timesteps, eps = objective.draw(indices, seed, epoch, tuple(latents.shape[1:]), cfg.loss)
        if "latents_std" in batch:  # the cached posterior: this step's sample, with the eps uncached would use
            latents = draw_latents(latents, to_device(batch["latents_std"], device).float(), to_device(eps, device))
    else:
        pixels = to_device(batch["pixel_values"], device)
        # clips (B, 3, F, H, W) of a video family (Family.frame_step): its latent_shape takes the frames too
        frames = {"frames": pixels.shape[2]} if pixels.ndim == 5 else {}
        shape = family.latent_shape(model, pixels.shape[-2], pixels.shape[-1], **frames)
        noise, timesteps, eps = objective.draw(indices, seed, epoch, shape, cfg.loss)
        with torch.no_grad():
            latents = family.encode_latents(model, pixels, to_device(eps, device))
    noise, timesteps = to_device(noise, device), to_device(timesteps, device)
    noisy = objective.noisy(latents, noise, timesteps)
    given = family.given_frames(model, batch, tuple(noisy.shape), seed=seed, epoch=epoch, cfg=cfg)
    if given is not None:  # image-to-video: latent frames the denoiser is given clean (Family.given_frames)
        given = given.to(noisy.device)
        batch = {**batch, "given_frames": given}
    if "control_pixel_values" in batch and "control_latents" not in batch:
        batch = {**batch, "control_latents": control_latents(model, batch["control_pixel_values"], device)}

    if "text" in batch:  # cached text-encoder outputs (frozen encoders, static captions)
        text = {k: to_device(v, device) for k, v in batch["text"].items()}
    else:
        input_ids = [to_device(ids, device) for ids in family.tokenize_batch(model, batch, cfg.dataset.max_token_length)]
        text = family.encode_text(model, input_ids, text_encoders)

    audio = audio_latents(model, batch, device)
    if audio is not None:
        draws = audio_draws(objective, indices, seed, epoch, tuple(audio.shape[1:]), cfg.loss, timesteps)
        audio_noise, audio_t = (to_device(t, device) for t in draws)
        noisy_audio = objective.noisy(audio, audio_noise, audio_t)
        pred, audio_pred = family.predict_audio_video(model, denoiser, noisy, noisy_audio, timesteps, text, batch,
                                                      weight_dtype, cfg=cfg, audio_timesteps=audio_t)
    else:
        pred = family.predict(model, denoiser, noisy, timesteps, text, batch, weight_dtype, cfg=cfg)
    target = objective.target(latents, noise, timesteps)
    per_sample = weighted(per_sample_loss(pred, target, batch.get("mask"), given=given), objective, timesteps, cfg.loss)
    if audio is not None:
        audio_loss = per_sample_loss(audio_pred, objective.target(audio, audio_noise, audio_t))
        if parts is not None:
            parts.add_audio(audio_loss.detach())
        per_sample = per_sample + cfg.loss.audio_loss_weight * weighted(audio_loss, objective, audio_t, cfg.loss)
    if parts is not None and "is_class" in batch:
        parts.add(per_sample.detach(), batch["is_class"])
    if "is_class" in batch and cfg.dataset.prior_loss_weight != 1.0:
        weights = torch.where(to_device(batch["is_class"], device), cfg.dataset.prior_loss_weight, 1.0)
        per_sample = per_sample * weights
    return per_sample.mean()


def audio_latents(model, batch: dict, device) -> torch.Tensor | None:
    """The batch's audio latents (B, L, D): cached, or encoded from its waveforms; None when it trains no audio."""
    if "audio_latents" in batch:
        return to_device(batch["audio_latents"], device).float()
    if "audio_waveform" in batch:
        with torch.no_grad():
            return model.family.encode_audio(model, to_device(batch["audio_waveform"], device)).float()
    return None


def audio_draws(objective, indices: list[int], seed: int, epoch: int, shape: tuple[int, ...], loss,
                timesteps: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(noise, timesteps) of each sample's audio, from its own generator (seeded apart from the video's draws,
    so the two streams' noises are independent), as families/objectives.py draws per sample: batch-size
    independent. loss.audio_timestep "shared": the video's `timesteps`; "independent": the audio's own draw
    (the objective's sampling and shift for the audio's shape)."""
    from ..families.objectives import sample_generator
    noises, steps = [], []
    for index in indices:
        g = sample_generator(seed, epoch, index)
        g.manual_seed(g.initial_seed() ^ _AUDIO_STREAM)
        noises.append(torch.randn(shape, generator=g))
        if loss.audio_timestep == "independent":
            steps.append(objective.timestep(g, shape, loss))
    return torch.stack(noises), (torch.cat(steps) if steps else timesteps)


def weighted(per_sample: torch.Tensor, objective, timesteps: torch.Tensor, loss) -> torch.Tensor:
    """Per-sample losses times the objective's weights at their timesteps (loss.flow_weighting, min-SNR)."""
    weights = objective.weights(timesteps, loss)
    return per_sample if weights is None else per_sample * weights


_AUDIO_STREAM = 0x5EED_A0D1_0000  # xor'ed into a sample's seed for its audio noise


def per_sample_loss(pred: torch.Tensor, target: torch.Tensor, mask: torch.Tensor | None = None,
                    given: torch.Tensor | None = None) -> torch.Tensor:
    """Mean squared error per sample. loss.masked: each latent pixel weighted by the mask (area-resized
    to the latent grid), divided by the mask's mean, so a sample's loss is the mean over what it trains
    on and keeps its scale (a mask of zeros gives 0). `given` (B, F') bool: latent frames of 5D latents
    given clean to the denoiser, left out the same way (Family.given_frames)."""
    dims = tuple(range(1, pred.ndim))
    error = F.mse_loss(pred.float(), target.float(), reduction="none")
    if mask is None and given is None:
        return error.mean(dim=dims)
    from ..data.masks import to_grid
    weights = None if mask is None else to_grid(mask.to(error.device), tuple(error.shape[-2:]))
    if given is not None:  # 0 on the given latent frames of (B, C, F', h, w)
        frames = (~given.to(error.device)).to(error.dtype)[:, None, :, None, None]
        weights = frames if weights is None else frames * weights.unsqueeze(2)
    covered = weights.mean(dim=dims)
    return (error * weights).mean(dim=dims) / torch.where(covered > 0, covered, torch.ones_like(covered))


def control_latents(model, pixels: torch.Tensor, device) -> torch.Tensor:
    """Paired control images -> the latents `family.predict` reads as batch["control_latents"]: the
    posterior mean (eps=None), since a conditioning image needs no sampling noise; as the latent cache
    stores them. Several references per sample ([B, 3·N, H, W]) are encoded one by one: [B, N·C, h, w]."""
    from ..data.pairs import joined_references, per_reference
    with torch.no_grad():
        latents = model.family.encode_latents(model, per_reference(to_device(pixels, device), 3), None)
    return joined_references(latents, pixels.shape[0])


class LossParts:
    """Per-sample losses of one optimizer step, summed by kind: instance samples and class
    (prior-preservation) samples, the latter before dataset.prior_loss_weight. `reduce` averages
    each over all processes: {"loss_instance": ..., "loss_prior": ...} (a part with no sample this
    step is left out). Disabled (reduce returns {}) when the run has no class samples. `audio`: the run
    trains clips' audio tracks; "loss_audio" is then the audio term's mean (before loss.audio_loss_weight)
    over this step's samples with audio."""

    def __init__(self, enabled: bool, audio: bool = False):
        self.enabled, self.audio = enabled, audio
        self.totals = torch.zeros(6, dtype=torch.float64)  # instance sum, count, class sum, count, audio sum, count

    def add(self, per_sample: torch.Tensor, is_class: torch.Tensor) -> None:
        if not self.enabled:
            return
        losses, is_class = per_sample.detach().double().cpu(), is_class.cpu().bool()
        self.totals[:4] += torch.stack([losses[~is_class].sum(), (~is_class).sum().double(),
                                        losses[is_class].sum(), is_class.sum().double()])

    def add_audio(self, per_sample: torch.Tensor) -> None:
        if self.audio:
            self.totals[4:] += torch.stack([per_sample.detach().double().cpu().sum(),
                                            torch.tensor(float(per_sample.numel()), dtype=torch.float64)])

    def reduce(self, accelerator) -> dict[str, float]:
        if not (self.enabled or self.audio):  # the same on every process: a collective below or none
            return {}
        totals = self.totals
        if accelerator.num_processes > 1:
            totals = accelerator.reduce(totals.to(accelerator.device), reduction="sum").cpu()
        parts = ((("loss_instance", totals[0:2]), ("loss_prior", totals[2:4])) if self.enabled else ()) + \
            ((("loss_audio", totals[4:6]),) if self.audio else ())
        return {name: float(total / count) for name, (total, count) in parts if count > 0}
