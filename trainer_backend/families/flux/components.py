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
import os
from pathlib import Path

from ...errors import ConfigError
from ..base import LoadedModel

META_CONFIG = "sd_studio.config"  # a component's own config (JSON), written by this project's exports
CLIP_PREFIXES = ("text_encoders.clip_l.transformer.", "cond_stage_model.transformer.", "text_model.")
T5_PREFIXES = ("text_encoders.t5xxl.transformer.",)
# (repo, subfolder) looked up in the local Hugging Face cache only, per tokenizer slot
HF_CACHE = [[("black-forest-labs/FLUX.1-dev", "tokenizer"), ("black-forest-labs/FLUX.1-schnell", "tokenizer"),
             ("openai/clip-vit-large-patch14", "")],
            [("black-forest-labs/FLUX.1-dev", "tokenizer_2"), ("black-forest-labs/FLUX.1-schnell", "tokenizer_2"),
             ("google/t5-v1_1-xxl", "")]]


def _bundled(name: str) -> dict:
    from ..sd.loader import ASSETS_CONFIGS
    path = ASSETS_CONFIGS / "flux" / name
    return {k: v for k, v in json.loads(path.read_text()).items() if k != "_note"}


def _header(option: str, path: Path) -> tuple[dict[str, tuple], dict[str, str]]:
    from ..sd.single_file import read_keys_and_metadata
    if not path.is_file():
        raise ConfigError(f"{option}: {path} does not exist")
    try:
        return read_keys_and_metadata(path)
    except ConfigError as e:
        raise ConfigError(f"{option}: {str(e).split(': ', 1)[1]}") from None


def _own_config(metadata: dict[str, str], fallback: dict) -> dict:
    try:
        return json.loads(metadata[META_CONFIG]) if META_CONFIG in metadata else fallback
    except json.JSONDecodeError:
        return fallback


def _check(option: str, path: Path, shapes: dict, expected: dict, what: str) -> None:
    """Every expected weight present with its shape; else one line naming the first that is not."""
    for key, shape in expected.items():
        if key not in shapes:
            raise ConfigError(f"{option}: {path.name} is not a {what}: it has no {key}")
        if tuple(shapes[key]) != tuple(shape):
            raise ConfigError(f"{option}: {path.name} is not a {what}: {key} is {list(shapes[key])}, "
                              f"expected {list(shape)}")


def _load(option: str, path: Path, module, state: dict, skip=()) -> None:
    """Assign the file's tensors (as fp32) to a module built on the meta device."""
    import torch
    missing, _ = module.load_state_dict({k: v.to(torch.float32) for k, v in state.items()}, strict=False,
                                        assign=True)
    missing = [k for k in missing if k not in skip]
    if missing:
        raise ConfigError(f"{option}: {path.name} has no {missing[0]}")


def _weights_on_meta():
    """Parameters on the meta device (no memory, no init), buffers (position ids) real."""
    from accelerate import init_empty_weights
    return init_empty_weights(include_buffers=False)


def _strip(state: dict, prefixes: tuple[str, ...]) -> dict:
    for p in prefixes:
        if any(k.startswith(p) for k in state):
            return {k[len(p):]: v for k, v in state.items() if k.startswith(p)}
    return state


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
    from transformers import AutoTokenizer
    found = []
    for slot, sub in enumerate(("tokenizer", "tokenizer_2")):
        candidates = [Path(folder).expanduser() / sub] if folder else []
        candidates += _hf_cache(slot)
        tok = None
        for c in candidates:
            if c.is_dir() and any((c / f).is_file() for f in ("tokenizer.json", "vocab.json", "spiece.model")):
                tok = AutoTokenizer.from_pretrained(str(c), local_files_only=True)
                break
        if tok is None:
            raise ConfigError("model.tokenizer: Flux single files hold no tokenizers; set model.tokenizer to a Flux "
                              f"diffusers folder (with tokenizer/ and tokenizer_2/); no {sub}/ found"
                              + (f" in {folder}" if folder else " (and none in the Hugging Face cache)"))
        found.append(tok)
    return found


def _hf_cache(slot: int) -> list[Path]:
    from huggingface_hub import try_to_load_from_cache
    cache_dir = os.environ.get("HF_HUB_CACHE") or (
        os.path.join(os.environ["HF_HOME"], "hub") if os.environ.get("HF_HOME") else None)
    out = []
    for repo, sub in HF_CACHE[slot]:
        hit = try_to_load_from_cache(repo, f"{sub}/tokenizer_config.json" if sub else "tokenizer_config.json",
                                     cache_dir=cache_dir)
        if isinstance(hit, str):
            out.append(Path(hit).parent)
    return out


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
