"""Ideogram 4 LoRA files in the original model's module names (output.lora_format = "original"): the
layout diffusers' Ideogram 4 converter reads as ai-toolkit's, `diffusion_model.layers.0.attention.qkv`
(q, k and v fused), `…attention.o` (to_out.0), `…feed_forward.w1/w2/w3`, in kohya's key style
(`lora_down`/`lora_up`/`.alpha`). The fused qkv adapter stacks the three down matrices and puts the up
matrices block-diagonally (families/kohya_fused.py), so its update is exactly the three parts'.
diffusers' converter shares the down matrix and splits the up in thirds, which gives back the same
updates. ComfyUI loads these fused names and not split to_q/to_k/to_v ones (ComfyUI issue #14477); the
converter reads them from AI Toolkit's and Fal's files (diffusers PR #13919). Not run in ComfyUI here."""
from __future__ import annotations

import re
from typing import Callable

import torch

from ..kohya_fused import entry, fuse

PREFIX = "diffusion_model."


def original_module(module: str) -> tuple[str, list[str]]:
    """diffusers module path -> (original module path, the diffusers modules fused into it, in order)."""
    m = re.fullmatch(r"(layers\.\d+\.attention)\.(to_q|to_k|to_v)", module)
    if m:
        return f"{m.group(1)}.qkv", [f"{m.group(1)}.{p}" for p in ("to_q", "to_k", "to_v")]
    m = re.fullmatch(r"(layers\.\d+\.attention)\.to_out\.0", module)
    if m:
        return f"{m.group(1)}.o", [module]
    if re.fullmatch(r"layers\.\d+\.(feed_forward\.w[123]|adaln_modulation)", module):
        return module, [module]
    raise ValueError(f"Ideogram 4's original LoRA layout has no name for {module} (diffusers' converter maps "
                     "attention q/k/v/out, feed_forward.w1-w3 and adaln_modulation only)")


def to_original_lora(state_dicts: dict[str, dict[str, torch.Tensor]], alpha: float | Callable[[str, str], float],
                     denoiser) -> dict[str, torch.Tensor]:
    """peft LoRA weights of the transformer -> the original layout. `denoiser` (meta too) gives the sizes
    of fused parts without an adapter."""
    extra = [c for c in state_dicts if c != "transformer"]
    if extra:
        raise ValueError(f"Ideogram 4 LoRA files hold transformer adapters only, not {extra[0]}")
    sd = state_dicts.get("transformer", {})
    groups: dict[str, tuple[list[str], dict]] = {}
    for key in sd:
        if key.endswith("lora_B.weight"):
            continue
        if not key.endswith("lora_A.weight"):
            raise ValueError(f"unexpected adapter key {key!r}: not a LoRA weight")
        module = key[: -len(".lora_A.weight")]
        value = float(alpha("transformer", module) if callable(alpha) else alpha)
        orig, parts = original_module(module)
        groups.setdefault(orig, (parts, {}))[1][module] = (sd[key], sd[f"{module}.lora_B.weight"], value)
    out: dict[str, torch.Tensor] = {}
    for orig, (parts, present) in groups.items():
        down, up, value = fuse(parts, present, lambda p: denoiser.get_submodule(p).out_features)
        out.update(entry(PREFIX + orig, down, up, value))
    return out
