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
structure and splits it back into the parts' own rank.
"""
from __future__ import annotations

import re
from typing import Callable

import torch

from .single_file import DOUBLE, SINGLE, TOP

FINAL_NORM = ("norm_out.linear", "final_layer.adaLN_modulation.1")  # (shift, scale) halves swapped
_DOUBLE = {d: (o, ds) for o, ds in DOUBLE for d in ds}
_SINGLE = {d: (o, ds) for o, ds in SINGLE for d in ds}
_TOP = {ds[0]: o for o, ds in TOP}


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


def _swap_rows(t: torch.Tensor) -> torch.Tensor:
    a, b = t.chunk(2, dim=0)
    return torch.cat([b, a], dim=0)


def _fuse(parts: list[str], present: dict[str, tuple[torch.Tensor, torch.Tensor, float]],
          out_features: Callable[[str], int]) -> tuple[torch.Tensor, torch.Tensor, float]:
    """One adapter on the fused layer from the parts' (down, up, alpha): (down, up, alpha)."""
    if len(parts) == 1:
        return present[parts[0]]
    scales = {p: alpha / down.shape[0] for p, (down, _, alpha) in present.items()}
    first = next(p for p in parts if p in present)
    rank = sum(down.shape[0] for down, _, _ in present.values())
    sizes = [out_features(p) for p in parts]
    downs, up = [], torch.zeros(sum(sizes), rank)
    row = col = 0
    for part, size in zip(parts, sizes):
        if part in present:
            down, part_up, _ = present[part]
            r = down.shape[0]
            downs.append(down)
            # a part scaled differently from the first is rescaled into its up block (kohya has one alpha)
            up[row:row + size, col:col + r] = part_up * (scales[part] / scales[first])
            col += r
        row += size
    return torch.cat(downs, dim=0), up, scales[first] * rank


def to_kohya_flux(state_dicts: dict[str, dict[str, torch.Tensor]], alpha: float | Callable[[str, str], float],
                  denoiser) -> dict[str, torch.Tensor]:
    """peft LoRA weights per component ("transformer", "text_encoder" = CLIP-L) -> kohya's Flux layout.
    `denoiser` (any device, meta too) gives the output sizes of fused parts that carry no adapter."""
    out: dict[str, torch.Tensor] = {}
    groups: dict[str, tuple[list[str], dict]] = {}
    for component, sd in state_dicts.items():
        for key in sd:
            if not key.endswith("lora_A.weight"):
                if key.endswith("lora_B.weight"):
                    continue
                raise ValueError(f"unexpected adapter key {key!r}: not a LoRA weight")
            module = key[: -len(".lora_A.weight")]
            down, up = sd[key], sd[f"{module}.lora_B.weight"]
            value = float(alpha(component, module) if callable(alpha) else alpha)
            if component == "text_encoder":  # CLIP-L on transformers 4's module paths, as kohya names them
                path = module if module.startswith("text_model.") else "text_model." + module
                name = "lora_te1_" + path.replace(".", "_")
                out.update(_entry(name, down, up, value))
                continue
            if component != "transformer":
                raise ValueError(f"kohya's Flux LoRA layout has no place for {component} adapters")
            orig, parts = original_module(module)
            groups.setdefault(orig, (parts, {}))[1][module] = (down, up, value)

    def out_features(path: str) -> int:
        return denoiser.get_submodule(path).out_features

    for orig, (parts, present) in groups.items():
        down, up, value = _fuse(parts, present, out_features)
        if orig == FINAL_NORM[1]:
            up = _swap_rows(up)
        out.update(_entry("lora_unet_" + orig.replace(".", "_"), down, up, value))
    return out


def _entry(name: str, down: torch.Tensor, up: torch.Tensor, alpha: float) -> dict[str, torch.Tensor]:
    return {f"{name}.lora_down.weight": down.contiguous(), f"{name}.lora_up.weight": up.contiguous(),
            f"{name}.alpha": torch.tensor(alpha)}


def merge_into_original(original: dict[str, torch.Tensor], kohya: dict[str, torch.Tensor],
                        multiplier: float = 1.0) -> dict[str, torch.Tensor]:
    """What ComfyUI's LoRA loader and kohya's merge do with such a file: add multiplier · alpha/rank ·
    up @ down to each named original-layout weight (a copy; CLIP-L entries are skipped)."""
    merged = dict(original)
    for key, down in kohya.items():
        if not (key.startswith("lora_unet_") and key.endswith(".lora_down.weight")):
            continue
        name = key[: -len(".lora_down.weight")]
        target = _original_key(name, original)
        up, alpha = kohya[f"{name}.lora_up.weight"], float(kohya[f"{name}.alpha"])
        merged[target] = original[target] + multiplier * (alpha / down.shape[0]) * (up.float() @ down.float())
    return merged


def _original_key(name: str, original: dict) -> str:
    """`lora_unet_double_blocks_0_img_attn_qkv` -> `double_blocks.0.img_attn.qkv.weight` (by lookup:
    the underscores of the file name are ambiguous)."""
    flat = name[len("lora_unet_"):]
    for key in original:
        if key.endswith(".weight") and key[: -len(".weight")].replace(".", "_") == flat:
            return key
    raise KeyError(f"{name}: no such module in the original Flux layout")
