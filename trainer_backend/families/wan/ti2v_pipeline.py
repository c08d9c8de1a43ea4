"""Wan 2.2 TI2V-5B's two modes in one sampling pipeline: diffusers has WanPipeline (text-to-video) and
WanImageToVideoPipeline (image-to-video), both with expand_timesteps for TI2V-5B; a sample prompt with a start
image (`--control`) needs the second, one without it the first, from the same pipeline object."""
from __future__ import annotations

from diffusers import WanImageToVideoPipeline, WanPipeline


class WanTI2VPipeline(WanPipeline):
    """WanPipeline with expand_timesteps; called with `image`, it runs WanImageToVideoPipeline over the same
    modules (their adapters included): the image's latents are the clean first latent frame at timestep 0.
    Saved folders are written as plain WanPipeline folders (families/wan/family_ti2v.py)."""

    def __call__(self, *args, image=None, **kwargs):
        if image is None:
            return super().__call__(*args, **kwargs)
        return self.image_to_video()(*args, image=image, **kwargs)

    def image_to_video(self) -> WanImageToVideoPipeline:
        device = self._execution_device   # where this pipeline runs (the sampler may have fixed it)
        runs_here = type("WanImageToVideoPipeline", (WanImageToVideoPipeline,),
                         {"_execution_device": property(lambda _: device)})
        pipe = runs_here(tokenizer=self.tokenizer, text_encoder=self.text_encoder, vae=self.vae,
                         scheduler=self.scheduler, transformer=self.transformer, transformer_2=None,
                         expand_timesteps=True)
        pipe.set_progress_bar_config(**getattr(self, "_progress_bar_config", {}))
        return pipe
