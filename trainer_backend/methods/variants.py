"""Adapter outputs per variant, and a loader that puts any of them on a diffusers pipeline.

- LoRA (also with conv adapters, LoCon-style): kohya/webui key format (`lora_unet_...lora_down`,
  `.alpha`), which webui, ComfyUI, kohya's scripts and diffusers' `load_lora_weights` read.
- DoRA, LoHa, LoKr: diffusers' LoRA file layout in peft keys (`unet.<module>.lora_magnitude_vector`,
  `unet.<module>.hada_w1_a`, `unet.<module>.lokr_w1`, ...) with the peft config in the
  `lora_adapter_metadata` header, the same layout `save_lora_weights` writes. This build writes
  no kohya/webui (LyCORIS) file for them: diffusers' SD loaders drop kohya `dora_scale` keys, and
  the LyCORIS LoHa/LoKr layouts could not be checked against webui here. `load_adapter_file(pipe,
  path)` below (diffusers' `add_adapter` + peft's `set_peft_model_state_dict`) loads every variant;
  diffusers' own `pipe.load_lora_weights(path)` reads DoRA UNet adapters, but (diffusers 0.42 /
  transformers 5) not DoRA text-encoder adapters, nor LoHa/LoKr on SD UNets.
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import torch

from ..config import TrainConfig

LOG = logging.getLogger("trainer")
METADATA_KEY = "lora_adapter_metadata"  # diffusers.loaders.lora_base.LORA_ADAPTER_METADATA_KEY
COMPONENTS = ("unet", "text_encoder", "text_encoder_2")


def has_kohya_format(cfg: TrainConfig) -> bool:
    return cfg.network.type == "lora" and not cfg.network.dora


def variant_name(cfg: TrainConfig) -> str:
    n = cfg.network
    names = {"lora": "DoRA" if n.dora else "LoRA", "loha": "LoHa", "lokr": "LoKr", "full": "full fine-tune"}
    conv = n.type in ("lora", "loha", "lokr") and n.conv_rank
    return names.get(n.type, n.type) + (f" + conv adapters (rank {n.conv_rank})" if conv else "")


LAYOUT_READERS = {  # the LoRA file's key layout -> what it is and what loads it
    "kohya": "kohya/webui key layout (lora_unet_…: ComfyUI, webui, kohya's scripts, diffusers' load_lora_weights)",
    "diffusers": "diffusers' key layout (transformer.…lora_A/lora_B: diffusers' load_lora_weights)",
    "original": "the original model's key layout (diffusion_model.…: ComfyUI's LoRA loader, diffusers' "
                "load_lora_weights)",
}


def format_note(cfg: TrainConfig, layout: str = "kohya") -> str:
    """One line for the run log: which layout the adapter output is in (`layout`: the family's resolved
    output.lora_format) and what loads it."""
    if has_kohya_format(cfg):
        what = LAYOUT_READERS.get(layout, f"{layout} key layout")
        return f"{variant_name(cfg)}: output in {what}; output.lora_format chooses another"
    loader = "trainer_backend.methods.variants.load_adapter_file(pipe, path) (diffusers add_adapter + peft)"
    if cfg.network.type == "lora" and not cfg.network.train_text_encoder:
        loader += " or diffusers' pipe.load_lora_weights(path)"
    return (f"{variant_name(cfg)}: no kohya/webui key format is written for this variant; the output is in "
            f"diffusers' peft layout, load it with {loader}")


def network_metadata(cfg: TrainConfig) -> dict[str, str]:
    """ss_network_* entries describing the variant (what kohya/LyCORIS tools display)."""
    n = cfg.network
    args: dict[str, str] = {}
    if n.type in ("loha", "lokr"):
        args["algo"] = n.type
    if n.dora:
        args["algo"], args["dora_wd"] = "lora", "True"
    if n.conv_rank:
        args["conv_dim"], args["conv_alpha"] = str(n.conv_rank), str(n.conv_alpha)
    meta = {"ss_network_args": json.dumps(args)} if args else {}
    if n.type in ("loha", "lokr") or n.dora:
        meta["ss_network_module"] = "peft." + n.type + ("+dora" if n.dora else "")
    return meta


def _jsonable_config(config) -> dict:
    out = {}
    for key, value in config.to_dict().items():
        if isinstance(value, set):
            value = sorted(value)
        out[key] = value.value if hasattr(value, "value") else value
    return out


def save_peft_file(path: Path, state_dicts: dict[str, dict[str, torch.Tensor]], configs: dict,
                   metadata: dict[str, str]) -> Path:
    """Write `<component>.<peft key>` weights and the packed peft configs, atomically."""
    from safetensors.torch import save_file
    weights = {f"{component}.{k}": v.contiguous() for component, sd in state_dicts.items() for k, v in sd.items()}
    packed = {f"{component}.{k}": v for component, config in configs.items()
              for k, v in _jsonable_config(config).items()}
    header = {**metadata, "format": "pt", METADATA_KEY: json.dumps(packed, indent=2, sort_keys=True)}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".partial")
    save_file(weights, str(tmp), metadata=header)
    os.replace(tmp, path)
    return path


def save_adapter_output(cfg: TrainConfig, path: Path, model, trainable, metadata: dict[str, str]) -> Path:
    """The run's adapter output in the variant's format (see the module docstring)."""
    from .kohya_format import save_lora_file
    from .lora import adapter_config, adapter_state_dicts, alpha_for_module
    state = adapter_state_dicts(trainable.modules)
    metadata = {**metadata, **network_metadata(cfg)}
    if has_kohya_format(cfg):
        return save_lora_file(path, model, state, alpha=alpha_for_module(cfg), metadata=metadata,
                              layout=cfg.output.lora_format)
    return save_peft_file(path, state, {name: adapter_config(cfg, name) for name in state}, metadata)


def load_adapter_file(pipe, path: str | Path, adapter_name: str = "default") -> None:
    """Put an adapter file written by this project (any variant) on a diffusers pipeline."""
    from peft import PeftConfig
    from peft.utils import set_peft_model_state_dict
    from safetensors import safe_open
    from safetensors.torch import load_file
    with safe_open(str(path), framework="pt") as f:
        header = f.metadata() or {}
    if METADATA_KEY not in header:  # kohya format: diffusers converts it
        pipe.load_lora_weights(str(path), adapter_name=adapter_name)
        return
    packed = json.loads(header[METADATA_KEY])
    weights = load_file(str(path))
    for component in COMPONENTS:
        prefix = component + "."
        config = {k[len(prefix):]: v for k, v in packed.items() if k.startswith(prefix)}
        if not config:
            continue
        module = getattr(pipe, component)
        module.add_adapter(PeftConfig.from_peft_type(**config), adapter_name=adapter_name)
        state = {k[len(prefix):]: v for k, v in weights.items() if k.startswith(prefix)}
        result = set_peft_model_state_dict(module, state, adapter_name=adapter_name)
        if getattr(result, "unexpected_keys", None):
            raise ValueError(f"{path}: {component} weights do not fit the adapter config "
                             f"(e.g. {result.unexpected_keys[0]})")
