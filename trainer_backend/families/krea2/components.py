"""Krea 2 (Raw or Turbo) from the separate files ComfyUI users keep, offline: the transformer (`model.path`,
models/diffusion_models/, in the original checkpoint's layout that diffusers' converter reads: `blocks.N.attn.wq`,
`first`, `txtfusion`, …, bf16 or ComfyUI's scaled fp8), the Qwen3-VL-4B text encoder (`model.text_encoder`,
models/text_encoders/: qwen3vl_file.py) and Qwen-Image's autoencoder (`model.vae`: the Wan 2.1 layout ComfyUI
keeps, diffusers' names, or a VAE folder: qwen_image/single_file.py). Each file is checked key by key and read
one tensor at a time (fp8 as bf16). The tokenizer, the tapped layers and Raw/Turbo come from `model.tokenizer`
(a Krea 2 diffusers folder: tokenizer/, model_index.json); without that folder's model_index.json a transformer
file whose name says "turbo" is taken as Turbo, any other as Raw, with the pipeline's default layers."""
from __future__ import annotations

from pathlib import Path

from ..base import LoadedModel
from ..component_files import bundled, find_qwen3_tokenizer, stream_transformer

HF_CACHE = [("krea/Krea-2-Raw", "tokenizer"), ("krea/Krea-2-Turbo", "tokenizer"), ("Qwen/Qwen3-VL-4B-Instruct", "")]


def load_transformer(path: Path, dtype=None):
    from diffusers import Krea2Transformer2DModel
    from .single_file import to_diffusers
    # the file's names through the original layout's own converter, one tensor at a time
    return stream_transformer(Krea2Transformer2DModel, "model.path", path, bundled("krea2", "transformer/config.json"),
                              lambda name, t: to_diffusers({name: t}), "Krea 2 transformer of this size",
                              "the bf16 or fp8 file Krea publishes", dtype=dtype)


def load_krea2_files(family, src: Path, *, vae: str, tokenizer: str, files: dict[str, str]) -> LoadedModel:
    from diffusers import FlowMatchEulerDiscreteScheduler
    from transformers import Qwen3VLModel
    from ...errors import ConfigError
    from ..qwen3vl_file import load_qwen3vl
    from ..qwen_image.family import QwenImageFamily
    from ..qwen_image.single_file import load_vae
    from .family import pipeline_options
    from .tiny import scheduler_config
    transformer = load_transformer(src)
    text_encoder = load_qwen3vl(files.get("text_encoder", ""), Qwen3VLModel, bundled("krea2", "text_encoder/config.json"),
                                "Krea 2", "ComfyUI's models/text_encoders/ Qwen3-VL-4B file", vision_needed=False)
    if text_encoder.config.text_config.hidden_size != transformer.config.text_hidden_dim:
        raise ConfigError(f"model.text_encoder: a {text_encoder.config.text_config.hidden_size}-wide Qwen3-VL does not "
                          f"fit this transformer (it reads {transformer.config.text_hidden_dim}-wide layers)")
    autoencoder = load_vae(vae)
    folder = Path(tokenizer).expanduser() if tokenizer else None
    options = pipeline_options(str(folder)) if folder is not None and (folder / "model_index.json").is_file() else {
        "is_distilled": "turbo" in src.name.lower()}
    sched = folder / "scheduler" / "scheduler_config.json" if folder is not None else None
    config = FlowMatchEulerDiscreteScheduler.load_config(str(sched.parent)) if sched and sched.is_file() \
        else scheduler_config()
    tok = find_qwen3_tokenizer(tokenizer, HF_CACHE, "Krea 2")
    model = QwenImageFamily.loaded(family, src, transformer, autoencoder, text_encoder, tok, dict(config))
    model.options["pipeline"] = options
    return model
