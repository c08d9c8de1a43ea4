"""Z-Image LoRA files in kohya's key style (`lora_down`/`lora_up`/`.alpha`), two namings:

- output.lora_format = "kohya": musubi-tuner's (kohya's Z-Image trainer, `networks.lora_zimage`):
  `lora_unet_` + the diffusers module path with `_`, `lora_unet_layers_0_attention_to_q`, `…_to_out_0`,
  `…_feed_forward_w1` (musubi's model names its modules as diffusers does). musubi-tuner loads the
  adapters inside its transformer blocks (layers, noise_refiner, context_refiner); diffusers' Z-Image
  converter reads the file too; ComfyUI needs musubi's convert_z_image_lora_to_comfy.py (or "original").
- output.lora_format = "original": the original checkpoint's module names,
  `lora_unet_layers_0_attention_qkv.lora_down.weight`, named after the original checkpoint's
  weights (`layers.0.attention.qkv.weight`, see single_file.py), which is how ComfyUI's generic LoRA key
  map (`lora_unet_` + the model's own weight names) and tools working on the original checkpoint find
  them; musubi-tuner does not read it (it would keep only the feed-forward adapters).

Where the original model fuses q, k and v into `attention.qkv`, the three adapters become one on the
fused layer (the down matrices stacked, the up matrices block-diagonal; families/kohya_fused.py
builds it); `to_out.0` is `attention.out`. The fused update equals the parts'
updates exactly, and `read_kohya_zimage` splits it back (network.network_weights).

The default layout (diffusers', `transformer.layers.0.attention.to_q.lora_A.weight`) loads in
diffusers and in ComfyUI (its Z-Image key map takes diffusers names); this one is for tools that
only know the original names. diffusers 0.42's Z-Image converter reads it too (tests/test_zimage_lora.py).
"""
from __future__ import annotations

import re
from typing import Callable

import torch

from ..kohya_fused import to_kohya_fused
from .single_file import QKV, original_name


def original_module(module: str) -> tuple[str, list[str]]:
    """diffusers module path -> (original module path, the diffusers modules fused into it, in order)."""
    m = re.fullmatch(r"(.+\.attention)\.(to_q|to_k|to_v)", module)
    if m:
        return f"{m.group(1)}.qkv", [f"{m.group(1)}.{p}" for p in QKV]
    return original_name(module + ".")[:-1], [module]


def to_kohya_zimage(state_dicts: dict[str, dict[str, torch.Tensor]], alpha: float | Callable[[str, str], float],
                    denoiser) -> dict[str, torch.Tensor]:
    """peft LoRA weights of the transformer -> kohya's layout on the original modules.
    `denoiser` (any device, meta too) gives the sizes of fused parts that carry no adapter."""
    extra = [c for c in state_dicts if c != "transformer"]
    if extra:
        raise ValueError(f"Z-Image LoRA files hold transformer adapters only, not {extra[0]}")
    return to_kohya_fused(state_dicts, alpha, denoiser, original_module, {}, lambda _: False, "Z-Image")


def to_musubi_zimage(state_dicts: dict[str, dict[str, torch.Tensor]],
                     alpha: float | Callable[[str, str], float]) -> dict[str, torch.Tensor]:
    """peft LoRA weights of the transformer -> musubi-tuner's names (one entry per diffusers module)."""
    from ..kohya_fused import entry
    extra = [c for c in state_dicts if c != "transformer"]
    if extra:
        raise ValueError(f"Z-Image LoRA files hold transformer adapters only, not {extra[0]}")
    sd, out = state_dicts.get("transformer", {}), {}
    for key in sd:
        if key.endswith("lora_A.weight"):
            module = key[: -len(".lora_A.weight")]
            value = alpha("transformer", module) if callable(alpha) else alpha
            out.update(entry("lora_unet_" + module.replace(".", "_"), sd[key], sd[f"{module}.lora_B.weight"],
                             float(value)))
        elif not key.endswith("lora_B.weight"):
            raise ValueError(f"unexpected adapter key {key!r}: not a LoRA weight")
    return out


def is_kohya_zimage(state: dict) -> bool:
    return any(k.startswith("lora_unet_") and k.endswith(".lora_down.weight") for k in state)


def kohya_names(denoiser) -> dict[str, tuple[str, list[str]]]:
    """`lora_unet_<path with _>` -> (module path, diffusers parts) for every Linear layer, under its
    original name (fused qkv: "original") and its diffusers name (musubi-tuner's: "kohya")."""
    names = {}
    for path, module in denoiser.named_modules():
        if isinstance(module, torch.nn.Linear) and not path.endswith(("lora_A.default", "lora_B.default")):
            path = path.removesuffix(".base_layer")
            orig, parts = original_module(path)
            names["lora_unet_" + orig.replace(".", "_")] = (orig, parts)
            names.setdefault("lora_unet_" + path.replace(".", "_"), (path, [path]))
    return names


def to_peft_updates(state: dict, denoiser) -> dict[str, tuple[torch.Tensor, torch.Tensor, float]]:
    """A kohya-layout file -> diffusers module -> (down, up, scale) with the file's exact update. A
    block-diagonal fused qkv (as written here) is split into q, k and v with a third of the rank each;
    any other fused qkv gives each part the whole rank and its own rows (the same update)."""
    names = kohya_names(denoiser)
    out = {}
    for key, down in state.items():
        if not key.endswith(".lora_down.weight"):
            continue
        name = key[: -len(".lora_down.weight")]
        if name not in names:
            raise KeyError(name)
        _, parts = names[name]
        up = state[f"{name}.lora_up.weight"]
        rank = down.shape[0]
        scale = float(state.get(f"{name}.alpha", torch.tensor(float(rank)))) / rank
        sizes = [denoiser.get_submodule(p).out_features for p in parts] if len(parts) > 1 else [up.shape[0]]
        rows = [sum(sizes[:i]) for i in range(len(sizes) + 1)]
        per = rank // len(parts)
        diagonal = rank % len(parts) == 0 and all(
            not up[rows[i]:rows[i + 1], :i * per].any() and not up[rows[i]:rows[i + 1], (i + 1) * per:].any()
            for i in range(len(parts)))
        for i, part in enumerate(parts):
            if diagonal:
                out[part] = (down[i * per:(i + 1) * per], up[rows[i]:rows[i + 1], i * per:(i + 1) * per], scale)
            else:
                out[part] = (down, up[rows[i]:rows[i + 1]], scale)
    return out


def read_kohya_zimage(state: dict, modules: dict):
    """network.network_weights in this layout -> families/lora_files.py's LoraWeights (peft's layout,
    with the file's alpha/rank as each module's scale)."""
    from ...errors import ConfigError
    from ..lora_files import LoraWeights
    try:
        updates = to_peft_updates(state, modules["transformer"])
    except KeyError as e:
        raise ConfigError(f"network.network_weights: {e.args[0]} is not a module of this Z-Image transformer") from None
    original = any(k.split(".")[0].endswith(("_attention_qkv", "_attention_out")) for k in state)
    weights = LoraWeights(layout="original" if original else "kohya")
    for module, (down, up, scale) in updates.items():
        weights.add("transformer", module, "lora_A", down)
        weights.add("transformer", module, "lora_B", up)
        weights.scales[("transformer", module)] = scale
    return weights
