"""SD3 / SD3.5 from the single files people keep, offline: `sd3.5_large.safetensors`,
`sd3.5_medium.safetensors`, `sd3_medium_incl_clips_t5xxlfp16.safetensors` (`model.path`: the MMDiT
under `model.diffusion_model.`, the autoencoder under `first_stage_model.`, and maybe the text
encoders under `text_encoders.clip_l.` / `clip_g.` / `t5xxl.`), and the separate text-encoder
files ComfyUI users keep (`model.clip_l`, `model.clip_g`, `model.t5`: clip_l.safetensors,
clip_g.safetensors, t5xxl_fp16.safetensors; a given file wins over the one inside model.path).
`model.vae` replaces the autoencoder (a file or a diffusers folder).

The architecture comes from the bundled full-size configs (assets/model_configs/sd3/: SD3.5 Large,
SD3.5 Medium, SD3 Medium, picked by the file's shapes) or from the config a file written by this
project carries in its metadata (tiny and custom sizes). Every component is checked key by key
before it loads: one line names the option, the file and the first key that does not fit.
T5 is optional (SD3 then conditions on zeros in its place). SD3 uses CLIP-L's pooled output
unprojected (as diffusers' converter and ComfyUI do): its projection is the identity unless the
file is this project's own export. Tokenizers come from `model.tokenizer` (an SD3 diffusers
folder) or the local Hugging Face cache.
"""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from ...errors import ConfigError
from ..base import LoadedModel
from ..component_files import (META_CONFIG, bundled, check, embedded_vae_prefix, find_tokenizers, header, load_checked,
                               load_into, load_original_vae, own_config, read_prefixed, weights_on_meta)
from .single_file import PREFIX, from_original, to_original

VAE_PREFIX = "first_stage_model."
# option -> (prefix inside an all-in-one file, bundled config, what it is, ComfyUI's file name)
ENCODERS = {"clip_l": ("text_encoders.clip_l.transformer.", "text_encoder", "CLIP-L text encoder", "clip_l"),
            "clip_g": ("text_encoders.clip_g.transformer.", "text_encoder_2", "CLIP-G text encoder", "clip_g"),
            "t5": ("text_encoders.t5xxl.transformer.", "text_encoder_3", "T5-XXL encoder", "t5xxl_fp16")}
VARIANTS = {"transformer_large": "SD3.5 Large", "transformer": "SD3.5 Medium",
            "transformer_sd3_medium": "SD3 Medium"}
_REPOS = ("stabilityai/stable-diffusion-3.5-large", "stabilityai/stable-diffusion-3.5-medium",
          "stabilityai/stable-diffusion-3-medium-diffusers")
HF_CACHE = [[(r, "tokenizer") for r in _REPOS] + [("openai/clip-vit-large-patch14", "")],
            [(r, "tokenizer_2") for r in _REPOS] + [("laion/CLIP-ViT-bigG-14-laion2B-39B-b160k", "")],
            [(r, "tokenizer_3") for r in _REPOS] + [("google/t5-v1_1-xxl", "")]]


def _meta_transformer(config: dict):
    from diffusers import SD3Transformer2DModel
    with weights_on_meta():
        return SD3Transformer2DModel.from_config(config)


def expected_original(config: dict) -> dict[str, tuple]:
    """Original-layout weight name -> shape of the transformer `config` describes (meta device)."""
    return dict(_expected(json.dumps(config, sort_keys=True)))


@lru_cache(maxsize=8)
def _expected(config_json: str) -> tuple:
    import torch
    from diffusers import SD3Transformer2DModel
    config = json.loads(config_json)
    with torch.device("meta"):
        model = SD3Transformer2DModel.from_config(config)
    return tuple((k, tuple(v.shape)) for k, v in to_original(model.state_dict(), config).items())


def pick_config(shapes: dict[str, tuple], metadata: dict[str, str]) -> tuple[dict, str]:
    """(transformer config, what it is): the file's own, else the bundled one its shapes fit best."""
    if META_CONFIG in metadata:
        return own_config(metadata, {}), "SD3 transformer of this size"
    best, best_score = "transformer_large", -1
    for name in VARIANTS:
        expected = expected_original(bundled("sd3", f"{name}/config.json"))
        score = sum(tuple(shapes.get(k, ())) == s for k, s in expected.items()) - 10 * len(set(shapes) - set(expected))
        if score > best_score:
            best, best_score = name, score
    return bundled("sd3", f"{best}/config.json"), f"{VARIANTS[best]} transformer"


def load_transformer(path: Path, shapes: dict, metadata: dict):
    prefix = PREFIX if any(k.startswith(PREFIX) for k in shapes) else ""
    own = {k[len(prefix):]: v for k, v in shapes.items()
           if k.startswith(prefix) and not k.startswith((VAE_PREFIX, "text_encoders."))}
    config, what = pick_config(own, metadata)
    check("model.path", path, own, expected_original(config), what)
    model = _meta_transformer(config)
    try:
        state = from_original(read_prefixed(path, prefix, keys=set(expected_original(config))))
    except (KeyError, RuntimeError, ValueError) as e:
        raise ConfigError(f"model.path: {path.name} is not an {what} ({e})") from None
    load_into("model.path", path, model, state)
    return model


def load_vae(spec: str, path: Path, shapes: dict, metadata: dict):
    """model.vae if given (a file or folder), else the autoencoder inside model.path."""
    option, source = "model.path", path
    if spec:
        source, option = Path(spec).expanduser(), "model.vae"
        if source.is_dir():
            from ..sd.loader import _load_vae
            return _load_vae(str(source), None)
        shapes, metadata = header(option, source)
        config = own_config(metadata, bundled("sd3", "vae/config.json"))
    elif embedded_vae_prefix(shapes) is None:
        raise ConfigError(f"model.vae: {path.name} holds no autoencoder (no {VAE_PREFIX} weights); give the SD3 VAE "
                          "(a diffusers vae folder or a single file)")
    else:
        config = own_config(metadata, bundled("sd3", "vae/config.json"), META_CONFIG + ".vae")
    what = "16-channel SD3 autoencoder" if config.get("latent_channels") == 16 else "autoencoder of this size"
    return load_original_vae(option, source, shapes, config, what)


def _clip_state_names(state: dict) -> dict:
    """transformers 5's flattened CLIPTextModel names (no `text_model.`) under the WithProjection names."""
    if any(k.startswith("text_model.") for k in state):
        return state
    return {(k if k == "text_projection.weight" else "text_model." + k): v for k, v in state.items()}


def load_text_encoder(option: str, given: str, path: Path, shapes: dict, metadata: dict):
    """model.<option> if given, else the encoder inside model.path; None for a T5 found nowhere."""
    import torch
    from transformers import CLIPTextConfig, CLIPTextModelWithProjection, T5Config, T5EncoderModel
    prefix, config_name, what, comfy = ENCODERS[option]
    if given:
        source = Path(given).expanduser()
        shapes, metadata = header(f"model.{option}", source)
        meta_key, prefixes = META_CONFIG, (prefix, "cond_stage_model.transformer.", "")
    elif any(k.startswith(prefix) for k in shapes):
        source, meta_key, prefixes = path, f"{META_CONFIG}.{option}", (prefix,)
    elif option == "t5":
        return None
    else:
        raise ConfigError(f"model.{option}: {path.name} holds no {what}; give its file (ComfyUI's "
                          f"models/clip/{comfy}.safetensors)")
    prefix = next(p for p in prefixes if not p or any(k.startswith(p) for k in shapes))
    own = meta_key in metadata  # this project's export: its own config and CLIP-L projection
    config = own_config(metadata, bundled("sd3", f"{config_name}/config.json"), meta_key)
    is_t5 = option == "t5"
    with weights_on_meta():
        model = T5EncoderModel(T5Config(**config)) if is_t5 else CLIPTextModelWithProjection(CLIPTextConfig(**config))
    projection = "text_projection.weight"
    skip = {"encoder.embed_tokens.weight"} if is_t5 else ({projection} if option == "clip_l" and not own else set())
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()
                if not k.endswith("position_ids") and k not in skip}
    names = {k[len(prefix):]: v for k, v in shapes.items() if k.startswith(prefix)}
    if not is_t5:
        names = _clip_state_names(names)

    def convert(state: dict) -> dict:
        state = {k: v for k, v in (state if is_t5 else _clip_state_names(state)).items() if k in expected}
        if option == "clip_l" and not own:  # SD3 uses CLIP-L's pooled output unprojected
            state[projection] = torch.eye(config["hidden_size"])
        return state
    load_checked(f"model.{option}", source, model, what, names, expected, convert, skip=skip, prefix=prefix)
    if is_t5:
        model.encoder.embed_tokens = model.shared
    return model


def load_sd3_files(family, src: Path, *, vae: str, tokenizer: str, files: dict[str, str]) -> LoadedModel:
    from diffusers import FlowMatchEulerDiscreteScheduler
    shapes, metadata = header("model.path", src)
    transformer = load_transformer(src, shapes, metadata)
    encoders = [load_text_encoder(o, files.get(o, ""), src, shapes, metadata) for o in ENCODERS]
    encoders = [e for e in encoders if e is not None]
    autoencoder = load_vae(vae, src, shapes, metadata)
    subs = ("tokenizer", "tokenizer_2", "tokenizer_3")[:len(encoders)]
    tokenizers = find_tokenizers(tokenizer, subs, HF_CACHE, "SD3")
    scheduler = FlowMatchEulerDiscreteScheduler.from_config(bundled("sd3", "scheduler/scheduler_config.json"))
    return LoadedModel(family=family, denoiser=transformer, vae=autoencoder, text_encoders=encoders,
                       tokenizers=tokenizers, noise_scheduler=scheduler, prediction_type="flow", source=str(src),
                       vae_scale_factor=2 ** (len(autoencoder.config.block_out_channels) - 1),
                       scheduler_config=dict(scheduler.config))


def _config_json(module) -> str:
    c = module.config
    c = c.to_dict() if hasattr(c, "to_dict") else dict(c)
    return json.dumps({k: v for k, v in c.items() if not k.startswith("_")})


def component_metadata(model) -> dict[str, str]:
    """The configs an all-in-one file of `model` carries (its own sizes load back)."""
    out = {META_CONFIG: _config_json(model.denoiser), f"{META_CONFIG}.vae": _config_json(model.vae)}
    for option, encoder in zip(ENCODERS, model.text_encoders):
        out[f"{META_CONFIG}.{option}"] = _config_json(encoder)
    return out


def clip_file_state(encoder) -> dict:
    """A CLIPTextModelWithProjection as ComfyUI's clip_l / clip_g.safetensors (and the SD3 release's
    text_encoders/ files) hold it: transformers 4's names, `text_model.…` and `text_projection.weight`
    (the Linear's [out, in], which ComfyUI transposes on load), no position ids."""
    state = {k: v.detach() for k, v in encoder.state_dict().items() if not k.endswith("position_ids")}
    return _clip_state_names(state)


def save_clip_file(encoder, out_file: Path, dtype=None) -> Path:
    """One CLIP text encoder as its own file (clip_file_state), written atomically, its config in the
    metadata: `model.clip_l` / `model.clip_g` load it back with its projection, at any size."""
    import os
    from safetensors.torch import save_file
    state = clip_file_state(encoder)
    if any("lora_" in k or ".base_layer." in k for k in state):
        raise ValueError("the text encoder still has adapter layers; merge them before export")
    if dtype is not None:
        state = {k: v.to(dtype) for k, v in state.items()}
    path = Path(out_file)
    tmp = path.with_name(path.name + ".partial")
    save_file({k: v.contiguous() for k, v in state.items()}, str(tmp),
              metadata={"format": "pt", META_CONFIG: _config_json(encoder)})
    os.replace(tmp, path)
    return path
