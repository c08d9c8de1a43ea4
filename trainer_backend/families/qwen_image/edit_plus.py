"""Qwen-Image-Edit-2509 and -2511 (diffusers' QwenImageEditPlusPipeline) behind the family contract: the
Qwen-Image-Edit family with one to three reference images per training image and per sample prompt.

What differs from Qwen-Image-Edit, as the pipeline computes it: every reference's packed latents follow
the target's tokens, each with its own img_shapes entry (family.py's predict reads the references one
after another along the channels of `control_latents`); the text encoder reads each reference resized
to about 384² pixels, announced as "Picture N:" before the instruction (text.py). 2511 differs from
2509 only in its transformer config (`zero_cond_t`: the reference tokens are modulated with timestep 0),
which diffusers applies from the folder's transformer/config.json: the same code trains both. Both
folders name QwenImageEditPlusPipeline in model_index.json, which is how they are detected.
"""
from __future__ import annotations

from pathlib import Path

from ...errors import ConfigError
from ..flow_common import device_of as _device
from . import text as qtext
from .family import QwenImageEditFamily

PLUS_PIPELINES = ("QwenImageEditPlusPipeline",)
MAX_REFERENCES = 3  # what the model cards train and show; the registry entry's max_control_images


class QwenImageEditPlusFamily(QwenImageEditFamily):
    name = "qwen_image_edit_plus"
    label = "Qwen-Image-Edit-2509/2511"
    base_model_version = "qwen_image_edit_plus"
    modelspec_architecture = "qwen-image-edit-plus"
    pipelines = PLUS_PIPELINES
    max_control_images = MAX_REFERENCES

    def load(self, src: Path, **options):
        # a transformer file looks like Qwen-Image's (detect_file: model.arch picks this family) and cannot
        # tell 2509 from 2511 (zero_cond_t is in the folder's config only): folders only
        if not src.is_dir():
            raise ConfigError(f"model.path: {self.label} loads from a diffusers folder (with model_index.json); "
                              f"{src} is a file, and a single transformer file cannot tell 2509 from 2511")
        return super().load(src, **options)

    def pipeline_class(self):
        from diffusers import QwenImageEditPlusPipeline
        return QwenImageEditPlusPipeline

    def build_tiny(self, out_dir, seed: int = 0, variant: str = "", **options) -> Path:
        """variant "" (2509) or "2511" (its transformer's zero_cond_t)."""
        from .tiny import build_tiny_qwen_image
        return build_tiny_qwen_image(out_dir, seed=seed, edit=True, plus=True, zero_cond_t=variant == "2511")

    # ---- text: each caption with all of its references
    def tokenize(self, model, captions, max_token_length, controls=None):
        """controls: per caption a list of PIL reference images, or [B, 3·N, H, W] pixels in [-1, 1]."""
        if controls is None:
            raise ConfigError(f"{self.label}: its text encoder reads each caption with its reference images "
                              "(dataset.control_path)")
        if not isinstance(controls, list):
            from ...data.pairs import per_reference
            images = qtext.to_pil(per_reference(controls, 3))
            n = len(images) // len(captions)
            controls = [images[i * n:(i + 1) * n] for i in range(len(captions))]
        return qtext.tokenize_plus(model.tokenizers[0], list(captions), controls)

    def probe_tokens(self, model, captions):
        """The caption alone through the Edit-Plus template (no vision tokens: see QwenImageEditFamily)."""
        template, drop = qtext.plus_template()
        enc = model.tokenizers[0].tokenizer([template.format(c) for c in captions], max_length=1024 + drop,
                                            padding=True, truncation=True, return_tensors="pt")
        return [enc.input_ids, enc.attention_mask]

    def tokenize_batch(self, model, batch, max_token_length):
        from .family import pair_reference_pixels   # cached latents: each reference back from its latent
        return self.tokenize(model, list(batch["caption"]), max_token_length,
                             controls=pair_reference_pixels(self, model, batch))

    def encode_text(self, model, input_ids, encoders=None):
        encoder = (encoders or model.text_encoders)[0]
        inputs = [t.to(_device(encoder)) for t in input_ids]
        return qtext.encode(encoder, inputs, True, None, drop=qtext.plus_template()[1])


QWEN_IMAGE_EDIT_PLUS = QwenImageEditPlusFamily()
