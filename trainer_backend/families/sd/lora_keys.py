"""kohya/webui LoRA key layout for SD1, SD2 and SDXL.

`lora_unet_<module path with _>.lora_down.weight` (peft lora_A), `.lora_up.weight` (lora_B),
`.alpha` (scalar). Text encoders: `lora_te_` for SD1/SD2, `lora_te1_`/`lora_te2_` for SDXL, on
the `text_model.` module paths. diffusers' `load_lora_weights`, A1111, ComfyUI and kohya's own
scripts read this layout.
"""
from __future__ import annotations

from typing import Callable

import torch

_PEFT_TO_KOHYA = {"lora_A.weight": "lora_down.weight", "lora_B.weight": "lora_up.weight",
                  "lora_magnitude_vector": "dora_scale"}


def _te_prefix(component: str, arch: str) -> str:
    if arch == "sdxl":
        return "lora_te1" if component == "text_encoder" else "lora_te2"
    return "lora_te"


def _sdxl_unet_module(module: str, unet_config: dict) -> str:
    """diffusers UNet module path -> the original (sgm) path kohya's SDXL LoRAs use,
    e.g. down_blocks.1.attentions.0.… -> input_blocks.4.1.…"""
    from .ldm_keys import UNET_PREFIX, unet_to_ldm
    (ldm_key,) = unet_to_ldm({module + ".weight": torch.empty(0)}, unet_config)
    return ldm_key[len(UNET_PREFIX):-len(".weight")]


def to_kohya(state_dicts: dict[str, dict[str, torch.Tensor]], alpha: float | Callable[[str, str], float],
             arch: str, unet_config: dict | None = None) -> dict[str, torch.Tensor]:
    """peft adapter state dicts (per component) -> one kohya-format dict with `.alpha` keys.
    alpha: one value, or (component, peft module path) -> alpha (conv adapters have their own).
    SDXL UNet names follow kohya's SDXL layout (input/middle/output_blocks) when the UNet
    config is given; SD1/SD2 kohya LoRAs use the diffusers module names."""
    out: dict[str, torch.Tensor] = {}
    for component, sd in state_dicts.items():
        for key, tensor in sd.items():
            suffix = next((s for s in _PEFT_TO_KOHYA if key.endswith(s)), None)
            if suffix is None:
                raise ValueError(f"unexpected adapter key {key!r}: not a LoRA weight")
            module = peft_module = key[: -len(suffix) - 1]
            if component == "unet":
                prefix = "lora_unet"
                if arch == "sdxl" and unet_config is not None:
                    module = _sdxl_unet_module(module, unet_config)
            else:
                prefix = _te_prefix(component, arch)
                if not module.startswith("text_model."):  # transformers 5 flattens CLIPTextModel
                    module = "text_model." + module
            name = f"{prefix}_{module.replace('.', '_')}"
            out[f"{name}.{_PEFT_TO_KOHYA[suffix]}"] = tensor.contiguous()
            if suffix == "lora_A.weight":
                value = alpha(component, peft_module) if callable(alpha) else alpha
                out[f"{name}.alpha"] = torch.tensor(float(value))
    return out


def _kohya_name(component: str, module: str, arch: str, unet_config: dict | None) -> str:
    if component == "unet":
        if arch == "sdxl" and unet_config is not None:
            module = _sdxl_unet_module(module, unet_config)
        return "lora_unet_" + module.replace(".", "_")
    if not module.startswith("text_model."):
        module = "text_model." + module
    return f"{_te_prefix(component, arch)}_{module.replace('.', '_')}"


def from_kohya(state: dict[str, torch.Tensor], modules: dict, arch: str, unet_config: dict | None = None):
    """A kohya/webui-layout file -> LoraWeights (families/lora_files.py), the inverse of to_kohya over
    the layers of `modules` (component -> module). A name that is no layer of theirs is refused."""
    from ...errors import ConfigError
    from ..lora_files import KEY, LoraWeights
    names: dict[str, tuple[str, str]] = {}
    for component, module in modules.items():
        for path, layer in module.named_modules():
            if isinstance(layer, (torch.nn.Linear, torch.nn.Conv2d)) or hasattr(layer, "base_layer"):
                if ".base_layer" not in path and ".lora_" not in path:
                    names[_kohya_name(component, path, arch, unet_config)] = (component, path)
    out = LoraWeights(layout="kohya")
    alphas: dict[tuple[str, str], float] = {}
    parts = {"lora_down.weight": "lora_A", "lora_up.weight": "lora_B"}
    for key, tensor in state.items():
        name, _, suffix = key.partition(".")
        if name not in names:
            trained = sorted({c for c, _ in names.values()})
            raise ConfigError(f"{KEY}: {key} names no layer of the model's {' or '.join(trained)} (a LoRA for "
                              f"another model family, or network.train_text_encoder is off)")
        component, path = names[name]
        if suffix == "alpha":
            alphas[(component, path)] = float(tensor)
        elif suffix in parts:
            out.add(component, path, parts[suffix], tensor)
        else:
            raise ConfigError(f"{KEY}: {key} is not a LoRA weight this studio can start from "
                              f"(lora_down, lora_up and alpha are)")
    for component, weights in out.weights.items():
        for key, tensor in weights.items():
            if key.endswith(".lora_A.weight"):
                module = key[:-len(".lora_A.weight")]
                # kohya: a missing alpha means alpha = rank
                out.scales[(component, module)] = alphas.get((component, module), tensor.shape[0]) / tensor.shape[0]
    return out
