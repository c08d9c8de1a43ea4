"""Krea 2 LoRA files in the original checkpoint's module names, the layout ComfyUI and Krea's reference
trainer load: `diffusion_model.blocks.N.attn.wq.lora_A.weight` … (`wq/wk/wv/wo/gate`, `mlp.gate/up/down`),
lora_A/lora_B with alpha/rank folded into lora_B (the layout has no alpha keys). diffusers reads it back
through its own _convert_non_diffusers_krea2_lora_to_diffusers (the conformance-style test checks it)."""
from __future__ import annotations

import re

ATTN = {"to_q": "wq", "to_k": "wk", "to_v": "wv", "to_out.0": "wo", "to_gate": "gate"}
FF = {"gate": "gate", "up": "up", "down": "down"}
PREFIX = "diffusion_model."


def original_module(module: str) -> str:
    """A diffusers module path of the transformer -> the original checkpoint's."""
    m = re.match(r"(transformer_blocks|text_fusion\.(?:layerwise|refiner)_blocks)\.(\d+)\.(attn\.(.+)|ff\.(\w+))$",
                 module)
    if m is None:
        raise ValueError(f"{module!r} has no name in Krea 2's original layout (only the blocks' attention and MLPs)")
    stack, index, _, attn, ff = m.groups()
    stack = "blocks" if stack == "transformer_blocks" else stack.replace("text_fusion.", "txtfusion.")
    return f"{stack}.{index}.attn.{ATTN[attn]}" if attn else f"{stack}.{index}.mlp.{FF[ff]}"


def to_original(diffusers_state: dict) -> dict:
    """A diffusers-layout LoRA state (`transformer.<module>.lora_A.weight`, alpha folded) -> the original's."""
    out = {}
    for key, tensor in diffusers_state.items():
        component, rest = key.split(".", 1)
        if component != "transformer":
            raise ValueError(f"{key!r}: Krea 2's original layout holds transformer adapters only")
        module, suffix = rest.rsplit(".lora_", 1)
        out[f"{PREFIX}{original_module(module)}.lora_{suffix}"] = tensor
    return out
