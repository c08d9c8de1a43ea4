"""Flux.2 LoRA files in kohya's layout (output.lora_format = "kohya", the family's default): the names
of the original (Black Forest Labs) modules with `lora_unet_` and underscores, `.lora_down.weight`,
`.lora_up.weight` and `.alpha`, as ComfyUI's LoRA loader (any `lora_unet_<original module>`), kohya-style
tools and diffusers' `_convert_kohya_flux2_lora_to_diffusers` read them.

q, k and v of a double block are one layer in the original model (`img_attn.qkv`, `txt_attn.qkv`): their
adapters become one adapter there, down matrices stacked and up matrices block-diagonal (the same
fusion as Flux.1's, families/flux/kohya_lora.py), which diffusers recognises and splits back into the
parts' own rank. A single block's `linear1`/`linear2` are fused in diffusers too, so they map 1:1.
"""
from __future__ import annotations

from typing import Callable

import torch

from ..kohya_fused import merge_into_original, to_kohya_fused  # noqa: F401 (merge: a public name here too)
from .original_keys import linear_pairs

# the original modules diffusers' kohya converter reads for Flux.2 (others would be dropped there)
_READ_TOP = {"img_in", "txt_in", "time_in.in_layer", "time_in.out_layer", "final_layer.linear"}
_READ_BLOCK = {"img_attn.qkv", "txt_attn.qkv", "img_attn.proj", "txt_attn.proj", "img_mlp.0", "img_mlp.2",
               "txt_mlp.0", "txt_mlp.2", "linear1", "linear2"}


def _table(denoiser) -> dict[str, tuple[str, list[str]]]:
    c = denoiser.config
    return {d: (o, ds) for o, ds in linear_pairs(c.num_layers, c.num_single_layers) for d in ds}


def original_module(module: str, table: dict) -> tuple[str, list[str]]:
    """diffusers module path -> (original module, the diffusers modules fused into it); ValueError
    names a module that has no place in the layout."""
    if module in table:
        orig, parts = table[module]
        short = orig.split(".", 2)[-1] if orig.startswith(("double_blocks.", "single_blocks.")) else None
        if (short in _READ_BLOCK) if short is not None else (orig in _READ_TOP):
            return orig, parts
    raise ValueError(f"network.target_modules: {module!r} has no counterpart in kohya's Flux.2 LoRA layout "
                     "(use output.lora_format = diffusers)")


def to_kohya_flux2(state_dicts: dict[str, dict[str, torch.Tensor]], alpha: float | Callable[[str, str], float],
                   denoiser) -> dict[str, torch.Tensor]:
    """peft LoRA weights of the transformer -> kohya's Flux.2 layout. `denoiser` (any device, meta too)
    gives the module table and the output sizes of fused parts that carry no adapter."""
    table = _table(denoiser)
    return to_kohya_fused(state_dicts, alpha, denoiser, lambda m: original_module(m, table), {},
                          lambda orig: False, "Flux.2")
