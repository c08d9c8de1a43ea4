"""Ideogram 4's transformer in its original (published) layout, both directions: the names of
Comfy-Org's `ideogram4_fp8_scaled.safetensors` and Ideogram's checkpoint (458 tensors at full size:
diffusers' names with each block's q, k and v fused into `attention.qkv` and `to_out.0` called
`attention.o`; optionally under `model.diffusion_model.`). diffusers 0.42.1 has no single-file converter
for it; its LoRA converter (`_convert_non_diffusers_ideogram4_lora_to_diffusers`) reads the same module
names (qkv split in thirds, o -> to_out.0), and the tests check both directions on the tiny model and the
key set on the full-size one."""
from __future__ import annotations

import re
from pathlib import Path

PREFIXES = ("model.diffusion_model.", "diffusion_model.")
_QKV = re.compile(r"(layers\.\d+\.attention)\.(to_q|to_k|to_v)\.weight")


def to_original(state: dict) -> dict:
    """diffusers Ideogram4Transformer2DModel state -> the original layout (q, k, v fused)."""
    import torch
    out = {}
    for key, value in state.items():
        m = _QKV.fullmatch(key)
        if m:
            if m.group(2) == "to_q":
                out[f"{m.group(1)}.qkv.weight"] = torch.cat([state[f"{m.group(1)}.{p}.weight"]
                                                             for p in ("to_q", "to_k", "to_v")])
            continue
        out[key.replace(".attention.to_out.0.", ".attention.o.")] = value
    return out


def from_original_one(name: str, value) -> dict:
    """One original-layout tensor -> its diffusers name(s): a fused qkv splits in thirds (rows)."""
    for p in PREFIXES:
        name = name.removeprefix(p)
    if name.endswith(".attention.qkv.weight"):
        base = name[: -len("qkv.weight")]
        q, k, v = value.chunk(3, dim=0)
        return {base + "to_q.weight": q, base + "to_k.weight": k, base + "to_v.weight": v}
    return {name.replace(".attention.o.", ".attention.to_out.0."): value}


def from_original(state: dict) -> dict:
    out = {}
    for name, value in state.items():
        out.update(from_original_one(name, value))
    return out


def export_transformer(transformer, out_file, dtype=None, metadata: dict[str, str] | None = None) -> Path:
    """The transformer alone as one original-layout file (atomic), its config in the metadata."""
    from ..component_files import save_transformer_file
    return save_transformer_file(transformer, out_file, to_original, dtype, metadata)


def load_transformer_file(path, like):
    """A copy of the transformer `like` with the weights of an original-layout file."""
    from ..component_files import transformer_from_file
    return transformer_from_file(path, like, from_original)


def load_transformer(path: Path, option: str = "model.path", dtype=None):
    """An original-layout file (bf16, fp32 or ComfyUI's scaled fp8) as an Ideogram4Transformer2DModel,
    checked key by key and read one tensor at a time (component_files.stream_into)."""
    from diffusers import Ideogram4Transformer2DModel
    from ..component_files import bundled, stream_transformer
    return stream_transformer(Ideogram4Transformer2DModel, option, path, bundled("ideogram4", "transformer.json"),
                              from_original_one, "Ideogram 4 transformer of this size",
                              "ideogram4_fp8_scaled.safetensors or a bf16 file", dtype=dtype)
