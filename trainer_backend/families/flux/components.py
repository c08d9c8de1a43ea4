"""Flux from the separate files ComfyUI users keep, offline: the transformer in the original layout
(`model.path`, e.g. `flux1-dev.safetensors`), CLIP-L (`model.clip_l`, `clip_l.safetensors`), T5-XXL
(`model.t5`, `t5xxl_fp16.safetensors`) and the autoencoder (`model.vae`, `ae.safetensors`); or one
all-in-one checkpoint as ComfyUI saves it (`flux1-dev-fp8.safetensors`: `model.diffusion_model.`,
`text_encoders.clip_l.transformer.`, `text_encoders.t5xxl.transformer.`, `vae.`), whose components a
given model.clip_l / model.t5 / model.vae replaces.

Each file's architecture comes from the bundled full-size configs (assets/model_configs/flux/;
schnell when the transformer has no guidance embedding), or from the config a file written by
this project carries in its metadata (`sd_studio.config`, `sd_studio.config.<component>` in an
all-in-one file: tiny and custom sizes). Every file is checked key by key against that
architecture before anything loads: a wrong or truncated file is refused in one line naming the
option, the file and the first key that does not fit. Tokenizers are not in these files: they come
from `model.tokenizer` (a Flux diffusers folder, with tokenizer/ and tokenizer_2/) or the local
Hugging Face cache.
"""
from __future__ import annotations

from pathlib import Path

from ...errors import ConfigError
from ..base import LoadedModel
from ..component_files import META_CONFIG, bundled, embedded_vae_prefix, find_tokenizers, load_original_vae
from ..component_files import header as _header, load_checked, own_config as _own_config
from ..component_files import strip as _strip, weights_on_meta as _weights_on_meta

# where the CLIP-L weights sit (transformers 4 names under text_model.): ComfyUI checkpoints, SD checkpoints, files
CLIP_PREFIXES = ("text_encoders.clip_l.transformer.text_model.", "cond_stage_model.transformer.text_model.",
                 "text_model.")
T5_PREFIXES = ("text_encoders.t5xxl.transformer.",)
# (repo, subfolder) looked up in the local Hugging Face cache only, per tokenizer slot
HF_CACHE = [[("black-forest-labs/FLUX.1-dev", "tokenizer"), ("black-forest-labs/FLUX.1-schnell", "tokenizer"),
             ("openai/clip-vit-large-patch14", "")],
            [("black-forest-labs/FLUX.1-dev", "tokenizer_2"), ("black-forest-labs/FLUX.1-schnell", "tokenizer_2"),
             ("google/t5-v1_1-xxl", "")]]


def _bundled(name: str) -> dict:
    return bundled("flux", name)


def _source(option: str, given: str, src: Path, src_header: tuple, prefix: str):
    """(file, shapes, metadata, metadata key of its config) of a component: model.<option> if given,
    else the all-in-one model.path when it holds the component under `prefix`; None otherwise."""
    if given:
        path = Path(given).expanduser()
        return (path, *_header(f"model.{option}", path), META_CONFIG)
    shapes, metadata = src_header
    if any(k.startswith(prefix) for k in shapes):
        return src, shapes, metadata, f"{META_CONFIG}.{option}"
    return None


def load_transformer(path: Path, src_header: tuple | None = None):
    from diffusers import FluxTransformer2DModel
    from .single_file import from_original, to_original
    shapes, metadata = src_header or _header("model.path", path)
    prefix = "model.diffusion_model." if any(k.startswith("model.diffusion_model.") for k in shapes) else ""
    shapes = {k[len(prefix):]: v for k, v in shapes.items() if k.startswith(prefix)}
    config = {**_bundled("transformer/config.json"), "guidance_embeds": "guidance_in.in_layer.weight" in shapes}
    config = _own_config(metadata, config)
    with _weights_on_meta():
        model = FluxTransformer2DModel.from_config(config)
    like = model.state_dict()
    expected = {k: v.shape for k, v in to_original(like, config).items()}
    load_checked("model.path", path, model, "Flux transformer of this size", shapes, expected,
                 lambda state: from_original(state, like, config), prefix=prefix, keys=set(expected))
    return model


def load_clip_l(path_str: str, src: Path | None = None, src_header: tuple = ({}, {})):
    from transformers import CLIPTextConfig, CLIPTextModel
    found = _source("clip_l", path_str, src, src_header, CLIP_PREFIXES[0])
    if found is None:
        raise ConfigError("model.clip_l: a Flux single file holds no text encoders; give the CLIP-L file "
                          "(ComfyUI's models/clip/clip_l.safetensors)")
    path, shapes, metadata, meta_key = found
    config = CLIPTextConfig(**_own_config(metadata, _bundled("text_encoder/config.json"), meta_key))
    with _weights_on_meta():
        model = CLIPTextModel(config)
    expected = {k: v.shape for k, v in model.state_dict().items() if not k.endswith("position_ids")}
    prefix = next((p for p in CLIP_PREFIXES if any(k.startswith(p) for k in shapes)), "")
    load_checked("model.clip_l", path, model, "CLIP-L text encoder", _strip(shapes, (prefix,)), expected,
                 prefix=prefix, keys=set(expected))
    return model


def load_t5(path_str: str, src: Path | None = None, src_header: tuple = ({}, {})):
    from transformers import T5Config, T5EncoderModel
    found = _source("t5", path_str, src, src_header, T5_PREFIXES[0])
    if found is None:
        raise ConfigError("model.t5: a Flux single file holds no text encoders; give the T5-XXL file "
                          "(ComfyUI's models/clip/t5xxl_fp16.safetensors)")
    path, shapes, metadata, meta_key = found
    config = T5Config(**_own_config(metadata, _bundled("text_encoder_2/config.json"), meta_key))
    with _weights_on_meta():
        model = T5EncoderModel(config)
    tied = "encoder.embed_tokens.weight"  # the same tensor as shared.weight
    expected = {k: v.shape for k, v in model.state_dict().items() if k != tied}
    prefix = next((p for p in T5_PREFIXES if any(k.startswith(p) for k in shapes)), "")
    load_checked("model.t5", path, model, "T5-XXL encoder", _strip(shapes, (prefix,)), expected, skip=(tied,),
                 prefix=prefix, keys=set(expected))
    model.encoder.embed_tokens = model.shared
    return model


def load_vae(path_str: str, src: Path | None = None, src_header: tuple = ({}, {})):
    shapes, metadata = src_header
    if not path_str and embedded_vae_prefix(shapes) is not None:  # an all-in-one checkpoint's own
        config = _own_config(metadata, _bundled("vae/config.json"), f"{META_CONFIG}.vae")
        return load_original_vae("model.path", src, shapes, config, "Flux autoencoder")
    if not path_str:
        raise ConfigError("model.vae: a Flux single file holds no autoencoder; give the VAE file "
                          "(ComfyUI's models/vae/ae.safetensors) or a diffusers VAE folder")
    path = Path(path_str).expanduser()
    if path.is_dir():
        from ..sd.loader import _load_vae
        return _load_vae(str(path), None)
    shapes, metadata = _header("model.vae", path)
    config = _own_config(metadata, _bundled("vae/config.json"))
    if config.get("latent_channels") != 16:
        raise ConfigError(f"model.vae: {path.name} has {config.get('latent_channels')} latent channels; Flux's has 16")
    return load_original_vae("model.vae", path, shapes, config, "Flux autoencoder")


def load_tokenizers(folder: str):
    """(CLIP tokenizer, T5 tokenizer) from model.tokenizer or the local Hugging Face cache."""
    return find_tokenizers(folder, ("tokenizer", "tokenizer_2"), HF_CACHE, "Flux")


def load_flux_files(family, src: Path, *, vae: str, tokenizer: str, files: dict[str, str]) -> LoadedModel:
    from diffusers import FlowMatchEulerDiscreteScheduler
    src_header = _header("model.path", src)  # an all-in-one checkpoint holds the other components too
    transformer = load_transformer(src, src_header)
    clip = load_clip_l(files.get("clip_l", ""), src, src_header)
    t5 = load_t5(files.get("t5", ""), src, src_header)
    autoencoder = load_vae(vae, src, src_header)
    tokenizers = load_tokenizers(tokenizer)
    scheduler = _bundled("scheduler/scheduler_config.json")
    if not transformer.config.guidance_embeds:  # schnell
        scheduler.update(use_dynamic_shifting=False, shift=1.0)
    noise_scheduler = FlowMatchEulerDiscreteScheduler.from_config(scheduler)
    return LoadedModel(family=family, denoiser=transformer, vae=autoencoder, text_encoders=[clip, t5],
                       tokenizers=tokenizers, noise_scheduler=noise_scheduler, prediction_type="flow",
                       source=str(src), vae_scale_factor=2 ** (len(autoencoder.config.block_out_channels) - 1),
                       scheduler_config=dict(noise_scheduler.config))
