"""Wan 2.2 image-to-video (I2V-A14B) behind the family contract: the T2V family (family.py: two experts
split at boundary_ratio 0.9, the same VAE, UMT5 text, LoRA layouts) with each training clip conditioned on
its own first frame as diffusers' WanImageToVideoPipeline conditions at sampling (i2v.py): the first frame
followed by black frames through the VAE, a mask marking the first latent frame, both concatenated to the
noisy latents on the channels (16 + 4 + 16 = 36 for the real transformer).

The condition comes from the batch's pixels. With cached latents (dataset.cache_latents) it is built from the
clip's own first frame once, when the latents are cached, and stored beside them (`pixel_conditions`,
`batch["conditions"]["i2v_condition"]`): a cached step runs no VAE and sees exactly the uncached step's
condition. (A batch with cached latents but no cached condition, e.g. from a caller that caches latents
alone, decodes the first frame from the first latent frame and encodes it again: a VAE round trip.)

Samples are drawn by WanImageToVideoPipeline from a sample prompt's `--control <image>`, else from the first
frame of the first clip this run trained on (before the first step: a mid-grey frame).
"""
from __future__ import annotations

from pathlib import Path

from ..flow_common import device_of
from .family import Wan22Family
from .i2v import first_frame_condition, i2v_input

SAMPLE_IMAGE = "first_frame"   # model.options key: the samples' input image (PIL)
SAMPLE_LATENT = "first_latent_frame"  # ... or, from a cached run, the first latent frame it is decoded from
CONDITION = "i2v_condition"    # batch["conditions"] key of the cached condition


class Wan22I2VFamily(Wan22Family):
    name = "wan22_i2v"
    label = "Wan 2.2 I2V"
    short_label = "Wan 2.2 I2V"
    base_model_version = "wan_2.2_i2v_14b"
    modelspec_architecture = "wan-2.2-i2v-14b"
    full_size_config = "wan22_t2v"   # assets/model_configs: the same UMT5 and VAE configs as T2V-A14B
    first_frame_conditioned = True   # the pipeline's `image` is the clip's first frame (tests pass one)
    takes_start_image = True         # a sample prompt's --control <image> is its start frame

    def detect_folder(self, folder: Path, index: dict) -> bool:
        # Wan 2.1 I2V is a WanImageToVideoPipeline too, with a CLIP image encoder; TI2V-5B expands timesteps
        encoder = index.get("image_encoder")
        no_encoder = not encoder or not any(encoder)
        return (index.get("_class_name", "") == "WanImageToVideoPipeline" and no_encoder
                and not index.get("expand_timesteps"))

    def build_tiny(self, out_dir, seed: int = 0, **options) -> Path:
        from .tiny_i2v import build_tiny_wan_i2v
        return build_tiny_wan_i2v(out_dir, seed=seed)

    def meta_denoiser(self):
        from .configs import meta_transformer
        return meta_transformer("i2v-a14b")

    def pipeline_class(self):
        from diffusers import WanImageToVideoPipeline
        return WanImageToVideoPipeline

    # ---- the first-frame condition
    def first_frames(self, model, batch):
        """Each sample's first frame (B, 3, H, W) in [-1, 1]: the clip's (an image is its own first frame),
        or decoded from the cached latents' first latent frame."""
        pixels = batch.get("pixel_values")
        if pixels is not None:
            return pixels[:, :, 0] if pixels.ndim == 5 else pixels
        latents = batch["latents"][:, :, :1].to(device_of(model.vae))
        return self.decode_latents(model, latents)[:, :, 0]

    pixel_condition_names = (CONDITION,)

    def pixel_conditions(self, model, pixels) -> dict:
        """The condition an uncached step builds from these pixels ((B, 3, H, W) images or (B, 3, F, H, W)
        clips), computed once while the latents are cached and stored beside them."""
        import torch
        first, frames = (pixels[:, :, 0], pixels.shape[2]) if pixels.ndim == 5 else (pixels, 1)
        with torch.no_grad():
            return {CONDITION: first_frame_condition(model.vae, first.to(device_of(model.vae)), frames,
                                                     self.frame_step)}

    def condition(self, model, batch, latent_frames: int):
        """The I2V condition (B, 4 + C, F', h, w) of the batch's clips, as WanImageToVideoPipeline.prepare_latents
        builds it from the first frame (cached with the latents: read back, no VAE)."""
        import torch
        cached = batch.get("conditions", {}).get(CONDITION)
        if cached is not None:
            if (SAMPLE_IMAGE not in model.options and SAMPLE_LATENT not in model.options
                    and cached.device.type != "meta"):   # the memory planner's probe runs on the meta device
                # the samples' start frame: decoded when a sample is drawn, not in the step
                model.options[SAMPLE_LATENT] = batch["latents"][:1, :, :1].detach().cpu()
            return cached
        with torch.no_grad():
            first = self.first_frames(model, batch).to(device_of(model.vae))
            if SAMPLE_IMAGE not in model.options and first.device.type != "meta":
                model.options[SAMPLE_IMAGE] = _to_pil(first[0])
            frames = (latent_frames - 1) * self.frame_step + 1
            return first_frame_condition(model.vae, first, frames, self.frame_step)

    def predict(self, model, denoiser, noisy, timesteps, text, batch, dtype, cfg=None):
        condition = self.condition(model, batch, noisy.shape[2]).to(noisy.device)
        return super().predict(model, denoiser, i2v_input(noisy, condition), timesteps, text, batch, dtype, cfg)

    # ---- sampling
    def pipeline_call_options(self, model) -> dict:
        from PIL import Image
        if model is not None and SAMPLE_IMAGE not in model.options and SAMPLE_LATENT in model.options:
            import torch
            with torch.no_grad():
                latent = model.options.pop(SAMPLE_LATENT).to(device_of(model.vae))
                model.options[SAMPLE_IMAGE] = _to_pil(self.decode_latents(model, latent)[0, :, 0])
        image = model.options.get(SAMPLE_IMAGE) if model is not None else None
        return {"image": image if image is not None else Image.new("RGB", (64, 64), (128, 128, 128))}


def _to_pil(frame):
    """(3, H, W) in [-1, 1] -> an RGB PIL image."""
    from PIL import Image
    pixels = ((frame.float().clamp(-1, 1) + 1) * 127.5).round().byte().permute(1, 2, 0).cpu().numpy()
    return Image.fromarray(pixels)


WAN22_I2V = Wan22I2VFamily()
