"""Qwen-Image LoRA files in the layout ComfyUI's LoRA loader, musubi-tuner and kohya-style tools use
(output.lora_format = "kohya"): `lora_unet_<module path with _ for .>.lora_down.weight`,
`.lora_up.weight` and `.alpha` (the trained network.alpha, so the file applies alpha/rank · up @ down).
ComfyUI maps these names onto its Qwen-Image model (whose module names are diffusers'), and
diffusers' own converter (`_convert_non_diffusers_qwen_lora_to_diffusers`) reads them back."""
from __future__ import annotations

from typing import Callable


def to_comfy_lora(adapter_states: dict[str, dict], alpha: float | Callable[[str, str], float]) -> dict:
    """peft adapter weights of the transformer -> one kohya-style state dict."""
    import torch
    out: dict = {}
    for component, sd in adapter_states.items():
        if component != "transformer":
            raise ValueError(f"Qwen-Image LoRA files hold transformer adapters only, not {component!r}")
        for key, tensor in sd.items():
            if not key.endswith(("lora_A.weight", "lora_B.weight")):
                raise ValueError(f"unexpected adapter key {key!r}: not a LoRA weight")
            module, kind = key.rsplit(".lora_", 1)
            name = "lora_unet_" + module.replace(".", "_")
            if kind == "A.weight":
                out[f"{name}.lora_down.weight"] = tensor.contiguous()
                value = alpha(component, module) if callable(alpha) else alpha
                out[f"{name}.alpha"] = torch.tensor(float(value))
            else:
                out[f"{name}.lora_up.weight"] = tensor.contiguous()
    return out
