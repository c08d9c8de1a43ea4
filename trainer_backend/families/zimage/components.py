"""Z-Image from the separate files ComfyUI users keep, offline: the transformer (`model.path`, e.g.
models/diffusion_models/z_image_turbo_bf16.safetensors, in the original layout with fused qkv, or in
diffusers' names), the Qwen3-4B text encoder (`model.text_encoder`, models/text_encoders/qwen_3_4b.safetensors)
and the autoencoder (`model.vae`, FLUX.1's models/vae/ae.safetensors).

Each file's architecture comes from the bundled full-size configs (assets/model_configs/zimage/), or from
the config a file written by this project carries in its metadata (tiny and custom sizes), and every file
is checked key by key before anything loads (one line naming the option, the file and the first key that
does not fit; families/component_files.py has the helpers). The tokenizer is not in these files: it comes
from `model.tokenizer` (a Z-Image diffusers folder with tokenizer/, or a Qwen3 tokenizer folder) or the
local Hugging Face cache.
"""
from __future__ import annotations

import json
from pathlib import Path

from ...errors import ConfigError
from ..base import LoadedModel
from ..component_files import bundled as _bundled, find_qwen3_tokenizer, header as _header, load_checked
from ..component_files import own_config as _own_config, strip as _strip, weights_on_meta as _weights_on_meta
from .single_file import from_original, to_original

QWEN3_PREFIXES = ("text_encoders.qwen3_4b.transformer.model.", "qwen3_4b.transformer.model.", "model.")
HF_CACHE = [("Tongyi-MAI/Z-Image-Turbo", "tokenizer"), ("Tongyi-MAI/Z-Image", "tokenizer"), ("Qwen/Qwen3-4B", "")]


def bundled(name: str) -> dict:
    return _bundled("zimage", name)


def is_zimage_transformer(shapes: dict) -> bool:
    """A Z-Image transformer file, original or diffusers names, with or without ComfyUI's prefix."""
    keys = {k.removeprefix("model.diffusion_model.") for k in shapes}
    return "cap_pad_token" in keys and "x_pad_token" in keys and (
        "noise_refiner.0.attention.qkv.weight" in keys or "noise_refiner.0.attention.to_q.weight" in keys)


def load_transformer(path: Path):
    from diffusers import ZImageTransformer2DModel
    shapes, metadata = _header("model.path", path)
    shapes = {k.removeprefix("model.diffusion_model."): v for k, v in shapes.items()}
    config = _own_config(metadata, bundled("transformer/config.json"))
    with _weights_on_meta():
        model = ZImageTransformer2DModel.from_config(config)
    like = model.state_dict()
    diffusers_names = "noise_refiner.0.attention.to_q.weight" in shapes
    expected = {k: v.shape for k, v in (like if diffusers_names else to_original(like)).items()}

    def convert(state: dict) -> dict:
        state = {k.removeprefix("model.diffusion_model."): v for k, v in state.items()}
        return state if diffusers_names else from_original(state)
    load_checked("model.path", path, model, "Z-Image transformer of this size", shapes, expected, convert)
    return model


def load_qwen3(path_str: str):
    from transformers import Qwen3Config, Qwen3Model
    if not path_str:
        raise ConfigError("model.text_encoder: a Z-Image transformer file holds no text encoder; give the Qwen3-4B file "
                          "(ComfyUI's models/text_encoders/qwen_3_4b.safetensors)")
    path = Path(path_str).expanduser()
    shapes, metadata = _header("model.text_encoder", path)
    config = Qwen3Config(**_own_config(metadata, bundled("text_encoder/config.json")))
    with _weights_on_meta():
        model = Qwen3Model(config)
    expected = {k: v.shape for k, v in model.state_dict().items()}
    shapes = _strip(shapes, QWEN3_PREFIXES)
    load_checked("model.text_encoder", path, model, "Qwen3 text encoder of Z-Image's size", shapes, expected,
                 lambda state: {k: v for k, v in _strip(state, QWEN3_PREFIXES).items() if k in expected})
    return model


def load_vae(path_str: str):
    import tempfile

    import torch
    from diffusers import AutoencoderKL
    if not path_str:
        raise ConfigError("model.vae: a Z-Image transformer file holds no autoencoder; give the VAE file "
                          "(FLUX.1's ae.safetensors, ComfyUI's models/vae/ae.safetensors) or a diffusers VAE folder")
    path = Path(path_str).expanduser()
    if path.is_dir():
        from ..sd.loader import _load_vae
        return _load_vae(str(path), None)
    _, metadata = _header("model.vae", path)
    config = _own_config(metadata, bundled("vae/config.json"))
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "vae").mkdir()
        (Path(tmp) / "vae" / "config.json").write_text(json.dumps(config))
        try:
            vae = AutoencoderKL.from_single_file(str(path), config=tmp, subfolder="vae", local_files_only=True,
                                                 dtype=torch.float32)
        except (OSError, ValueError, KeyError, TypeError, RuntimeError) as e:
            from ..sd.loader import _first_line
            raise ConfigError(f"model.vae: {path.name} is not Z-Image's (FLUX.1) autoencoder ({_first_line(e)})") from None
    if vae.config.latent_channels != 16:
        raise ConfigError(f"model.vae: {path.name} has {vae.config.latent_channels} latent channels; Z-Image's has 16")
    return vae


def load_tokenizer(folder: str):
    """The Qwen tokenizer from model.tokenizer (a Z-Image folder's tokenizer/, or the folder itself) or the
    local Hugging Face cache."""
    return find_qwen3_tokenizer(folder, HF_CACHE, "Z-Image")


def load_zimage_files(family, src: Path, *, vae: str, tokenizer: str, files: dict[str, str]) -> LoadedModel:
    from diffusers import FlowMatchEulerDiscreteScheduler
    transformer = load_transformer(src)
    text_encoder = load_qwen3(files.get("text_encoder", ""))
    if text_encoder.config.hidden_size != transformer.config.cap_feat_dim:
        raise ConfigError(f"model.text_encoder: the text encoder is {text_encoder.config.hidden_size} wide; this transformer "
                          f"takes {transformer.config.cap_feat_dim}-wide captions")
    autoencoder = load_vae(vae)
    tok = load_tokenizer(tokenizer)
    noise_scheduler = FlowMatchEulerDiscreteScheduler.from_config(bundled("scheduler/scheduler_config.json"))
    return LoadedModel(family=family, denoiser=transformer, vae=autoencoder, text_encoders=[text_encoder],
                       tokenizers=[tok], noise_scheduler=noise_scheduler, prediction_type="flow", source=str(src),
                       vae_scale_factor=2 ** (len(autoencoder.config.block_out_channels) - 1),
                       scheduler_config=dict(noise_scheduler.config))
