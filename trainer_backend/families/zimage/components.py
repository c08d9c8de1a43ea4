"""Z-Image from the separate files ComfyUI users keep, offline: the transformer (`model.path`, e.g.
models/diffusion_models/z_image_turbo_bf16.safetensors, in the original layout with fused qkv, or in
diffusers' names), the Qwen3-4B text encoder (`model.qwen3`, models/text_encoders/qwen_3_4b.safetensors)
and the autoencoder (`model.vae`, FLUX.1's models/vae/ae.safetensors).

Each file's architecture comes from the bundled full-size configs (assets/model_configs/zimage/), or from
the config a file written by this project carries in its metadata (tiny and custom sizes), and every file
is checked key by key before anything loads (one line naming the option, the file and the first key that
does not fit; families/flux/components.py has the helpers). The tokenizer is not in these files: it comes
from `model.tokenizer` (a Z-Image diffusers folder with tokenizer/, or a Qwen3 tokenizer folder) or the
local Hugging Face cache.
"""
from __future__ import annotations

import json
from pathlib import Path

from ...errors import ConfigError
from ..base import LoadedModel
from ..flux.components import _check, _header, _load, _own_config, _strip, _weights_on_meta
from .single_file import from_original, to_original

QWEN3_PREFIXES = ("text_encoders.qwen3_4b.transformer.model.", "qwen3_4b.transformer.model.", "model.")
HF_CACHE = [("Tongyi-MAI/Z-Image-Turbo", "tokenizer"), ("Tongyi-MAI/Z-Image", "tokenizer"), ("Qwen/Qwen3-4B", "")]


def bundled(name: str) -> dict:
    from ..sd.loader import ASSETS_CONFIGS
    path = ASSETS_CONFIGS / "zimage" / name
    return {k: v for k, v in json.loads(path.read_text()).items() if k != "_note"}


def is_zimage_transformer(shapes: dict) -> bool:
    """A Z-Image transformer file, original or diffusers names, with or without ComfyUI's prefix."""
    keys = {k.removeprefix("model.diffusion_model.") for k in shapes}
    return "cap_pad_token" in keys and "x_pad_token" in keys and (
        "noise_refiner.0.attention.qkv.weight" in keys or "noise_refiner.0.attention.to_q.weight" in keys)


def load_transformer(path: Path):
    from diffusers import ZImageTransformer2DModel
    from safetensors.torch import load_file
    shapes, metadata = _header("model.path", path)
    shapes = {k.removeprefix("model.diffusion_model."): v for k, v in shapes.items()}
    config = _own_config(metadata, bundled("transformer/config.json"))
    with _weights_on_meta():
        model = ZImageTransformer2DModel.from_config(config)
    like = model.state_dict()
    diffusers_names = "noise_refiner.0.attention.to_q.weight" in shapes
    expected = {k: v.shape for k, v in (like if diffusers_names else to_original(like)).items()}
    _check("model.path", path, shapes, expected, "Z-Image transformer of this size")
    state = load_file(str(path))
    state = {k.removeprefix("model.diffusion_model."): v for k, v in state.items()}
    _load("model.path", path, model, state if diffusers_names else from_original(state))
    return model


def load_qwen3(path_str: str):
    from safetensors.torch import load_file
    from transformers import Qwen3Config, Qwen3Model
    if not path_str:
        raise ConfigError("model.qwen3: a Z-Image transformer file holds no text encoder; give the Qwen3-4B file "
                          "(ComfyUI's models/text_encoders/qwen_3_4b.safetensors)")
    path = Path(path_str).expanduser()
    shapes, metadata = _header("model.qwen3", path)
    config = Qwen3Config(**_own_config(metadata, bundled("text_encoder/config.json")))
    with _weights_on_meta():
        model = Qwen3Model(config)
    expected = {k: v.shape for k, v in model.state_dict().items()}
    shapes = _strip(shapes, QWEN3_PREFIXES)
    _check("model.qwen3", path, shapes, expected, "Qwen3 text encoder of Z-Image's size")
    _load("model.qwen3", path, model, {k: v for k, v in _strip(load_file(str(path)), QWEN3_PREFIXES).items()
                                       if k in expected})
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
    from transformers import AutoTokenizer
    candidates = []
    if folder:
        root = Path(folder).expanduser()
        candidates += [root / "tokenizer", root]
    candidates += _hf_cache()
    for c in candidates:
        if c.is_dir() and any((c / f).is_file() for f in ("tokenizer.json", "vocab.json")):
            return AutoTokenizer.from_pretrained(str(c), local_files_only=True)
    raise ConfigError("model.tokenizer: Z-Image single files hold no tokenizer; set model.tokenizer to a Z-Image "
                      "diffusers folder (with tokenizer/) or a Qwen3 tokenizer folder"
                      + (f"; none found in {folder}" if folder else " (none in the Hugging Face cache either)"))


def _hf_cache() -> list[Path]:
    import os

    from huggingface_hub import try_to_load_from_cache
    cache_dir = os.environ.get("HF_HUB_CACHE") or (
        os.path.join(os.environ["HF_HOME"], "hub") if os.environ.get("HF_HOME") else None)
    out = []
    for repo, sub in HF_CACHE:
        hit = try_to_load_from_cache(repo, f"{sub}/tokenizer_config.json" if sub else "tokenizer_config.json",
                                     cache_dir=cache_dir)
        if isinstance(hit, str):
            out.append(Path(hit).parent)
    return out


def load_zimage_files(family, src: Path, *, vae: str, tokenizer: str, files: dict[str, str]) -> LoadedModel:
    from diffusers import FlowMatchEulerDiscreteScheduler
    transformer = load_transformer(src)
    text_encoder = load_qwen3(files.get("qwen3", ""))
    if text_encoder.config.hidden_size != transformer.config.cap_feat_dim:
        raise ConfigError(f"model.qwen3: the text encoder is {text_encoder.config.hidden_size} wide; this transformer "
                          f"takes {transformer.config.cap_feat_dim}-wide captions")
    autoencoder = load_vae(vae)
    tok = load_tokenizer(tokenizer)
    noise_scheduler = FlowMatchEulerDiscreteScheduler.from_config(bundled("scheduler/scheduler_config.json"))
    return LoadedModel(family=family, denoiser=transformer, vae=autoencoder, text_encoders=[text_encoder],
                       tokenizers=[tok], noise_scheduler=noise_scheduler, prediction_type="flow", source=str(src),
                       vae_scale_factor=2 ** (len(autoencoder.config.block_out_channels) - 1),
                       scheduler_config=dict(noise_scheduler.config))
