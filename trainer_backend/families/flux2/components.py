"""Flux.2 from the separate files ComfyUI users keep, offline: the transformer in the original layout
(`model.path`, e.g. `flux-2-klein-base-4b.safetensors` or `flux2-dev.safetensors`; fp8 files
with scales read as weight × scale), the text
encoder (`model.text_encoder`: Klein's Qwen3, `qwen_3_4b.safetensors`, transformers' key names; dev's
Mistral Small 3, `mistral_3_small_flux2_bf16.safetensors`, read by mistral_file.py) and the autoencoder (`model.vae`,
`flux2-vae.safetensors` in the original layout, or a diffusers VAE folder or file).

Architectures: the transformer's is read from the file's own shapes (block counts, widths, heads), so
Klein 4B, 9B and dev all load; the text encoder's is Qwen3-4B or Qwen3-8B (assets/model_configs/flux2/)
chosen by its width; a file written by this project carries its own config (`sd_studio.config`). Every
file is checked key by key before anything loads: a wrong or truncated file is refused in one line
naming the option, the file and the first key that does not fit. Tokenizers come from `model.tokenizer`
(a Flux.2 diffusers folder, or a Qwen or FLUX.2-dev tokenizer folder) or the local Hugging Face cache.
"""
from __future__ import annotations

import math
from pathlib import Path

from ...errors import ConfigError
from ..base import LoadedModel
from ..component_files import bundled as _bundled, check as _check, find_qwen3_tokenizer, header as _header
from ..component_files import dequantize_fp8, load_checked, own_config as _own_config, refuse_packed
from ..component_files import strip as _strip
from ..component_files import weights_on_meta as _weights_on_meta
from .original_keys import (from_original, normalise_vae_keys, strip_prefix, to_original, vae_from_original,
                            vae_to_original)

QWEN_PREFIXES = ("text_encoders.qwen3_4b.transformer.", "text_encoders.qwen3_8b.transformer.", "transformer.")
QWEN_SIZES = {2560: "text_encoder-qwen3-4b.json", 4096: "text_encoder-qwen3-8b.json"}
HF_CACHE = [("black-forest-labs/FLUX.2-klein-base-4B", "tokenizer"), ("black-forest-labs/FLUX.2-klein-4B", "tokenizer"),
            ("black-forest-labs/FLUX.2-klein-base-9B", "tokenizer"), ("black-forest-labs/FLUX.2-klein-9B", "tokenizer"),
            ("Qwen/Qwen3-4B", ""), ("Qwen/Qwen3-8B", "")]


def _own(metadata: dict[str, str], fallback: dict, marker: str) -> dict:
    """The file's own config (this project's exports) when it is one of this kind (has `marker`)."""
    own = _own_config(metadata, {})
    return own if marker in own else fallback


def bundled(name: str) -> dict:
    return _bundled("flux2", name)


def transformer_config(shapes: dict[str, tuple], metadata: dict[str, str]) -> dict:
    """The Flux2Transformer2DModel config of an original-layout file, from its shapes."""
    def count(prefix: str) -> int:
        return len({k.split(".")[1] for k in shapes if k.startswith(prefix)})
    try:
        inner, in_channels = shapes["img_in.weight"]
        head_dim = shapes["double_blocks.0.img_attn.norm.query_norm.scale"][0]
        config = {**bundled("transformer-klein-4b.json"), "in_channels": in_channels,
                  "joint_attention_dim": shapes["txt_in.weight"][1], "num_layers": count("double_blocks."),
                  "num_single_layers": count("single_blocks."), "attention_head_dim": head_dim,
                  "num_attention_heads": inner // head_dim,
                  "mlp_ratio": shapes["double_blocks.0.img_mlp.0.weight"][0] / (2 * inner),
                  "timestep_guidance_channels": shapes["time_in.in_layer.weight"][1],
                  "guidance_embeds": "guidance_in.in_layer.weight" in shapes}
    except KeyError as e:
        raise ConfigError(f"model.path: not a Flux.2 transformer file: it has no {e.args[0]}") from None
    return _own(metadata, config, "num_single_layers")


def load_transformer(path: Path):
    from diffusers import Flux2Transformer2DModel
    shapes, metadata = _header("model.path", path)
    shapes = strip_prefix(shapes)
    config = transformer_config(shapes, metadata)
    if sum(config["axes_dims_rope"]) != config["attention_head_dim"]:
        raise ConfigError(f"model.path: {path.name} has {config['attention_head_dim']}-wide heads; the Flux.2 "
                          "architectures known here have 128")
    with _weights_on_meta():
        model = Flux2Transformer2DModel.from_config(config)
    like = model.state_dict()
    refuse_packed("model.path", path, "as Black Forest Labs publish it")
    load_checked("model.path", path, model, "Flux.2 transformer of this size", shapes,
                 {k: v.shape for k, v in to_original(like, config).items()},
                 lambda state: from_original(dequantize_fp8(strip_prefix(state)), like, config))
    return model


def load_text_encoder(path_str: str):
    from transformers import Qwen3Config, Qwen3ForCausalLM
    if not path_str:
        raise ConfigError("model.text_encoder: a Flux.2 single file holds no text encoder; give the Qwen3 file "
                          "(ComfyUI's models/text_encoders/qwen_3_4b.safetensors for Klein 4B, qwen_3_8b for 9B)")
    path = Path(path_str).expanduser()
    shapes, metadata = _header("model.text_encoder", path)
    shapes = _strip(shapes, QWEN_PREFIXES)
    width = shapes.get("model.embed_tokens.weight", (0, 0))[1]
    own = _own(metadata, {}, "num_hidden_layers")
    if not own and width not in QWEN_SIZES:
        raise ConfigError(f"model.text_encoder: {path.name} is not a Qwen3-4B or Qwen3-8B text encoder "
                          f"(no model.embed_tokens.weight of width 2560 or 4096)")
    config = Qwen3Config(**(own or bundled(QWEN_SIZES[width])))
    with _weights_on_meta():
        model = Qwen3ForCausalLM(config)
    head = "lm_head.weight"  # only for logits, which the encoding never computes: tied when the file has none
    expected = {k: v.shape for k, v in model.state_dict().items() if k != head}
    refuse_packed("model.text_encoder", path, "qwen_3_4b.safetensors / qwen_3_8b.safetensors")
    load_checked("model.text_encoder", path, model, "Qwen3 text encoder of this size", shapes, expected,
                 lambda state: {k: v for k, v in dequantize_fp8(_strip(state, QWEN_PREFIXES)).items()
                                if k in expected or k == head},  # fp8 files (qwen_3_8b_fp8mixed): weight × scale
                 skip=(head,))
    if head not in shapes:  # shapes: the file's names as stripped for loading
        model.lm_head.weight = model.model.embed_tokens.weight
    return model


def load_vae(path_str: str):
    import torch
    from diffusers import AutoencoderKLFlux2
    if not path_str:
        raise ConfigError("model.vae: a Flux.2 single file holds no autoencoder; give the VAE file "
                          "(ComfyUI's models/vae/flux2-vae.safetensors) or a diffusers VAE folder")
    path = Path(path_str).expanduser()
    if path.is_dir():
        try:
            sub = "vae" if (path / "vae" / "config.json").is_file() else None
            return AutoencoderKLFlux2.from_pretrained(str(path), subfolder=sub, local_files_only=True,
                                                      dtype=torch.float32)
        except (OSError, ValueError) as e:
            raise ConfigError(f"model.vae: {path} is not a Flux.2 VAE folder ({str(e).splitlines()[0]})") from None
    from safetensors.torch import load_file
    shapes, metadata = _header("model.vae", path)
    shapes = normalise_vae_keys(shapes)
    config = _own(metadata, bundled("vae.json"), "latent_channels")
    with _weights_on_meta():
        vae = AutoencoderKLFlux2.from_config(config)
    like = vae.state_dict()
    needed = {k: v for k, v in like.items() if not k.endswith("num_batches_tracked")}
    if any(k.startswith("encoder.down_blocks.") for k in shapes):  # a diffusers-layout file
        expected = {k: v.shape for k, v in needed.items()}
    else:
        expected = {k: v.shape for k, v in vae_to_original(needed, config).items()}
        expected = {k: (shapes[k] if ".attn_1." in k and k in shapes and math.prod(shapes[k]) == math.prod(s)
                        else s) for k, s in expected.items()}  # attention as 1x1 convolutions or linear: either
    _check("model.vae", path, shapes, expected, "Flux.2 autoencoder")
    state = vae_from_original(load_file(str(path)), like, config)
    missing, _ = vae.load_state_dict({k: v.to(torch.float32) for k, v in state.items()}, strict=False, assign=True)
    missing = [k for k in missing if not k.endswith("num_batches_tracked")]
    if missing:
        raise ConfigError(f"model.vae: {path.name} has no weight for {missing[0]}")
    return vae


def load_tokenizer(folder: str):
    """The Qwen tokenizer from model.tokenizer (a Flux.2 folder with tokenizer/, or the tokenizer folder
    itself) or the local Hugging Face cache."""
    return find_qwen3_tokenizer(folder, HF_CACHE, "Flux.2")


def load_flux2_files(family, src: Path, *, vae: str, tokenizer: str, files: dict[str, str]) -> LoadedModel:
    from diffusers import FlowMatchEulerDiscreteScheduler
    transformer = load_transformer(src)
    width = transformer.config.joint_attention_dim
    if transformer.config.guidance_embeds:  # dev: Mistral Small 3 (mistral_file.py)
        from .mistral_file import find_mistral_tokenizer, load_mistral_text_encoder
        text_encoder = load_mistral_text_encoder(files.get("text_encoder", ""))
        hidden = text_encoder.config.text_config.hidden_size
        if 3 * hidden != width:
            raise ConfigError(f"model.text_encoder: a {hidden}-wide Mistral does not fit this transformer (it "
                              f"takes 3 x {width // 3}: Flux.2 dev Mistral Small 3, 5120)")
        tokenizers = [find_mistral_tokenizer(tokenizer)]
    else:
        text_encoder = load_text_encoder(files.get("text_encoder", ""))
        if 3 * text_encoder.config.hidden_size != width:
            raise ConfigError(f"model.text_encoder: a {text_encoder.config.hidden_size}-wide Qwen3 does not fit "
                              f"this transformer (it takes 3 x {width // 3}: Klein 4B Qwen3-4B, Klein 9B Qwen3-8B)")
        tokenizers = [load_tokenizer(tokenizer)]
    autoencoder = load_vae(vae)
    scheduler = FlowMatchEulerDiscreteScheduler.from_config(bundled("scheduler.json"))
    return LoadedModel(family=family, denoiser=transformer, vae=autoencoder, text_encoders=[text_encoder],
                       tokenizers=tokenizers, noise_scheduler=scheduler, prediction_type="flow",
                       source=str(src), vae_scale_factor=2 ** (len(autoencoder.config.block_out_channels) - 1),
                       scheduler_config=dict(scheduler.config))
