"""Wan 2.x LoRA files in ComfyUI's layout (also musubi-tuner's and the Wan community's):
`diffusion_model.blocks.<i>.self_attn.q.lora_down.weight`, `.lora_up.weight`, `.alpha`: the original Wan
module names (self_attn/cross_attn q k v o, ffn.0/ffn.2, cross_attn k_img/v_img for an image encoder).
diffusers' own converter (`_convert_non_diffusers_wan_lora_to_diffusers`) reads them back, and the
full-size key sets are checked on the meta device (families/wan/configs.py)."""
from __future__ import annotations

import re
from typing import Callable

# the attention and feed-forward linears of every block (add_k_proj/add_v_proj exist only with an image encoder)
DEFAULT_TARGETS = ("to_q", "to_k", "to_v", "to_out.0", "add_k_proj", "add_v_proj", "net.0.proj", "net.2")
_ATTN = {"attn1": "self_attn", "attn2": "cross_attn"}
_PROJ = {"to_q": "q", "to_k": "k", "to_v": "v", "to_out.0": "o", "add_k_proj": "k_img", "add_v_proj": "v_img"}
_FFN = {"net.0.proj": "ffn.0", "net.2": "ffn.2"}


def original_name(module: str) -> str:
    """diffusers module path -> the original Wan name ComfyUI uses ('blocks.3.attn1.to_q' -> 'blocks.3.self_attn.q')."""
    m = re.fullmatch(r"blocks\.(\d+)\.(attn1|attn2)\.(to_q|to_k|to_v|to_out\.0|add_k_proj|add_v_proj)", module)
    if m:
        return f"blocks.{m[1]}.{_ATTN[m[2]]}.{_PROJ[m[3]]}"
    m = re.fullmatch(r"blocks\.(\d+)\.ffn\.(net\.0\.proj|net\.2)", module)
    if m:
        return f"blocks.{m[1]}.{_FFN[m[2]]}"
    raise ValueError(f"{module!r} has no name in Wan's ComfyUI LoRA layout (only the blocks' attention and "
                     "feed-forward linears)")


def to_comfy_lora(adapter_states: dict[str, dict], alpha: float | Callable[[str, str], float]) -> dict:
    """peft adapter weights of one Wan transformer (either expert) -> one ComfyUI-layout state dict."""
    import torch
    out: dict = {}
    for component, sd in adapter_states.items():
        if component not in ("transformer", "transformer_2"):
            raise ValueError(f"Wan LoRA files hold transformer adapters only, not {component!r}")
        for key, tensor in sd.items():
            if not key.endswith(("lora_A.weight", "lora_B.weight")):
                raise ValueError(f"unexpected adapter key {key!r}: not a LoRA weight")
            module, kind = key.rsplit(".lora_", 1)
            name = "diffusion_model." + original_name(module)
            if kind == "A.weight":
                out[f"{name}.lora_down.weight"] = tensor.contiguous()
                value = alpha(component, module) if callable(alpha) else alpha
                out[f"{name}.alpha"] = torch.tensor(float(value))
            else:
                out[f"{name}.lora_up.weight"] = tensor.contiguous()
    return out
