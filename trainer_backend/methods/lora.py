"""Adapters through peft: LoRA (optionally DoRA), LoHa and LoKr, on the UNet's attention (and
convolutions, LoCon-style, when network.conv_rank > 0) and optionally the text encoders."""
from __future__ import annotations

import re

import torch
from peft.utils import get_peft_model_state_dict

from ..config import ConfigError, TrainConfig
from .base import Trainable, fp32_param_groups

__all__ = ["Trainable", "adapter_config", "adapter_state_dicts", "alpha_for_module",
           "setup_lora"]


def _targets(cfg: TrainConfig, component: str) -> tuple[list[str], list[str]]:
    """(all target module names, the convolution ones among them) for a component."""
    n = cfg.network
    if component.startswith("text_encoder"):
        return list(n.text_encoder_target_modules), []
    targets = list(n.target_modules)
    conv = [t for t in n.conv_target_modules if t not in targets] if n.conv_rank > 0 else []
    return targets + conv, conv


def adapter_config(cfg: TrainConfig, component: str):
    """The peft config of network.type for one component (the denoiser, "text_encoder", "text_encoder_2")."""
    from peft import LoHaConfig, LoKrConfig, LoraConfig
    n = cfg.network
    targets, conv = _targets(cfg, component)
    # exact (escaped) names: peft matches pattern keys as regexes against module-name suffixes
    rank_pattern = {re.escape(t): n.conv_rank for t in conv}
    alpha_pattern = {re.escape(t): n.conv_alpha for t in conv}
    common = dict(r=n.rank, target_modules=targets, rank_pattern=rank_pattern, alpha_pattern=alpha_pattern)
    if not component.startswith("text_encoder") and n.exclude_modules:
        from .block_lr import exclude_pattern
        common["exclude_modules"] = exclude_pattern(cfg)
    if n.type == "lora":
        return LoraConfig(lora_alpha=n.alpha, lora_dropout=n.dropout, init_lora_weights="gaussian",
                          use_dora=n.dora, **common)
    if n.type == "loha":
        return LoHaConfig(alpha=n.alpha, rank_dropout=n.dropout, **common)
    if n.type == "lokr":
        return LoKrConfig(alpha=n.alpha, rank_dropout=n.dropout, decompose_factor=n.lokr_factor, **common)
    raise ConfigError(f"network.type: {n.type!r} is not an adapter type")


def alpha_for_module(cfg: TrainConfig):
    """(component, module path) -> alpha, as the kohya export writes it (conv adapters have their own)."""
    _, conv = _targets(cfg, "unet")

    def alpha(component: str, module: str) -> float:
        if not component.startswith("text_encoder") and any(module == t or module.endswith("." + t) for t in conv):
            return cfg.network.conv_alpha
        return cfg.network.alpha
    return alpha


def setup_lora(model, cfg: TrainConfig) -> Trainable:
    """Freeze the base model, add adapters to the UNet (and text encoders when asked),
    and return the adapter parameters in fp32 grouped by learning rate (network.block_lr too);
    network.network_weights then fills them (methods/network_weights.py)."""
    from .block_lr import check_excludes, split_by_block
    from ..compute.lowbit_linear import COMPUTE_KINDS, to_lowbit_compute
    family = model.family
    for module in (model.denoiser, model.vae, *model.text_encoders):
        module.requires_grad_(False)
    check_excludes(cfg, model.denoiser)
    _add_adapter(model.denoiser, adapter_config(cfg, family.denoiser_name), "network.target_modules")
    from .training_adapter import add_training_adapter
    add_training_adapter(model, cfg)  # network.training_adapter: frozen, beside the trained adapter
    if cfg.model.quantize in COMPUTE_KINDS:  # peft's layers are in place: their frozen base layers go 8-bit
        to_lowbit_compute(model.denoiser, cfg.model.quantize, keep=getattr(family, "keep_unquantized", ()))
    modules: dict[str, torch.nn.Module] = {family.denoiser_name: model.denoiser}
    if cfg.network.train_text_encoder:
        for name, encoder in model.trained_text_encoders():
            _add_adapter(encoder, adapter_config(cfg, name), "network.text_encoder_target_modules")
            modules[name] = encoder
    groups = fp32_param_groups(modules, cfg.optimizer.lr, cfg.network.text_encoder_lr or cfg.optimizer.lr)
    if cfg.network.block_lr:
        name = family.denoiser_name
        groups = [g for group in groups for g in (
            split_by_block(model, name, modules[name], group, cfg.network.block_lr) if group["name"] == name
            else [group])]
        if not groups:
            raise ConfigError("network.block_lr: every block is frozen (multiplier 0); nothing would train")
    _check_file_layout(model, cfg, modules)
    return Trainable(modules=modules, param_groups=groups, kind="adapter")


def _check_file_layout(model, cfg: TrainConfig, modules: dict) -> None:
    """The LoRA file is written once before training, and thrown away: a target the family's layout has no
    place for (Flux.2's kohya layout and the shared modulations, ...) is refused now, naming the key,
    not after the run."""
    if cfg.network.type != "lora" or cfg.network.dora:  # the other variants write their own files (variants.py)
        return
    if any(p.is_meta for m in modules.values() for p in m.parameters()):  # the memory planner's probe: no data
        return
    try:
        model.family.lora_file_state(model, adapter_state_dicts(modules), alpha_for_module(cfg),
                                     cfg.output.lora_format)
    except ValueError as e:
        message = str(e)
        raise ConfigError(message if message.startswith("network.") else f"output.lora_format: {message}") from None


def _add_adapter(module: torch.nn.Module, config, key: str) -> None:
    """peft's add_adapter; target names that match no module are refused naming the option."""
    try:
        module.add_adapter(config)
    except ValueError as e:
        if "target" not in str(e).lower():
            raise
        names = sorted({n.rsplit(".", 1)[-1] for n, m in module.named_modules()
                        if isinstance(m, (torch.nn.Linear, torch.nn.Conv2d))})
        raise ConfigError(f"{key}: {sorted(config.target_modules)} match no module of the "
                          f"{type(module).__name__}; its layer names include {', '.join(names[:12])}") from None


def adapter_state_dicts(modules: dict[str, torch.nn.Module]) -> dict[str, dict[str, torch.Tensor]]:
    """peft-format adapter weights per component (keys without the adapter name)."""
    return {name: {k: v.detach().float().cpu().contiguous() for k, v in get_peft_model_state_dict(m).items()}
            for name, m in modules.items()}
