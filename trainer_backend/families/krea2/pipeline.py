"""Krea2EditPipeline: diffusers' Krea2Pipeline that also takes reference images (`image=`, one PIL
image or a list of up to three), for the studio's samples of an edit run and for trying an edit LoRA.
Without `image` it is Krea2Pipeline, call for call. With it, the prompt (and the negative prompt) is read
by Qwen3-VL after the references (text.py, as training reads a pair's caption), and each reference is
resized, its aspect kept, to the output's area (training pairs a control image with its target at the
target's bucket, data/pairs.py: as many tokens), encoded by
the pipeline's VAE into normalised latents as training encodes them, and attached to every transformer
call of the denoising loop (references.py: after the target's tokens, positions (i + 1, h, w), t = 0),
the negative-prompt pass included. Folders it saves are plain Krea2Pipeline folders (the family's
save_pipeline_folder), which diffusers loads as they are."""
from __future__ import annotations

from diffusers import Krea2Pipeline

from .references import attached, pack_references

MAX_REFERENCES = 3  # what ai-toolkit's Krea 2 edit mode and its ComfyUI nodes take


def padded_alike(*embeds):
    """(hidden [B, L, n, D], mask [B, L]) pairs right-padded (masked) to one length."""
    import torch.nn.functional as F
    width = max(hidden.shape[1] for hidden, _ in embeds)
    return [(F.pad(hidden, (0, 0, 0, 0, 0, width - hidden.shape[1])), F.pad(mask, (0, width - mask.shape[1])))
            for hidden, mask in embeds]


class Krea2EditPipeline(Krea2Pipeline):

    def reference_size(self, image, height: int, width: int) -> tuple[int, int]:
        """(height, width) a reference is encoded at: its own aspect at the output's area (the token count
        training gives a reference: the dataset pairs it at its target's size), in multiples of 16 px."""
        h, w = (image.shape[-2], image.shape[-1]) if hasattr(image, "shape") else (image.height, image.width)
        multiple = self.vae_scale_factor * self.patch_size
        scale = (height * width / (h * w)) ** 0.5
        return (max(multiple, round(h * scale / multiple) * multiple),
                max(multiple, round(w * scale / multiple) * multiple))

    def reference_latents(self, images, height: int, width: int) -> list:
        """Each reference image (PIL, or a [3, H, W] / [1, 3, H, W] tensor in [-1, 1]) -> [1, C, h, w] latents at
        reference_size, normalised per channel as training's control latents are."""
        import torch
        from ..qwen_image.family import latent_stats
        vae = self.vae
        device = next(vae.parameters()).device
        out = []
        for image in images:
            size = self.reference_size(image, height, width)
            if isinstance(image, torch.Tensor):
                pixels = torch.nn.functional.interpolate(image.reshape(1, 3, *image.shape[-2:]).float(), size=size,
                                                         mode="bilinear", antialias=True)
            else:
                pixels = self.image_processor.preprocess(image, height=size[0], width=size[1])
            with torch.no_grad():
                mean = vae.encode(pixels.to(device, vae.dtype).unsqueeze(2)).latent_dist.mean[:, :, 0].float()
            shift, scale = latent_stats(vae, mean)
            out.append((mean - shift) / scale)
        return out

    def encode_with_references(self, prompts: list[str], images: list):
        """(prompt_embeds, mask) of each prompt read by Qwen3-VL after the reference images, as training
        encodes an edit pair's caption (text.py)."""
        from .text import encode, tokenize
        template = (self.prompt_template_encode_prefix, self.prompt_template_encode_suffix,
                    self.prompt_template_encode_start_idx, self.prompt_template_encode_num_suffix_tokens)
        inputs = tokenize(self.tokenizer, prompts, [images] * len(prompts), template)
        out = encode(self.text_encoder, inputs, tuple(self.text_encoder_select_layers), template[2])
        return out["hidden"], out["mask"].bool()

    def __call__(self, prompt=None, negative_prompt=None, *, image=None, **kwargs):
        if image is None:
            return super().__call__(prompt=prompt, negative_prompt=negative_prompt, **kwargs)
        images = list(image) if isinstance(image, (list, tuple)) else [image]
        if not 1 <= len(images) <= MAX_REFERENCES:
            raise ValueError(f"Krea2EditPipeline takes 1 to {MAX_REFERENCES} reference images, got {len(images)}")
        multiple = self.vae_scale_factor * self.patch_size  # the size the parent pipeline rounds up to
        height, width = (-(-int(kwargs.get(k, 1024)) // multiple) * multiple for k in ("height", "width"))
        latents = self.reference_latents(images, height, width)
        tokens, positions = pack_references(latents, self._execution_device, self.transformer.dtype)
        if prompt is not None:  # the text encoder reads the references too, the negative pass's included
            from ..qwen_image.text import to_pil
            pil = [to_pil(i.reshape(1, 3, *i.shape[-2:]))[0] if hasattr(i, "shape") else i for i in images]
            prompts = [prompt] if isinstance(prompt, str) else list(prompt)
            kwargs["prompt_embeds"], kwargs["prompt_embeds_mask"] = self.encode_with_references(prompts, pil)
            if kwargs.get("guidance_scale", 4.5) > 0 and kwargs.get("negative_prompt_embeds") is None:
                negative = negative_prompt or ""
                negatives = [negative] * len(prompts) if isinstance(negative, str) else list(negative)
                negative_embeds = self.encode_with_references(negatives, pil)
                # one length for both passes: the loop computes the positions once, from the prompt's
                (kwargs["prompt_embeds"], kwargs["prompt_embeds_mask"]), \
                    (kwargs["negative_prompt_embeds"], kwargs["negative_prompt_embeds_mask"]) = padded_alike(
                        (kwargs["prompt_embeds"], kwargs["prompt_embeds_mask"]), negative_embeds)
            prompt = negative_prompt = None
        with attached(self.transformer, tokens, positions):
            return super().__call__(prompt=prompt, negative_prompt=negative_prompt, **kwargs)
