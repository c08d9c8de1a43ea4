"""VAE (autoencoder) fine-tuning, `network.type = "vae"`: teach the autoencoder to reconstruct the
dataset's images (art styles the base VAE renders poorly, e.g. eyes in anime or furry art).

The one training loop runs it: methods/__init__.py hands the loop this method's model (the
autoencoder alone), trainable modules, batch loss (`vae_loss`), validator and outputs.

Objective: reconstruction loss on pixels (vae.loss: l1 or mse; no perceptual LPIPS term, which
needs pretrained weights we cannot download) plus vae.kl_weight × KL(posterior ‖ N(0, I)),
scaled as in the original LDM autoencoder (a per-pixel reconstruction loss, the KL summed over
the latent, both divided by the pixels per image), so 1e-6 means what it meant there. With
vae.decoder_only (the default) the encoder is frozen: the latent space stays the one every UNet
and LoRA was trained on, and the KL term is constant, so it is skipped.

Precision: fp32 by default; bf16 allowed; fp16 refused (the VAE's activations overflow fp16 and
the loss turns NaN). Outputs: `<name>-vae/` (a diffusers AutoencoderKL folder) and
`<name>-vae.safetensors` (the original single-file VAE layout webui/ComfyUI load); either can be
given as `model.vae` to a later LoRA or fine-tune run.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import torch
import torch.nn.functional as F

from ..config import TrainConfig
from ..diffusion.validation import Validator
from .base import Trainable

LOG = logging.getLogger("trainer")
SAVE_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
MIXED = {"fp32": "no", "bf16": "bf16"}
def check_vae_config(cfg: TrainConfig) -> None:
    """vae.precision fp16 and full_bf16/full_fp16 are refused (config/hardware_rules.py)."""
    from ..config import rules
    rules.check(cfg, "half_weights", "precision")


def vae_run_config(cfg: TrainConfig) -> TrainConfig:
    """The config the VAE run trains with: vae.precision as the mixed precision, no latent or
    text caches (the pixels are the input and the target)."""
    c = cfg.model_copy(deep=True)
    c.precision.mixed = MIXED[cfg.vae.precision]
    if cfg.dataset.cache_latents or cfg.dataset.cache_text_encoder_outputs:
        LOG.warning("dataset.cache_latents / cache_text_encoder_outputs are ignored: VAE training needs the pixels")
    c.dataset.cache_latents = c.dataset.cache_text_encoder_outputs = False
    return c


class Reconstruction(torch.nn.Module):
    """Encode, sample the posterior with the given noise, decode: one forward, so DDP sees (and
    syncs) the gradients and accelerate's autocast applies."""

    def __init__(self, vae):
        super().__init__()
        self.vae = vae

    def forward(self, pixels: torch.Tensor, eps: torch.Tensor, encoder_frozen: bool):
        with torch.set_grad_enabled(torch.is_grad_enabled() and not encoder_frozen):
            posterior = self.vae.encode(pixels).latent_dist
        latents = posterior.mean + posterior.std * eps.to(posterior.mean)
        return self.vae.decode(latents).sample, posterior


def reconstruction_loss(recon: torch.Tensor, pixels: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-pixel L1 or MSE, averaged (fp32)."""
    fn = F.l1_loss if kind == "l1" else F.mse_loss
    return fn(recon.float(), pixels.float())


def kl_per_pixel(posterior, pixels: torch.Tensor) -> torch.Tensor:
    """KL(posterior ‖ N(0, I)) summed over the latent, averaged over the batch, divided by the
    pixel values per image (the LDM weighting, see the module docstring)."""
    return posterior.kl().float().mean() / pixels[0].numel()


def vae_loss(recon_model, batch: dict, *, cfg: TrainConfig, epoch: int, device) -> torch.Tensor:
    from ..families.objectives import sample_generator
    pixels = batch["pixel_values"].to(device)
    vae = getattr(recon_model, "module", recon_model).vae
    f = 2 ** (len(vae.config.block_out_channels) - 1)
    shape = (vae.config.latent_channels, pixels.shape[-2] // f, pixels.shape[-1] // f)
    # per-sample noise seeded by (seed, epoch, index), as in families/objectives.py: exact accumulation/DDP/resume
    eps = torch.stack([torch.randn(shape, generator=sample_generator(cfg.schedule.seed, epoch, i))
                       for i in map(int, batch["index"])]).to(device)
    recon, posterior = recon_model(pixels, eps, cfg.vae.decoder_only)
    loss = reconstruction_loss(recon, pixels, cfg.vae.loss)
    if not cfg.vae.decoder_only and cfg.vae.kl_weight > 0:
        loss = loss + cfg.vae.kl_weight * kl_per_pixel(posterior, pixels)
    return loss


class ReconstructionValidator(Validator):
    """validation.* in a VAE run: the reconstruction loss (vae.loss) of the posterior mean (no
    sampling noise, so evaluations compare) on the validation images, with the diffusion
    validator's schedule, sharding, `validation` events and keep-best metric."""

    def __init__(self, cfg: TrainConfig, accelerator, run, recon_model):
        self.recon_model = recon_model
        super().__init__(cfg, None, accelerator, run)

    def _timesteps(self) -> list[int]:
        return []

    def _modules(self) -> list[torch.nn.Module]:
        return [self.recon_model]

    def _score(self, number: int, indices: list[int]) -> tuple[float, int]:
        from ..data.indexed import collate_with_index
        pixels = collate_with_index([(i, self.dataset[i]) for i in indices])["pixel_values"]
        pixels = pixels.to(self.accelerator.device)
        vae = self.accelerator.unwrap_model(self.recon_model).vae
        with self.accelerator.autocast():
            recon = vae.decode(vae.encode(pixels).latent_dist.mean).sample
        return reconstruction_loss(recon, pixels, self.cfg.vae.loss).item() * len(indices), len(indices)


def setup_vae(vae, cfg: TrainConfig) -> Trainable:
    """The decoder (and post-quant conv), or the whole autoencoder, trainable in fp32."""
    vae.requires_grad_(False)
    trained = [vae.decoder, vae.post_quant_conv] if cfg.vae.decoder_only else [vae]
    for module in trained:
        if module is not None:
            module.requires_grad_(True)
    params = [p for p in vae.parameters() if p.requires_grad]
    for p in params:
        p.data = p.data.float()
    model = Reconstruction(vae)
    LOG.info("method: VAE fine-tune (%s); %s trainable parameters",
             "decoder only" if cfg.vae.decoder_only else "encoder and decoder", f"{sum(p.numel() for p in params):,}")
    return Trainable(modules={"vae": model}, param_groups=[{"params": params, "lr": cfg.optimizer.lr, "name": "vae"}],
                     kind="vae")


def load_vae(cfg: TrainConfig):
    """The VAE to fine-tune in fp32: model.vae when given, else the model's own (a diffusers
    folder's vae/ is read alone; single files go through the full loader)."""
    from diffusers import AutoencoderKL
    from ..families import resolve_model_path
    src = resolve_model_path(cfg.model.path) if cfg.model.path else None
    if not cfg.model.vae and src is not None and (src / "vae" / "config.json").is_file():
        return AutoencoderKL.from_pretrained(str(src), subfolder="vae", local_files_only=True, dtype=torch.float32)
    from ..families import load_configured
    return load_configured(cfg.model).vae


def load_vae_model(cfg: TrainConfig):
    """A LoadedModel holding only the autoencoder: no denoiser, no text encoders, no family (a VAE
    run samples no images and caches nothing)."""
    from ..families.base import LoadedModel
    vae = load_vae(cfg)
    return LoadedModel(family=None, denoiser=None, vae=vae, text_encoders=[], tokenizers=[], noise_scheduler=None,
                       prediction_type="", source=str(cfg.model.vae or cfg.model.path),
                       vae_scale_factor=2 ** (len(vae.config.block_out_channels) - 1))


def vae_single_file_state(vae) -> dict[str, torch.Tensor]:
    """The original (LDM) key layout of a standalone VAE file: encoder.down.0.block.0..., no prefix."""
    from ..families.sd.ldm_keys import VAE_PREFIX, vae_to_ldm
    state = vae_to_ldm(vae.state_dict(), dict(vae.config))
    return {k[len(VAE_PREFIX):]: v.contiguous() for k, v in state.items()}


def save_vae_outputs(cfg: TrainConfig, run_dir: Path, vae, metadata: dict[str, str] | None = None) -> list[Path]:
    """<name>-vae/ (AutoencoderKL.from_pretrained) and <name>-vae.safetensors (single file), in
    vae.save_precision; training is over, so the VAE is cast in place."""
    from safetensors.torch import save_file
    vae.to(SAVE_DTYPES[cfg.vae.save_precision])
    name = cfg.output.name
    folder = Path(run_dir) / f"{name}-vae"
    tmp = folder.with_name(folder.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    vae.save_pretrained(str(tmp), safe_serialization=True)
    if folder.exists():
        shutil.rmtree(folder)
    os.replace(tmp, folder)
    single = Path(run_dir) / f"{name}-vae.safetensors"
    partial = single.with_name(single.name + ".partial")
    meta = {"format": "pt", "sd_studio_vae_config": json.dumps(dict(vae.config), default=str), **(metadata or {})}
    save_file(vae_single_file_state(vae), str(partial), metadata=meta)
    os.replace(partial, single)
    LOG.info("saved %s and %s (%s)", folder, single, cfg.vae.save_precision)
    return [single, folder]
