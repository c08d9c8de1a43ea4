"""Qwen-Image from the separate files ComfyUI users keep, offline: the transformer (`model.path`,
e.g. `qwen_image_bf16.safetensors`: diffusers' own key names, optionally under
`model.diffusion_model.`), the Qwen2.5-VL text encoder (`model.text_encoder`, e.g.
`qwen_2.5_vl_7b.safetensors`: transformers' key names, 4.x or 5.x layout) and the autoencoder
(`model.vae`, `qwen_image_vae.safetensors`: the original Wan 2.1 layout, or a diffusers VAE folder).

Architectures come from the bundled full-size configs (assets/model_configs/qwen_image/), or from
the config a file written by this project carries in its metadata (`sd_studio.config`: tiny and
custom sizes). Every file is checked key by key before anything loads: a wrong or truncated file
is one line naming the option, the file and the first key that does not fit. Tokenizer (and the
edit model's processor) are not in these files: `model.tokenizer` names a Qwen-Image(-Edit)
diffusers folder that has them.
"""
from __future__ import annotations

from pathlib import Path

from ...errors import ConfigError
from ..component_files import bundled as _bundled, check as _check, header as _header, load_checked, load_into
from ..component_files import own_config as _own_config, strip as _strip, weights_on_meta as _on_meta

TRANSFORMER_PREFIXES = ("model.diffusion_model.", "diffusion_model.")
TEXT_ENCODER_PREFIXES = ("text_encoders.qwen25_7b.transformer.",)
_MARKERS = ("transformer_blocks.0.img_mod.1.weight", "txt_norm.weight", "img_in.weight")


def bundled(name: str) -> dict:
    return _bundled("qwen_image", name)


def is_transformer_file(shapes: dict) -> bool:
    keys = _strip(shapes, TRANSFORMER_PREFIXES)
    return all(m in keys for m in _MARKERS)


def export_transformer(transformer, out_file, dtype=None, metadata: dict[str, str] | None = None) -> Path:
    """The transformer alone, in the key layout ComfyUI loads (diffusers' names), written atomically."""
    from ..component_files import save_transformer_file
    return save_transformer_file(transformer, out_file, None, dtype, metadata)


def load_transformer_file(path, like):
    """A copy of the transformer `like` with the weights of a single file."""
    import copy
    from safetensors.torch import load_file
    model = copy.deepcopy(like)
    model.load_state_dict(_strip(load_file(str(path)), TRANSFORMER_PREFIXES))
    return model


def load_transformer(path: Path):
    from diffusers import QwenImageTransformer2DModel
    shapes, metadata = _header("model.path", path)
    config = _own_config(metadata, bundled("transformer/config.json"))
    with _on_meta():
        model = QwenImageTransformer2DModel.from_config(config)
    expected = {k: v.shape for k, v in model.state_dict().items()}
    load_checked("model.path", path, model, "Qwen-Image transformer of this size", _strip(shapes, TRANSFORMER_PREFIXES),
                 expected, lambda state: _strip(state, TRANSFORMER_PREFIXES))
    return model


def text_encoder_state(state: dict) -> dict:
    """transformers 4's Qwen2.5-VL names (model.layers…, visual…) -> transformers 5's (model.language_model…)."""
    state = _strip(state, TEXT_ENCODER_PREFIXES)
    out = {}
    for k, v in state.items():
        if k.startswith("model.") and not k.startswith(("model.language_model.", "model.visual.")):
            k = "model.language_model." + k[len("model."):]
        elif k.startswith("visual."):
            k = "model." + k
        out[k] = v
    return out


def load_text_encoder(path_str: str):
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration
    if not path_str:
        raise ConfigError("model.text_encoder: a Qwen-Image single file holds no text encoder; give the Qwen2.5-VL file "
                          "(ComfyUI's models/text_encoders/qwen_2.5_vl_7b.safetensors)")
    path = Path(path_str).expanduser()
    shapes, metadata = _header("model.text_encoder", path)
    config = Qwen2_5_VLConfig(**_own_config(metadata, bundled("text_encoder/config.json")))
    with _on_meta():
        model = Qwen2_5_VLForConditionalGeneration(config)
    expected = {k: v.shape for k, v in model.state_dict().items()}
    optional = {"lm_head.weight"}  # text-encoder files often leave the language-model head out

    def convert(state: dict) -> dict:
        state = text_encoder_state(state)
        if "lm_head.weight" not in state:
            import torch
            state["lm_head.weight"] = torch.zeros(expected["lm_head.weight"])
        return {k: v for k, v in state.items() if k in expected}
    load_checked("model.text_encoder", path, model, "Qwen2.5-VL text encoder", text_encoder_state(shapes),
                 {k: v for k, v in expected.items() if k not in optional}, convert)
    return model


def vae_state(state: dict) -> dict:
    """A VAE file in the original Wan 2.1 layout -> diffusers' names (diffusers' own converter)."""
    from diffusers.loaders.single_file_utils import convert_wan_vae_to_diffusers
    if any(k.startswith("encoder.down_blocks.") for k in state):  # already diffusers' names
        return state
    return convert_wan_vae_to_diffusers(state)


def load_vae(path_str: str):
    import torch
    from diffusers import AutoencoderKLQwenImage
    if not path_str:
        raise ConfigError("model.vae: a Qwen-Image single file holds no autoencoder; give the VAE file "
                          "(ComfyUI's models/vae/qwen_image_vae.safetensors) or a diffusers VAE folder")
    path = Path(path_str).expanduser()
    if path.is_dir():
        sub = path / "vae" if (path / "vae" / "config.json").is_file() else path
        try:
            return AutoencoderKLQwenImage.from_pretrained(str(sub), local_files_only=True, dtype=torch.float32)
        except (OSError, ValueError, TypeError) as e:
            raise ConfigError(f"model.vae: {path} is not a Qwen-Image autoencoder folder ({e})") from None
    from safetensors.torch import load_file
    shapes, metadata = _header("model.vae", path)
    config = _own_config(metadata, bundled("vae/config.json"))
    with _on_meta():
        vae = AutoencoderKLQwenImage.from_config(config)
    expected = {k: v.shape for k, v in vae.state_dict().items()}
    state = vae_state(load_file(str(path)))
    _check("model.vae", path, {k: tuple(v.shape) for k, v in state.items()}, expected, "Qwen-Image autoencoder")
    load_into("model.vae", path, vae, {k: v for k, v in state.items() if k in expected})
    return vae


def load_tokenizer(folder: str, edit: bool):
    """The tokenizer (the edit model: its processor) from a Qwen-Image diffusers folder (model.tokenizer)."""
    from transformers import AutoTokenizer
    from .text import load_processor
    root = Path(folder).expanduser() if folder else None
    sub = "processor" if edit else "tokenizer"
    if root is None or not (root / sub).is_dir():
        raise ConfigError(f"model.tokenizer: Qwen-Image single files hold no tokenizer; set model.tokenizer to a "
                          f"{'Qwen-Image-Edit' if edit else 'Qwen-Image'} diffusers folder (with {sub}/)"
                          + (f"; {root} has no {sub}/" if root else ""))
    if edit:
        return load_processor(root / sub)
    return AutoTokenizer.from_pretrained(str(root / sub), local_files_only=True)


def load_qwen_files(family, src: Path, *, vae: str, tokenizer: str, files: dict[str, str]):
    transformer = load_transformer(src)
    text_encoder = load_text_encoder(files.get("text_encoder", ""))
    autoencoder = load_vae(vae)
    tok = load_tokenizer(tokenizer, family.edit)
    return family.loaded(src, transformer, autoencoder, text_encoder, tok, bundled("scheduler/scheduler_config.json"))
