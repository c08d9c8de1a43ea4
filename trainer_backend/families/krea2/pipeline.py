"""Krea2EditPipeline: diffusers' Krea2Pipeline that also takes reference images (`image=`, one PIL
image or a list of up to three), for the studio's samples of an edit run and for trying an edit LoRA.
Without `image` it is Krea2Pipeline, call for call. With it, each reference is resized to the output's
size (training pairs a control image with its target at the target's bucket, data/pairs.py), encoded by
the pipeline's VAE into normalised latents as training encodes them, and attached to every transformer
call of the denoising loop (references.py: after the target's tokens, positions (i + 1, h, w), t = 0),
the negative-prompt pass included. Folders it saves are plain Krea2Pipeline folders (the family's
save_pipeline_folder), which diffusers loads as they are."""
from __future__ import annotations

from diffusers import Krea2Pipeline

from .references import attached, pack_references

MAX_REFERENCES = 3  # what ai-toolkit's Krea 2 edit mode and its ComfyUI nodes take


class Krea2EditPipeline(Krea2Pipeline):

    def reference_latents(self, images, height: int, width: int) -> list:
        """Each reference image (PIL, or a [3, H, W] / [1, 3, H, W] tensor in [-1, 1]) -> [1, C, h, w] latents,
        resized to height × width and normalised per channel as training's control latents are."""
        import torch
        from ..qwen_image.family import latent_stats
        vae = self.vae
        device = next(vae.parameters()).device
        out = []
        for image in images:
            if isinstance(image, torch.Tensor):
                pixels = torch.nn.functional.interpolate(image.reshape(1, 3, *image.shape[-2:]).float(),
                                                         size=(height, width), mode="bilinear", antialias=True)
            else:
                pixels = self.image_processor.preprocess(image, height=height, width=width)
            with torch.no_grad():
                mean = vae.encode(pixels.to(device, vae.dtype).unsqueeze(2)).latent_dist.mean[:, :, 0].float()
            shift, scale = latent_stats(vae, mean)
            out.append((mean - shift) / scale)
        return out

    def __call__(self, *args, image=None, **kwargs):
        if image is None:
            return super().__call__(*args, **kwargs)
        images = list(image) if isinstance(image, (list, tuple)) else [image]
        if not 1 <= len(images) <= MAX_REFERENCES:
            raise ValueError(f"Krea2EditPipeline takes 1 to {MAX_REFERENCES} reference images, got {len(images)}")
        multiple = self.vae_scale_factor * self.patch_size  # the size the parent pipeline rounds up to
        height, width = (-(-int(kwargs.get(k, 1024)) // multiple) * multiple for k in ("height", "width"))
        latents = self.reference_latents(images, height, width)
        tokens, positions = pack_references(latents, self._execution_device, self.transformer.dtype)
        with attached(self.transformer, tokens, positions):
            return super().__call__(*args, **kwargs)
