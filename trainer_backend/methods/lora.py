"""LoRA adapters through peft: which modules get them, their parameter groups, their state."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from peft import LoraConfig
from peft.utils import get_peft_model_state_dict

from ..config import TrainConfig

TEXT_ENCODER_NAMES = ("text_encoder", "text_encoder_2")


@dataclass
class Trainable:
    """The modules that hold trainable parameters, keyed by pipeline component name."""
    modules: dict[str, torch.nn.Module]
    param_groups: list[dict] = field(default_factory=list)

    def parameters(self) -> list[torch.nn.Parameter]:
        return [p for g in self.param_groups for p in g["params"]]


def _adapter_config(cfg: TrainConfig, targets: list[str]) -> LoraConfig:
    return LoraConfig(r=cfg.network.rank, lora_alpha=cfg.network.alpha, lora_dropout=cfg.network.dropout,
                      init_lora_weights="gaussian", target_modules=targets)


def setup_lora(model, cfg: TrainConfig) -> Trainable:
    """Freeze the base model, add adapters to the UNet (and text encoders when asked),
    and return the adapter parameters in fp32 grouped by learning rate."""
    for module in (model.unet, model.vae, *model.text_encoders):
        module.requires_grad_(False)
    model.unet.add_adapter(_adapter_config(cfg, list(cfg.network.target_modules)))
    modules: dict[str, torch.nn.Module] = {"unet": model.unet}
    if cfg.network.train_text_encoder:
        for name, encoder in zip(TEXT_ENCODER_NAMES, model.text_encoders):
            encoder.add_adapter(_adapter_config(cfg, list(cfg.network.text_encoder_target_modules)))
            modules[name] = encoder
    groups = []
    te_lr = cfg.network.text_encoder_lr or cfg.optimizer.lr
    for name, module in modules.items():
        params = [p for p in module.parameters() if p.requires_grad]
        for p in params:  # master weights in fp32 even when the frozen base is half precision
            p.data = p.data.float()
        groups.append({"params": params, "lr": cfg.optimizer.lr if name == "unet" else te_lr, "name": name})
    return Trainable(modules=modules, param_groups=groups)


def adapter_state_dicts(modules: dict[str, torch.nn.Module]) -> dict[str, dict[str, torch.Tensor]]:
    """peft-format adapter weights per component (keys without the adapter name)."""
    return {name: {k: v.detach().float().cpu().contiguous() for k, v in get_peft_model_state_dict(m).items()}
            for name, m in modules.items()}
