"""SD3 / SD3.5 LoRA files in kohya's layout (output.lora_format = "kohya"): the names of the original
(Stability AI) MMDiT modules, as kohya's sd-scripts (`networks/lora_sd3.py`) and ComfyUI read them:
`lora_unet_joint_blocks_0_x_block_attn_qkv.lora_down.weight` / `.lora_up.weight` / `.alpha`,
`lora_te1_text_model_encoder_layers_0_self_attn_q_proj…` for CLIP-L and `lora_te2_…` for CLIP-G.

q, k and v are one Linear (`attn.qkv`) in the original model: their adapters become one adapter on
it, the down matrices stacked and the up matrices block-diagonal, exactly the parts' updates (kohya's
own `split_qkv` files have the same form). kohya's loader builds modules inside the joint blocks
only; ComfyUI reads every `lora_unet_<original module>` name. diffusers has no converter from this
layout for SD3: the tests merge the file the way ComfyUI and kohya do and compare with the trained
model. `read_kohya_sd3` reads such a file back into peft's layout (network.network_weights): a
block-diagonal qkv splits into the parts' own adapters, any other fused qkv gives each part its rows.
"""
from __future__ import annotations

import re
from typing import Callable

import torch

from ..kohya_fused import merge_into_original, read_kohya_fused, to_kohya_fused  # noqa: F401 (merge: public here too)
from .single_file import BLOCK, TOP, swapped

TEXT_ENCODERS = {"text_encoder": "lora_te1", "text_encoder_2": "lora_te2"}  # CLIP-L, CLIP-G
_BLOCK = {d: (o, ds) for o, ds in BLOCK for d in ds}
_TOP = {ds[0]: o for o, ds in TOP} | {"norm_out.linear": "final_layer.adaLN_modulation.1"}


def original_module(module: str) -> tuple[str, list[str]]:
    """diffusers module path -> (original module path, the diffusers modules fused into it, in order).
    ValueError names a module that has no place in the original layout (e.g. the patch convolution)."""
    m = re.fullmatch(r"transformer_blocks\.(\d+)\.(.+)", module)
    if m and m.group(2) in _BLOCK:
        index, (o, parts) = m.group(1), _BLOCK[m.group(2)]
        return f"joint_blocks.{index}.{o}", [f"transformer_blocks.{index}.{p}" for p in parts]
    if not m and module in _TOP and module != "pos_embed.proj":
        return _TOP[module], [module]
    raise ValueError(f"network.target_modules: {module!r} has no counterpart in kohya's SD3 LoRA layout")


def to_kohya_sd3(state_dicts: dict[str, dict[str, torch.Tensor]], alpha: float | Callable[[str, str], float],
                 denoiser) -> dict[str, torch.Tensor]:
    """peft LoRA weights per component ("transformer", "text_encoder" = CLIP-L, "text_encoder_2" =
    CLIP-G) -> kohya's SD3 layout. `denoiser` (meta too) gives the sizes of fused parts without adapters."""
    layers = denoiser.config.num_layers
    return to_kohya_fused(state_dicts, alpha, denoiser, original_module, TEXT_ENCODERS,
                          lambda orig: swapped(orig, layers), "SD3")


def read_kohya_sd3(state: dict, modules: dict):
    """network.network_weights in this layout (ours or kohya's) -> families/lora_files.py's LoraWeights."""
    layers = modules["transformer"].config.num_layers if "transformer" in modules else 0
    return read_kohya_fused(state, modules, original_module, TEXT_ENCODERS, lambda orig: swapped(orig, layers), "SD3")
