"""Wan 2.2 TI2V-5B behind the family contract: ONE WanTransformer3DModel (no second expert) over the
48-channel latents of the Wan 2.2 VAE (AutoencoderKLWan with a 2x2 patchify: 16x spatial, 4x temporal, its own
latents_mean/std), UMT5 text (frozen), flow matching; the rest is the T2V family's (family.py: text, latents,
LoRA layouts, full fine-tune folder).

The one model does text-to-video and image-to-video. diffusers runs the second with WanImageToVideoPipeline and
expand_timesteps: the image's latents replace the first latent frame and that frame's tokens get timestep 0.
Training does the same for a share of the clips (dataset.video_start_image_probability, drawn per clip and
step: `given_frames`): the clip's own first frame, encoded alone (the causal VAE's first latent frame is that
frame's; the posterior mean, as the pipeline's argmax), is given clean at timestep 0 and the loss leaves it out.
Samples: text-to-video, or image-to-video from a sample prompt's `--control <image>` (ti2v_pipeline.py).
"""
from __future__ import annotations

import json
from pathlib import Path

from ..flow_common import device_of
from .family import Wan22Family
from .i2v import start_image_draws, ti2v_mix

PIPELINES = ("WanPipeline", "WanImageToVideoPipeline")   # TI2V-5B folders (Wan-AI's: WanPipeline)


def _config(folder: Path) -> dict:
    try:
        return json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return {}


class Wan22TI2VFamily(Wan22Family):
    name = "wan22_ti2v"
    label = "Wan 2.2 TI2V-5B"
    short_label = "Wan 2.2 TI2V"
    base_model_version = "wan_2.2_ti2v_5b"
    modelspec_architecture = "wan-2.2-ti2v-5b"
    full_size_config = "wan22_ti2v"   # assets/model_configs: the Wan 2.2 VAE (UMT5: T2V-A14B's, the same)
    takes_start_image = True          # a sample prompt's --control <image> is its start frame
    default_fps = 24.0                # TI2V-5B makes 24 fps clips (A14B: 16)
    model_options = ()                # one transformer: no model.expert

    # ---- detection and loading
    def detect_folder(self, folder: Path, index: dict) -> bool:
        """A WanPipeline (or WanImageToVideoPipeline) folder with expand_timesteps, one transformer, and a
        transformer that reads the VAE's latents alone (in_channels = z_dim: 48 for TI2V-5B)."""
        if index.get("_class_name", "") not in PIPELINES or not index.get("expand_timesteps"):
            return False
        if any(index.get("transformer_2") or ()):
            return False
        channels = _config(folder / "transformer").get("in_channels")
        return channels is not None and channels == _config(folder / "vae").get("z_dim")

    def build_tiny(self, out_dir, seed: int = 0, **options) -> Path:
        from .tiny_ti2v import build_tiny_wan_ti2v
        return build_tiny_wan_ti2v(out_dir, seed=seed)

    def meta_denoiser(self):
        from .configs import meta_transformer
        return meta_transformer("ti2v-5b")

    # ---- image-to-video training: the first latent frame given
    def given_frames(self, model, batch, latent_shape, *, seed, epoch, cfg):
        """With dataset.video_start_image_probability > 0, every step takes per-token timesteps (as both of the
        pipelines call TI2V-5B), the same memory whatever the draw; a 1-latent-frame sample (an image) has
        nothing after its first frame and always trains text-to-image."""
        probability = cfg.dataset.video_start_image_probability if cfg is not None else 0.0
        if probability <= 0 or len(latent_shape) != 5:
            return None
        import torch
        given = torch.zeros(latent_shape[0], latent_shape[2], dtype=torch.bool)
        if latent_shape[2] > 1:
            given[:, 0] = start_image_draws(seed, epoch, batch["index"]) < probability
        return given

    def start_latents(self, model, batch):
        """Each sample's first frame as latents (B, C, 1, h, w): the cached latents' first frame (the posterior
        mean), else the first frame encoded alone (its mean), as the pipeline encodes its image."""
        import torch
        if "latents" in batch:
            return batch["latents"][:, :, :1]
        pixels = batch["pixel_values"]
        first = pixels[:, :, :1] if pixels.ndim == 5 else pixels.unsqueeze(2)
        with torch.no_grad():
            return self.encode_latents(model, first.to(device_of(model.vae)), None)

    def predict(self, model, denoiser, noisy, timesteps, text, batch, dtype, cfg=None):
        given = batch.get("given_frames")
        if given is None:  # text-to-video only: one timestep per sample (the pipeline's per-token copies compute
            # the same, with a (tokens x 6 x width) modulation per block that this leaves out)
            return super().predict(model, denoiser, noisy, timesteps, text, batch, dtype, cfg)
        # a step with no start image skips its encode (the memory probe's meta tensors cannot be asked)
        needed = given.device.type == "meta" or bool(given[:, 0].any())
        start = self.start_latents(model, batch) if needed else noisy
        latents, per_token = ti2v_mix(noisy, start, timesteps, given[:, 0])
        return super().predict(model, denoiser, latents, per_token, text, batch, dtype, cfg)

    # ---- sampling and outputs
    def build_pipeline(self, model, scheduler: str = "euler"):
        from .ti2v_pipeline import WanTI2VPipeline
        pipe = WanTI2VPipeline(tokenizer=model.tokenizers[0], text_encoder=model.text_encoders[0], vae=model.vae,
                               scheduler=self.sampling_scheduler(model, scheduler), transformer=model.denoiser,
                               transformer_2=None, expand_timesteps=True)
        pipe.set_progress_bar_config(disable=True)
        return pipe

    def save_pipeline_folder(self, model, folder: Path) -> None:
        """A plain WanPipeline folder with expand_timesteps (what Wan-AI publishes; diffusers loads it)."""
        from diffusers import WanPipeline
        components = self.build_pipeline(model, "default").components
        WanPipeline(**components, expand_timesteps=True).save_pretrained(str(folder), safe_serialization=True)


WAN22_TI2V = Wan22TI2VFamily()
