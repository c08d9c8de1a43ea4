"""The Z-Image transformer in its original layout (the published `z_image_turbo_bf16.safetensors`
ComfyUI loads from models/diffusion_models/), both directions.

The original layout fuses each attention's q, k and v into `attention.qkv` and names a few modules
differently (`attention.out`, `q_norm`/`k_norm`, `x_embedder`, `final_layer`). diffusers' own
converter (`convert_z_image_transformer_checkpoint_to_diffusers`, what `from_single_file` uses)
reads it; `to_original` writes it, and the tests check the round trip through diffusers' converter.
"""
from __future__ import annotations

import re
from pathlib import Path

import torch

# diffusers name -> original name; applied to whole key prefixes/infixes (q/k/v are fused separately)
_RENAMES = ((r"^all_x_embedder\.2-1\.", "x_embedder."), (r"^all_final_layer\.2-1\.", "final_layer."),
            (r"\.attention\.to_out\.0\.", ".attention.out."), (r"\.attention\.norm_q\.", ".attention.q_norm."),
            (r"\.attention\.norm_k\.", ".attention.k_norm."))
QKV = ("to_q", "to_k", "to_v")
META_CONFIG = "sd_studio.config"


def original_name(key: str) -> str:
    """A diffusers key (or module path + ".") in the original layout's names (q/k/v not fused)."""
    for pattern, repl in _RENAMES:
        key = re.sub(pattern, repl, key)
    return key


def to_original(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """diffusers ZImageTransformer2DModel state dict -> the original layout (q, k, v fused)."""
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        m = re.fullmatch(r"(.+\.attention)\.(to_q|to_k|to_v)\.weight", key)
        if m:
            if m.group(2) == "to_q":
                out[f"{m.group(1)}.qkv.weight"] = torch.cat([state[f"{m.group(1)}.{p}.weight"] for p in QKV], dim=0)
            continue
        out[original_name(key)] = value
    return out


def from_original(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """An original-layout file's tensors -> diffusers' names (diffusers' own converter; it also
    drops a `model.diffusion_model.` prefix and an unused `norm_final.weight`)."""
    from diffusers.loaders.single_file_utils import convert_z_image_transformer_checkpoint_to_diffusers
    return convert_z_image_transformer_checkpoint_to_diffusers(dict(state))


def export_transformer(transformer, out_file: str | Path, dtype=None, metadata: dict[str, str] | None = None) -> Path:
    """The transformer alone as an original-layout `.safetensors` file (written atomically), its
    config in the metadata (tiny and custom sizes load back without guessing)."""
    from ..component_files import save_transformer_file
    return save_transformer_file(transformer, out_file, to_original, dtype, metadata)


def load_transformer_file(path: str | Path, like):
    """A copy of the ZImageTransformer2DModel `like` with the weights of an original-layout file."""
    import copy
    from safetensors.torch import load_file
    model = copy.deepcopy(like)
    model.load_state_dict(from_original(load_file(str(path))))
    return model
