"""Writing trained adapters as kohya/webui-format `.safetensors` with ss_* metadata.

kohya key layout: `lora_unet_<module path with _>.lora_down.weight` (peft lora_A),
`.lora_up.weight` (lora_B), `.alpha` (scalar). Text encoders: `lora_te_` for SD1/SD2,
`lora_te1_`/`lora_te2_` for SDXL, on the `text_model.` module paths. diffusers'
`load_lora_weights`, A1111, ComfyUI and kohya's own scripts read this layout.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable

import torch
from safetensors.torch import save_file

_PEFT_TO_KOHYA = {"lora_A.weight": "lora_down.weight", "lora_B.weight": "lora_up.weight",
                  "lora_magnitude_vector": "dora_scale"}


def _te_prefix(component: str, arch: str) -> str:
    if arch == "sdxl":
        return "lora_te1" if component == "text_encoder" else "lora_te2"
    return "lora_te"


def _sdxl_unet_module(module: str, unet_config: dict) -> str:
    """diffusers UNet module path -> the original (sgm) path kohya's SDXL LoRAs use,
    e.g. down_blocks.1.attentions.0.… -> input_blocks.4.1.…"""
    from ..families.sd.ldm_keys import UNET_PREFIX, unet_to_ldm
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


def tag_frequency(scan) -> dict[str, dict[str, int]]:
    """kohya's ss_tag_frequency: per subset folder, how often each caption tag occurs."""
    freq: dict[str, dict[str, int]] = {}
    for item in scan.items:
        if getattr(item, "is_class", False):
            continue
        name = scan.groups[item.group].name if getattr(scan, "groups", None) else "dataset"
        counts = freq.setdefault(name, {})
        for tag in item.tags:
            tag = tag.strip()
            if tag:
                counts[tag] = counts.get(tag, 0) + 1
    return freq


BASE_MODEL_VERSION = {"sd1": "sd_v1", "sd2": "sd_v2", "sdxl": "sdxl_base_v1-0"}


def kohya_metadata(cfg, arch: str, *, steps: int, epochs: int, num_images: int,
                   tag_frequency: dict | None = None, started_at: float = 0.0) -> dict[str, str]:
    """ss_* training metadata as webui/kohya tools read it (all values are strings)."""
    meta = {
        "ss_network_module": "networks.lora",
        "ss_network_dim": str(cfg.network.rank),
        "ss_network_alpha": str(cfg.network.alpha),
        "ss_network_dropout": str(cfg.network.dropout),
        "ss_base_model_version": BASE_MODEL_VERSION[arch],
        "ss_v2": str(arch == "sd2"),
        "ss_sd_model_name": os.path.basename(cfg.model.path.rstrip("/")),
        "ss_output_name": cfg.output.name,
        "ss_resolution": f"({cfg.dataset.resolution}, {cfg.dataset.resolution})",
        "ss_steps": str(steps),
        "ss_epoch": str(epochs),
        "ss_num_train_images": str(num_images),
        "ss_batch_size_per_device": str(cfg.schedule.batch_size),
        "ss_gradient_accumulation_steps": str(cfg.schedule.grad_accum),
        "ss_learning_rate": str(cfg.optimizer.lr),
        "ss_unet_lr": str(cfg.optimizer.lr),
        "ss_text_encoder_lr": str(cfg.network.text_encoder_lr or cfg.optimizer.lr)
        if cfg.network.train_text_encoder else "0",
        "ss_optimizer": cfg.optimizer.name,
        "ss_lr_scheduler": cfg.optimizer.scheduler,
        "ss_lr_warmup_steps": str(cfg.optimizer.warmup_steps),
        "ss_max_grad_norm": str(cfg.optimizer.max_grad_norm),
        "ss_mixed_precision": cfg.precision.mixed,
        "ss_seed": str(cfg.schedule.seed),
        "ss_noise_offset": str(cfg.loss.noise_offset),
        "ss_min_snr_gamma": str(cfg.loss.min_snr_gamma),
        "ss_training_started_at": str(started_at),
        "ss_tag_frequency": json.dumps(tag_frequency or {}),
        "modelspec.architecture": {"sd1": "stable-diffusion-v1/lora", "sd2": "stable-diffusion-v2-768-v/lora",
                                   "sdxl": "stable-diffusion-xl-v1-base/lora"}[arch],
    }
    return meta


def save_kohya_lora(path: Path, state_dicts: dict[str, dict[str, torch.Tensor]], *,
                    alpha: float | Callable[[str, str], float], arch: str,
                    metadata: dict[str, str], unet_config: dict | None = None) -> Path:
    """Write atomically (temp file + rename) so a crash never leaves a half file under the final name."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    save_file(to_kohya(state_dicts, alpha, arch, unet_config), str(tmp), metadata=metadata)
    os.replace(tmp, path)
    return path
