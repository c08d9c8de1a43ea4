"""Flux from the separate files ComfyUI users keep, offline: the transformer in the original layout
(`model.path`, e.g. `flux1-dev.safetensors`), CLIP-L (`model.clip_l`, `clip_l.safetensors`), T5-XXL
(`model.t5`, `t5xxl_fp16.safetensors`) and the autoencoder (`model.vae`, `ae.safetensors`).

Each file's architecture comes from the bundled full-size configs (assets/model_configs/flux/;
schnell when the transformer has no guidance embedding), or from the config a file written by
this project carries in its metadata (`sd_studio.config`: tiny and custom sizes). Every file is
checked key by key against that architecture before anything loads: a wrong or truncated file
is refused in one line naming the option, the file and the first key that does not fit.
Tokenizers are not in these files: they come from `model.tokenizer` (a Flux diffusers folder, with
tokenizer/ and tokenizer_2/) or the local Hugging Face cache.
"""
from __future__ import annotations

import json
from pathlib import Path

from ...errors import ConfigError
from ..base import LoadedModel
from ..component_files import META_CONFIG, bundled, find_tokenizers  # noqa: F401 (META_CONFIG: a public name here)
from ..component_files import check as _check, header as _header, load_into as _load, own_config as _own_config
from ..component_files import strip as _strip, weights_on_meta as _weights_on_meta

CLIP_PREFIXES = ("text_encoders.clip_l.transformer.", "cond_stage_model.transformer.", "text_model.")
T5_PREFIXES = ("text_encoders.t5xxl.transformer.",)
# (repo, subfolder) looked up in the local Hugging Face cache only, per tokenizer slot
HF_CACHE = [[("black-forest-labs/FLUX.1-dev", "tokenizer"), ("black-forest-labs/FLUX.1-schnell", "tokenizer"),
             ("openai/clip-vit-large-patch14", "")],
            [("black-forest-labs/FLUX.1-dev", "tokenizer_2"), ("black-forest-labs/FLUX.1-schnell", "tokenizer_2"),
             ("google/t5-v1_1-xxl", "")]]


def _bundled(name: str) -> dict:
    return bundled("flux", name)


def load_transformer(path: Path):
    from diffusers import FluxTransformer2DModel
    from safetensors.torch import load_file
    from .single_file import from_original, to_original
    shapes, metadata = _header("model.path", path)
    shapes = {k.removeprefix("model.diffusion_model."): v for k, v in shapes.items()}
    config = {**_bundled("transformer/config.json"), "guidance_embeds": "guidance_in.in_layer.weight" in shapes}
    config = _own_config(metadata, config)
    with _weights_on_meta():
        model = FluxTransformer2DModel.from_config(config)
    like = model.state_dict()
    expected = {k: v.shape for k, v in to_original(like, config).items()}
    _check("model.path", path, shapes, expected, "Flux transformer of this size")
    state = from_original(load_file(str(path)), like, config)
    _load("model.path", path, model, state)
    return model


def load_clip_l(path_str: str):
    from safetensors.torch import load_file
    from transformers import CLIPTextConfig, CLIPTextModel
    if not path_str:
        raise ConfigError("model.clip_l: a Flux single file holds no text encoders; give the CLIP-L file "
                          "(ComfyUI's models/clip/clip_l.safetensors)")
    path = Path(path_str).expanduser()
    shapes, metadata = _header("model.clip_l", path)
    config = CLIPTextConfig(**_own_config(metadata, _bundled("text_encoder/config.json")))
    with _weights_on_meta():
        model = CLIPTextModel(config)
    expected = {k: v.shape for k, v in model.state_dict().items() if not k.endswith("position_ids")}
    shapes = _strip(shapes, CLIP_PREFIXES)
    _check("model.clip_l", path, shapes, expected, "CLIP-L text encoder")
    _load("model.clip_l", path, model, {k: v for k, v in _strip(load_file(str(path)), CLIP_PREFIXES).items()
                                        if k in expected})
    return model


def load_t5(path_str: str):
    from safetensors.torch import load_file
    from transformers import T5Config, T5EncoderModel
    if not path_str:
        raise ConfigError("model.t5: a Flux single file holds no text encoders; give the T5-XXL file "
                          "(ComfyUI's models/clip/t5xxl_fp16.safetensors)")
    path = Path(path_str).expanduser()
    shapes, metadata = _header("model.t5", path)
    config = T5Config(**_own_config(metadata, _bundled("text_encoder_2/config.json")))
    with _weights_on_meta():
        model = T5EncoderModel(config)
    tied = "encoder.embed_tokens.weight"  # the same tensor as shared.weight
    expected = {k: v.shape for k, v in model.state_dict().items() if k != tied}
    shapes = _strip(shapes, T5_PREFIXES)
    _check("model.t5", path, shapes, expected, "T5-XXL encoder")
    _load("model.t5", path, model, {k: v for k, v in _strip(load_file(str(path)), T5_PREFIXES).items()
                                    if k in expected}, skip=(tied,))
    model.encoder.embed_tokens = model.shared
    return model


def load_vae(path_str: str):
    import tempfile

    import torch
    from diffusers import AutoencoderKL
    if not path_str:
        raise ConfigError("model.vae: a Flux single file holds no autoencoder; give the VAE file "
                          "(ComfyUI's models/vae/ae.safetensors) or a diffusers VAE folder")
    path = Path(path_str).expanduser()
    if path.is_dir():
        from ..sd.loader import _load_vae
        return _load_vae(str(path), None)
    _, metadata = _header("model.vae", path)
    config = _own_config(metadata, _bundled("vae/config.json"))
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "vae").mkdir()
        (Path(tmp) / "vae" / "config.json").write_text(json.dumps(config))
        try:
            vae = AutoencoderKL.from_single_file(str(path), config=tmp, subfolder="vae", local_files_only=True,
                                                 dtype=torch.float32)
        except (OSError, ValueError, KeyError, TypeError, RuntimeError) as e:
            from ..sd.loader import _first_line
            raise ConfigError(f"model.vae: {path.name} is not a Flux autoencoder ({_first_line(e)})") from None
    if vae.config.latent_channels != 16:
        raise ConfigError(f"model.vae: {path.name} has {vae.config.latent_channels} latent channels; Flux's has 16")
    return vae


def load_tokenizers(folder: str):
    """(CLIP tokenizer, T5 tokenizer) from model.tokenizer or the local Hugging Face cache."""
    return find_tokenizers(folder, ("tokenizer", "tokenizer_2"), HF_CACHE, "Flux")


def load_flux_files(family, src: Path, *, vae: str, tokenizer: str, files: dict[str, str]) -> LoadedModel:
    from diffusers import FlowMatchEulerDiscreteScheduler
    transformer = load_transformer(src)
    clip, t5 = load_clip_l(files.get("clip_l", "")), load_t5(files.get("t5", ""))
    autoencoder = load_vae(vae)
    tokenizers = load_tokenizers(tokenizer)
    scheduler = _bundled("scheduler/scheduler_config.json")
    if not transformer.config.guidance_embeds:  # schnell
        scheduler.update(use_dynamic_shifting=False, shift=1.0)
    noise_scheduler = FlowMatchEulerDiscreteScheduler.from_config(scheduler)
    return LoadedModel(family=family, denoiser=transformer, vae=autoencoder, text_encoders=[clip, t5],
                       tokenizers=tokenizers, noise_scheduler=noise_scheduler, prediction_type="flow",
                       source=str(src), vae_scale_factor=2 ** (len(autoencoder.config.block_out_channels) - 1),
                       scheduler_config=dict(noise_scheduler.config))
