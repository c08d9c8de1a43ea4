"""Flux LoRA files in kohya's layout (output.lora_format = "kohya"): the names of the original
(Black Forest Labs) modules, as kohya's sd-scripts (`networks/lora_flux.py`), ComfyUI and Forge
read them: `lora_unet_double_blocks_0_img_attn_qkv.lora_down.weight` / `.lora_up.weight` /
`.alpha`, and `lora_te1_text_model_encoder_layers_0_self_attn_q_proj…` for CLIP-L.

Where the original model fuses several diffusers modules into one linear layer (q, k and v in
`img_attn.qkv`; q, k, v and the MLP input in a single block's `linear1`), the adapters of the parts
become one adapter on the fused layer: `lora_down` stacks the parts' down matrices (rank = the sum
of their ranks) and `lora_up` places each part's up matrix on its own rows and columns (block
diagonal; a part without an adapter keeps zero rows). The fused update equals the parts' updates
exactly; diffusers' converter (`_convert_kohya_flux_lora_to_diffusers`) recognises the block
structure and splits it back into the parts' own rank. `read_kohya_flux` does the same for
network.network_weights, into peft's layout, at any size (diffusers' converter, left to files of
other layouts, assumes the full-size widths in the single blocks).
"""
from __future__ import annotations

import re
from typing import Callable

import torch

from ..kohya_fused import merge_into_original, read_kohya_fused, to_kohya_fused  # noqa: F401 (merge: public here too)
from .single_file import DOUBLE, SINGLE, TOP

FINAL_NORM = ("norm_out.linear", "final_layer.adaLN_modulation.1")  # (shift, scale) halves swapped
_DOUBLE = {d: (o, ds) for o, ds in DOUBLE for d in ds}
_SINGLE = {d: (o, ds) for o, ds in SINGLE for d in ds}
_TOP = {ds[0]: o for o, ds in TOP}
TEXT_ENCODERS = {"text_encoder": "lora_te1"}  # CLIP-L (T5 would be lora_te3; it stays frozen)


def original_module(module: str) -> tuple[str, list[str]]:
    """diffusers module path -> (original module path, the diffusers modules fused into it, in order).
    ValueError names a module that has no place in the original layout."""
    m = re.fullmatch(r"(single_transformer_blocks|transformer_blocks)\.(\d+)\.(.+)", module)
    if m:
        kind, index, rest = m.groups()
        table, prefix, orig = ((_SINGLE, "single_transformer_blocks", "single_blocks") if kind.startswith("single")
                               else (_DOUBLE, "transformer_blocks", "double_blocks"))
        if rest in table:
            o, parts = table[rest]
            return f"{orig}.{index}.{o}", [f"{prefix}.{index}.{p}" for p in parts]
    elif module in _TOP:
        return _TOP[module], [module]
    elif module == FINAL_NORM[0]:
        return FINAL_NORM[1], [module]
    raise ValueError(f"network.target_modules: {module!r} has no counterpart in kohya's Flux LoRA layout")


def to_kohya_flux(state_dicts: dict[str, dict[str, torch.Tensor]], alpha: float | Callable[[str, str], float],
                  denoiser) -> dict[str, torch.Tensor]:
    """peft LoRA weights per component ("transformer", "text_encoder" = CLIP-L) -> kohya's Flux layout.
    `denoiser` (any device, meta too) gives the output sizes of fused parts that carry no adapter."""
    return to_kohya_fused(state_dicts, alpha, denoiser, original_module, TEXT_ENCODERS,
                          lambda orig: orig == FINAL_NORM[1], "Flux")


def read_kohya_flux(state: dict, modules: dict):
    """network.network_weights in this layout (ours or kohya's) -> families/lora_files.py's LoraWeights."""
    return read_kohya_fused(state, modules, original_module, TEXT_ENCODERS, lambda orig: orig == FINAL_NORM[1],
                            "Flux")
