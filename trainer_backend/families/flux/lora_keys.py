"""Flux LoRA files in diffusers' layout: `transformer.<module>.lora_A.weight` / `lora_B.weight`
(and `text_encoder.…` for CLIP-L), which diffusers' `load_lora_weights` reads directly and
ComfyUI's LoRA loader maps onto its own Flux model.

That layout has no alpha keys (its loaders take alpha = rank), so alpha/rank is folded into
lora_B: the file applies exactly the trained update with no scale to get wrong downstream.
"""
from __future__ import annotations

from typing import Callable

import torch


def to_diffusers_lora(state_dicts: dict[str, dict[str, torch.Tensor]],
                      alpha: float | Callable[[str, str], float]) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for component, sd in state_dicts.items():
        for key, tensor in sd.items():
            if not key.endswith(("lora_A.weight", "lora_B.weight")):
                raise ValueError(f"unexpected adapter key {key!r}: not a LoRA weight")
            module = key.rsplit(".lora_", 1)[0]
            if key.endswith("lora_B.weight"):
                rank = sd[f"{module}.lora_A.weight"].shape[0]
                value = alpha(component, module) if callable(alpha) else alpha
                tensor = tensor * (float(value) / rank)
            out[f"{component}.{key}"] = tensor.contiguous()
    return out
