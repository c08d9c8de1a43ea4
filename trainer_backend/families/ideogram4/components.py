"""Ideogram 4 from the separate files ComfyUI users keep, offline: the transformer (`model.path`,
models/diffusion_models/ideogram4_fp8_scaled.safetensors or a bf16 file, original layout:
original_file.py), the Qwen3-VL-8B text encoder (`model.text_encoder`, models/text_encoders/
qwen3vl_8b_fp8_scaled.safetensors: qwen3vl_file.py) and the autoencoder (`model.vae`: FLUX.2's
flux2-vae.safetensors, or a diffusers VAE folder: flux2/components.py). fp8 files load tensor by tensor
as bf16, never as a whole fp32 model. The tokenizer comes from `model.tokenizer` (an Ideogram 4
diffusers folder with tokenizer/, or a Qwen3-VL tokenizer folder) or the local Hugging Face cache.
Samples need the pipeline's unconditional transformer, which these files do not hold: `model.tokenizer`'s
folder gives it when it has one (unconditional_transformer/), else samples are refused in one line."""
from __future__ import annotations

from pathlib import Path

from ..base import LoadedModel
from ..component_files import bundled, find_qwen3_tokenizer

HF_CACHE = [("ideogram-ai/Ideogram-4", "tokenizer"), ("Qwen/Qwen3-VL-8B-Instruct", "")]


def load_ideogram4_files(family, src: Path, *, vae: str, tokenizer: str, files: dict[str, str]) -> LoadedModel:
    from diffusers import FlowMatchEulerDiscreteScheduler
    from transformers import Qwen3VLModel
    from ...errors import ConfigError
    from ..flux2.components import load_vae
    from ..qwen3vl_file import load_qwen3vl
    from .original_file import load_transformer
    transformer = load_transformer(src)
    text_encoder = load_qwen3vl(files.get("text_encoder", ""), Qwen3VLModel, bundled("ideogram4", "text_encoder.json"),
                                "Ideogram 4", "ComfyUI's models/text_encoders/qwen3vl_8b_fp8_scaled.safetensors",
                                vision_needed=False, final_norm_needed=False)
    taps, width = transformer.config.llm_features_dim, text_encoder.config.text_config.hidden_size
    if taps % width:
        raise ConfigError(f"model.text_encoder: a {width}-wide Qwen3-VL does not fit this transformer (it reads "
                          f"{taps}-wide tapped layers)")
    autoencoder = load_vae(vae)
    tok = find_qwen3_tokenizer(tokenizer, HF_CACHE, "Ideogram 4")
    if getattr(tok, "chat_template", None) is None:
        from .tiny import VL_CHAT_TEMPLATE
        tok.chat_template = VL_CHAT_TEMPLATE
    from .tiny import scheduler_config
    scheduler = FlowMatchEulerDiscreteScheduler(**scheduler_config())
    model = LoadedModel(family=family, denoiser=transformer, vae=autoencoder, text_encoders=[text_encoder],
                        tokenizers=[tok], noise_scheduler=scheduler, prediction_type="flow", source=str(src),
                        vae_scale_factor=2 ** (len(autoencoder.config.block_out_channels) - 1),
                        scheduler_config=dict(scheduler.config),
                        options={"unconditional_folder": str(Path(tokenizer).expanduser()) if tokenizer else ""})
    return model
