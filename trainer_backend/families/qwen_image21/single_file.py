"""Qwen-Image 2.1's transformer as one file, in the layout ComfyUI loads (diffusers' names with each
block's SwiGLU gate and up projections fused into `img_mlp.gate_up`, gate rows first, the layout
diffusers' convert_qwen_image21_transformer_checkpoint_to_diffusers reads), with the full-size
architecture from the bundled config (assets/model_configs/qwen_image21/). A file is checked key by
key before it loads: a wrong or truncated file is one line naming the option, the file and the key."""
from __future__ import annotations

from pathlib import Path

from ..component_files import bundled as _bundled, header as _header, load_checked, own_config as _own_config
from ..component_files import strip as _strip, weights_on_meta as _on_meta

TRANSFORMER_PREFIXES = ("model.diffusion_model.",)
_MARKERS = ("modulation.1.weight", "txt_in.in_layer.weight", "transformer_blocks.0.img_mlp.gate_up.weight")


def bundled(name: str) -> dict:
    return _bundled("qwen_image21", name)


def is_transformer_file(shapes: dict) -> bool:
    keys = _strip(shapes, TRANSFORMER_PREFIXES)
    return all(m in keys for m in _MARKERS)


def to_original(state: dict) -> dict:
    """diffusers' names -> ComfyUI's: gate_layer and proj fused into gate_up (gate rows first)."""
    import torch
    out = {}
    for key, value in state.items():
        if key.endswith("img_mlp.gate_layer.weight"):
            out[key.replace("gate_layer", "gate_up")] = torch.cat([value, state[key.replace("gate_layer", "proj")]])
        elif not key.endswith("img_mlp.proj.weight"):
            out[key] = value
    return out


def to_diffusers(state: dict) -> dict:
    """ComfyUI's names -> diffusers', through diffusers' own converter."""
    from diffusers.loaders.single_file_utils import convert_qwen_image21_transformer_checkpoint_to_diffusers
    return convert_qwen_image21_transformer_checkpoint_to_diffusers(dict(state))


def export_transformer(transformer, out_file, dtype=None, metadata: dict[str, str] | None = None) -> Path:
    from ..component_files import save_transformer_file
    return save_transformer_file(transformer, out_file, to_original, dtype, metadata)


def load_transformer_file(path, like):
    """A copy of the transformer `like` with the weights of a single file."""
    from ..component_files import transformer_from_file
    return transformer_from_file(path, like, to_diffusers)


def load_transformer(path: Path):
    """The transformer single file (model.path) on its own, checked key by key."""
    from diffusers import QwenImage21Transformer2DModel
    shapes, metadata = _header("model.path", path)
    config = _own_config(metadata, bundled("transformer/config.json"))
    with _on_meta():
        model = QwenImage21Transformer2DModel.from_config(config)
    expected = {k: tuple(v.shape) for k, v in to_original(model.state_dict()).items()}
    load_checked("model.path", path, model, "Qwen-Image 2.1 transformer of this size",
                 _strip(shapes, TRANSFORMER_PREFIXES), expected, to_diffusers)
    return model


def load_vae(path_str: str):
    """model.vae: a diffusers AutoencoderKLQwenImage21 folder."""
    from diffusers import AutoencoderKLQwenImage21
    from ...errors import ConfigError
    from ..sd.loader import _first_line
    try:
        return AutoencoderKLQwenImage21.from_pretrained(path_str, local_files_only=True)
    except (OSError, ValueError) as e:
        raise ConfigError(f"model.vae: cannot load {path_str} as a Qwen-Image 2.1 autoencoder folder "
                          f"({_first_line(e)})") from None
