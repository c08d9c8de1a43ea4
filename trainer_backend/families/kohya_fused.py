"""What kohya-layout LoRA files of fused original modules share (Flux's and SD3's kohya_lora.py):
one adapter on a fused layer (q, k, v in one `qkv` Linear) from the adapters of its diffusers parts,
the file entries (`lora_down`, `lora_up`, `alpha`), and the merge ComfyUI's LoRA loader and kohya's
merge scripts do with such a file (the check that a file holds the trained update)."""
from __future__ import annotations

from typing import Callable

import torch


def swap_rows(t: torch.Tensor) -> torch.Tensor:
    a, b = t.chunk(2, dim=0)
    return torch.cat([b, a], dim=0)


def fuse(parts: list[str], present: dict[str, tuple[torch.Tensor, torch.Tensor, float]],
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


def entry(name: str, down: torch.Tensor, up: torch.Tensor, alpha: float) -> dict[str, torch.Tensor]:
    return {f"{name}.lora_down.weight": down.contiguous(), f"{name}.lora_up.weight": up.contiguous(),
            f"{name}.alpha": torch.tensor(alpha)}


def to_kohya_fused(state_dicts: dict[str, dict[str, torch.Tensor]], alpha: float | Callable[[str, str], float],
                   denoiser, original_module: Callable[[str], tuple[str, list[str]]], text_encoders: dict[str, str],
                   swapped: Callable[[str], bool], layout: str) -> dict[str, torch.Tensor]:
    """peft LoRA weights per component -> a kohya file of the original modules.
    original_module: diffusers module path -> (original module path, the diffusers parts fused into it);
    text_encoders: component -> kohya prefix (lora_te1, ...), named on transformers 4's module paths;
    swapped: the original modules whose output halves are (shift, scale) against diffusers' (scale, shift).
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
            if component in text_encoders:  # CLIP on transformers 4's module paths, as kohya names them
                path = module if module.startswith("text_model.") or module == "text_projection" \
                    else "text_model." + module
                out.update(entry(f"{text_encoders[component]}_" + path.replace(".", "_"), down, up, value))
                continue
            if component != "transformer":
                raise ValueError(f"kohya's {layout} LoRA layout has no place for {component} adapters")
            orig, parts = original_module(module)
            groups.setdefault(orig, (parts, {}))[1][module] = (down, up, value)

    def out_features(path: str) -> int:
        return denoiser.get_submodule(path).out_features

    for orig, (parts, present) in groups.items():
        down, up, value = fuse(parts, present, out_features)
        if swapped(orig):
            up = swap_rows(up)
        out.update(entry("lora_unet_" + orig.replace(".", "_"), down, up, value))
    return out


def merge_into_original(original: dict[str, torch.Tensor], kohya: dict[str, torch.Tensor],
                        multiplier: float = 1.0) -> dict[str, torch.Tensor]:
    """What ComfyUI's LoRA loader and kohya's merge do with such a file: add multiplier · alpha/rank ·
    up @ down to each named original-layout weight (a copy; text-encoder entries are skipped)."""
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
    raise KeyError(f"{name}: no such module in the original layout")
