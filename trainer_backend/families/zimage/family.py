"""Z-Image (Turbo and base) behind the family contract: a ZImageTransformer2DModel (single-stream
S3-DiT) trained with rectified flow (shift 3) on 16-channel latents of the FLUX.1 autoencoder,
conditioned on Qwen3-4B's second-to-last hidden states of the chat-formatted caption, padding
dropped, as ZImagePipeline encodes prompts.

Two conventions of the transformer differ from SD3/Flux and are handled in `predict`: it takes
the time as 1 − σ (0 = noise, 1 = image), and it predicts image − noise (the pipeline negates it),
so the family returns the negated output, noise − image, the rectified-flow target.
"""
from __future__ import annotations

import json
from pathlib import Path

from ..flow_common import FlowFamily, device_of as _device

PIPELINES = ("ZImagePipeline", "ZImageImg2ImgPipeline", "ZImageInpaintPipeline")
MAX_SEQUENCE_LENGTH = 512  # ZImagePipeline's default max_sequence_length


class ZImageFamily(FlowFamily):
    name = "zimage"
    label = "Z-Image (Turbo, base)"
    text_encoder_names = ("text_encoder",)
    # Qwen3 stays frozen: Z-Image LoRA loaders (diffusers' ZImageLoraLoaderMixin, ComfyUI) load the
    # transformer only, so text-encoder adapters would be silently dropped downstream
    trained_text_encoders = ()
    full_single_file = "denoiser"
    # Qwen3 hidden states have outliers beyond float16's range; bfloat16 is what the model runs in
    text_cache_dtype = "bfloat16"
    # attention (q, k, v, out) and the SwiGLU feed-forward of every block (main layers and refiners)
    default_targets = ("to_q", "to_k", "to_v", "to_out.0", "w1", "w2", "w3")
    text_encoder_file_options = ("text_encoder",)
    short_label = "Z-Image"
    component_files_loader = ".zimage.components:load_zimage_files"
    block_patterns = ((r"^layers\.(\d+)\.", "layer_{0:02d}"),
                      (r"^noise_refiner\.(\d+)\.", "noise_refiner_{0}"),
                      (r"^context_refiner\.(\d+)\.", "context_refiner_{0}"),
                      (r"^(?:all_x_embedder|t_embedder|cap_embedder)\.", "BASE"),
                      (r"^all_final_layer\.", "END"))
    base_model_version = "z_image"   # musubi-tuner's names (kohya's Z-Image trainer)
    network_module = "networks.lora_zimage"
    modelspec_implementation = "https://github.com/Tongyi-MAI/Z-Image"
    modelspec_architecture = "z-image"
    transformer_file_module = ".zimage.single_file"

    # ---- detection and loading
    def detect_folder(self, folder: Path, index: dict) -> bool:
        return index.get("_class_name", "") in PIPELINES

    def detect_file(self, shapes, metadata) -> bool:
        from .components import is_zimage_transformer
        return is_zimage_transformer(shapes)

    def build_tiny(self, out_dir, seed: int = 0, **options) -> Path:
        from .tiny import build_tiny_zimage
        return build_tiny_zimage(out_dir, seed=seed)

    def meta_denoiser(self):
        import torch
        from diffusers import ZImageTransformer2DModel
        from ..sd.loader import ASSETS_CONFIGS
        config = json.loads((ASSETS_CONFIGS / "zimage" / "transformer" / "config.json").read_text())
        with torch.device("meta"):
            return ZImageTransformer2DModel.from_config(config)

    # ---- text: the caption as a user turn of Qwen3's chat template, as ZImagePipeline._encode_prompt
    def t5_length(self, model) -> int:
        """Tokens per caption: model.t5_max_length, else the pipeline's 512, within the tokenizer's limit."""
        return min(model.text_max_length or MAX_SEQUENCE_LENGTH, model.tokenizers[0].model_max_length)

    @staticmethod
    def chat_text(tokenizer, caption: str) -> str:
        return tokenizer.apply_chat_template([{"role": "user", "content": caption}], tokenize=False,
                                             add_generation_prompt=True, enable_thinking=True)

    def tokenize(self, model, captions, max_token_length):
        tok = model.tokenizers[0]
        batch = tok([self.chat_text(tok, c) for c in captions], padding="max_length", max_length=self.t5_length(model),
                    truncation=True, return_tensors="pt")
        return [batch.input_ids, batch.attention_mask]

    def encode_text(self, model, input_ids, encoders=None):
        encoder = (encoders or model.text_encoders)[0]
        ids, mask = input_ids[0], input_ids[1]
        device = _device(encoder)
        hidden = encoder(input_ids=ids.to(device), attention_mask=mask.to(device).bool(),
                         output_hidden_states=True).hidden_states[-2]
        # the pipeline keeps only the caption's real tokens; the mask travels with the padded states
        return {"hidden": hidden, "mask": mask.to(hidden.dtype)}

    # ---- objective and forward
    def objective(self, model):
        from ..objectives import FlowMatchObjective
        return FlowMatchObjective(shift=model.scheduler_config.get("shift", 3.0))

    def predict(self, model, denoiser, noisy, timesteps, text, batch, dtype, cfg=None):
        import torch
        hidden = text["hidden"].to(noisy.device, dtype)
        keep = batch.get("text", text)["mask"] > 0.5  # cached text: the loader's host copy, so indexing with it
        captions = [hidden[i][keep[i]] for i in range(hidden.shape[0])]  # does not wait for the GPU
        frames = list(noisy.to(dtype).unsqueeze(2).unbind(0))  # [C, 1, H, W] per image
        t = ((1000 - timesteps.float()) / 1000).to(dtype)
        out = denoiser(frames, t, captions, return_dict=False)[0]
        return -torch.stack(out, dim=0).squeeze(2)

    def use_plain_attention(self, model) -> None:
        """precision.attention = "default": Z-Image's attention processor carries its rotary embedding and
        has no plain variant; diffusers' native (PyTorch SDPA) backend is what it runs."""
        model.denoiser.set_attention_backend("native")

    # ---- sampling and outputs
    def pipeline_class(self):
        from diffusers import ZImagePipeline
        return ZImagePipeline

    def guidance_arguments(self, model, scale: float) -> dict:
        """samples' cfg_scale in the usual convention (neg + s·(pos − neg); 1 = none) as ZImagePipeline's
        guidance_scale g, which computes pos + g·(pos − neg): g = s − 1, and none at all for s ≤ 1 (Turbo)."""
        return {"guidance_scale": max(float(scale) - 1.0, 0.0)}

    def lora_file_state(self, model, adapter_states, alpha, layout="auto"):
        chosen = self.lora_layout(layout)
        if chosen == "kohya":   # musubi-tuner's names (kohya's Z-Image trainer); kohya_lora.py
            from .kohya_lora import to_musubi_zimage
            return to_musubi_zimage(adapter_states, alpha)
        if chosen == "original":   # the original checkpoint's names (fused qkv): ComfyUI's generic key map
            from .kohya_lora import to_kohya_zimage
            return to_kohya_zimage(adapter_states, alpha, model.denoiser)
        return super().lora_file_state(model, adapter_states, alpha, layout)

    def read_lora_file(self, model, state, modules):
        from .kohya_lora import is_kohya_zimage, read_kohya_zimage
        if is_kohya_zimage(state):
            return read_kohya_zimage(state, modules)
        return super().read_lora_file(model, state, modules)


ZIMAGE = ZImageFamily()
